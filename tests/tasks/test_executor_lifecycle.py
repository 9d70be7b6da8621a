"""AllocationExecutor: bounded retries of transient failures, one engine per process, signals."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from policies import SiteInvalid, TaskFailed
from tasks import AllocationExecutor, ExecutableTask, FunctionTask, SiteConfig


def local_site(**overrides: Any) -> SiteConfig:
    data: dict[str, Any] = {
        "name": "test-retries",
        "backend": {"kind": "local", "executor": "thread", "max_workers": 2},
        "cost": {"node_hours_per_simulation": 0.1},
        "retry_backoff": 0.0,
        "retries": 2,
        "transient_exit_codes": [75],
    }
    data.update(overrides)
    return SiteConfig.model_validate(data)


def flaky_script(counter: Path, *, failures: int, code: int) -> list[str]:
    """Return argv of a program that exits ``code`` its first ``failures`` runs, then succeeds."""
    program = textwrap.dedent(
        f"""
        import json, pathlib, sys
        counter = pathlib.Path({str(counter)!r})
        runs = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(runs))
        if runs <= {failures}:
            sys.exit({code})
        print(json.dumps({{"runs": runs}}))
        """
    )
    return [sys.executable, "-c", program]


class TestRetries:
    @pytest.mark.asyncio
    async def test_a_transient_exit_code_is_retried_and_each_retry_recorded(
        self, tmp_path: Path
    ) -> None:
        counter = tmp_path / "runs"
        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(
                ExecutableTask(flaky_script(counter, failures=2, code=75))
            )
        assert result.status == "done"
        assert result.value == {"runs": 3}
        assert result.attempts == 3
        assert [r.attempt for r in result.retries] == [1, 2]
        assert all(r.reason == "exit code 75" for r in result.retries)
        assert all(r.error_code == "task_failed" for r in result.retries)

    @pytest.mark.asyncio
    async def test_a_task_may_declare_its_own_transient_exit_codes(self, tmp_path: Path) -> None:
        counter = tmp_path / "runs"
        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(
                ExecutableTask(
                    flaky_script(counter, failures=1, code=11), transient_exit_codes=frozenset({11})
                )
            )
        assert result.status == "done"
        assert result.attempts == 2

    @pytest.mark.asyncio
    async def test_an_ordinary_exit_code_is_not_retried(self, tmp_path: Path) -> None:
        counter = tmp_path / "runs"
        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(
                ExecutableTask(flaky_script(counter, failures=1, code=3))
            )
        assert result.status == "failed"
        assert result.attempts == 1
        assert result.retries == ()
        assert counter.read_text() == "1"

    @pytest.mark.asyncio
    async def test_retries_stop_at_the_bound(self, tmp_path: Path) -> None:
        counter = tmp_path / "runs"
        async with AllocationExecutor.from_site(local_site(retries=1)) as executor:
            result = await executor.submit(
                ExecutableTask(flaky_script(counter, failures=9, code=75))
            )
        assert result.status == "failed"
        assert result.exit_code == 75
        assert result.attempts == 2
        assert counter.read_text() == "2"

    @pytest.mark.asyncio
    async def test_a_declared_transient_exception_is_retried(self) -> None:
        calls: list[int] = []

        def flaky() -> str:
            calls.append(1)
            if len(calls) == 1:
                raise ConnectionError("license server busy")
            return "ok"

        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(FunctionTask(flaky, transient=(ConnectionError,)))
        assert result.value == "ok"
        assert result.attempts == 2
        assert result.retries[0].reason == "ConnectionError"

    @pytest.mark.asyncio
    async def test_a_retryable_unattended_error_is_transient(self) -> None:
        calls: list[int] = []

        def flaky() -> int:
            calls.append(1)
            if len(calls) == 1:
                raise TaskFailed("scratch filesystem full", retryable=True)
            return 1

        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(FunctionTask(flaky))
        assert result.attempts == 2

    @pytest.mark.asyncio
    async def test_a_dead_pool_process_is_transient_and_the_pool_is_rebuilt(
        self, tmp_path: Path
    ) -> None:
        marker = tmp_path / "died-once"

        def die_once() -> str:
            import os

            if not marker.exists():
                marker.write_text("x")
                os._exit(1)  # the pool process vanishes, as under the OOM killer
            return "survived"

        site = local_site(backend={"kind": "local", "executor": "process", "max_workers": 2})
        async with AllocationExecutor.from_site(site) as executor:
            result = await executor.submit(FunctionTask(die_once))
            after = await executor.submit(FunctionTask(abs, (-4,)))
        assert result.status == "done"
        assert result.value == "survived"
        assert result.retries[0].reason == "BrokenProcessPool"
        assert after.value == 4

    @pytest.mark.asyncio
    async def test_an_undeclared_exception_is_not_retried(self) -> None:
        calls: list[int] = []

        def broken() -> None:
            calls.append(1)
            raise ConnectionError("not declared transient")

        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(FunctionTask(broken))
        assert result.status == "failed"
        assert len(calls) == 1

    @pytest.mark.asyncio
    async def test_a_timeout_is_not_retried(self, tmp_path: Path) -> None:
        counter = tmp_path / "runs"
        argv = ["sh", "-c", f"echo x >> {counter}; sleep 30"]
        async with AllocationExecutor.from_site(local_site(kill_grace=0.1)) as executor:
            result = await executor.submit(ExecutableTask(argv, timeout=0.3))
        assert result.status == "timeout"
        assert result.attempts == 1
        assert counter.read_text().count("x") == 1


class TestOneEnginePerProcess:
    @pytest.mark.asyncio
    async def test_a_second_live_executor_raises(self) -> None:
        async with AllocationExecutor.from_site(local_site()):
            with pytest.raises(RuntimeError, match="only one engine"):
                async with AllocationExecutor.from_site(local_site()):
                    pass  # pragma: no cover - never entered

    @pytest.mark.asyncio
    async def test_a_new_executor_may_start_after_the_first_stopped(self) -> None:
        async with AllocationExecutor.from_site(local_site()) as first:
            one = await first.submit(FunctionTask(abs, (-1,)))
        async with AllocationExecutor.from_site(local_site()) as second:
            two = await second.submit(FunctionTask(abs, (-2,)))
        assert (one.value, two.value) == (1, 2)

    def test_an_executor_runs_on_an_event_loop_outside_the_main_thread(self) -> None:
        values: list[Any] = []

        async def main() -> None:
            async with AllocationExecutor.from_site(local_site()) as executor:
                values.append((await executor.submit(FunctionTask(abs, (-6,)))).value)

        worker = threading.Thread(target=lambda: asyncio.run(main()))
        worker.start()
        worker.join(60)
        assert values == [6]

    @pytest.mark.asyncio
    async def test_submitting_outside_async_with_raises(self) -> None:
        executor = AllocationExecutor.from_site(local_site())
        with pytest.raises(RuntimeError, match="async with"):
            await executor.submit(FunctionTask(abs, (-1,)))


SIGNAL_PROGRAM = textwrap.dedent(
    """
    import asyncio, json, os, signal, time
    from tasks import AllocationExecutor, FunctionTask, SiteConfig

    seen = []
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append("term"))
    # Python's own SIGINT handler, whatever this process inherited: a shell starts a
    # background job with SIGINT ignored, and Python then leaves it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    site = SiteConfig.model_validate({
        "name": "signals", "backend": {"kind": "local", "executor": "thread"},
        "cost": {"node_hours_per_simulation": 1.0},
    })

    async def main():
        async with AllocationExecutor.from_site(site) as executor:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0.1)
            during = list(seen)
            result = await executor.submit(FunctionTask(abs, (-3,)))
        return during, result.value

    # No asyncio.run: it would install its own SIGINT handler for the test to see.
    loop = asyncio.new_event_loop()
    during, value = loop.run_until_complete(main())
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    print(json.dumps({"during": during, "after": seen, "interrupted": interrupted, "value": value}))
    """
)


class TestSignalHandlers:
    @pytest.mark.asyncio
    async def test_an_event_loop_handler_from_before_is_back_after_shutdown(self) -> None:
        loop = asyncio.get_running_loop()
        heard = loop.create_future()
        loop.add_signal_handler(signal.SIGHUP, lambda: heard.done() or heard.set_result("hup"))
        try:
            async with AllocationExecutor.from_site(local_site()) as executor:
                await executor.submit(FunctionTask(abs, (-1,)))
            os.kill(os.getpid(), signal.SIGHUP)
            assert await asyncio.wait_for(heard, 10) == "hup"
        finally:
            loop.remove_signal_handler(signal.SIGHUP)

    def test_handlers_from_before_the_engine_work_during_and_after_it(self) -> None:
        done = subprocess.run(
            [sys.executable, "-c", SIGNAL_PROGRAM],
            capture_output=True,
            text=True,
            timeout=100,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["value"] == 3
        assert report["during"] == ["term"]
        assert report["after"] == ["term", "term"]
        assert report["interrupted"] is True


def _installed(module: str) -> bool:
    # find_spec, not an import: radical.utils warns (an error here) when imported
    # after logging is configured.
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def other_site(backend: dict[str, Any]) -> SiteConfig:
    return SiteConfig.model_validate(
        {"name": "needs-extra", "backend": backend, "cost": {"node_hours_per_simulation": 1.0}}
    )


class TestBackendsThatCannotStart:
    @pytest.mark.skipif(_installed("radical.pilot"), reason="RADICAL-Pilot is installed here")
    @pytest.mark.asyncio
    async def test_radical_pilot_without_the_extra_names_the_extra(self) -> None:
        site = other_site(
            {
                "kind": "radical_pilot",
                "resource": "local.localhost",
                "cores": 2,
                "runtime_minutes": 5,
            }
        )
        with pytest.raises(SiteInvalid, match=r"unattended\[radical-pilot\]") as caught:
            async with AllocationExecutor.from_site(site):
                pass  # pragma: no cover - never entered
        assert caught.value.details["field"] == "backend.kind"

    @pytest.mark.asyncio
    async def test_jobqueue_without_dask_jobqueue_names_the_package(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # The test extra installs dask-jobqueue: hide it the way a missing package
        # looks to this process (None in sys.modules: find_spec says absent, import fails).
        monkeypatch.setitem(sys.modules, "dask_jobqueue", None)
        site = other_site(
            {"kind": "dask", "jobqueue": {"system": "slurm", "cores": 4, "memory": "8GB"}}
        )
        with pytest.raises(SiteInvalid, match="dask-jobqueue") as caught:
            async with AllocationExecutor.from_site(site):
                pass  # pragma: no cover - never entered
        assert caught.value.details["field"] == "backend.jobqueue"

    @pytest.mark.asyncio
    async def test_a_placeholder_scheduler_address_is_refused_before_connecting(self) -> None:
        site = other_site({"kind": "dask", "scheduler_address": "<SCHEDULER_ADDRESS>"})
        with pytest.raises(SiteInvalid, match="placeholder"):
            async with AllocationExecutor.from_site(site):
                pass  # pragma: no cover - never entered

    @pytest.mark.asyncio
    async def test_a_failed_start_leaves_the_process_free_for_another_executor(self) -> None:
        site = other_site({"kind": "dask", "scheduler_address": "<SCHEDULER_ADDRESS>"})
        with pytest.raises(SiteInvalid):
            async with AllocationExecutor.from_site(site):
                pass  # pragma: no cover - never entered
        async with AllocationExecutor.from_site(local_site()) as executor:
            assert (await executor.submit(FunctionTask(abs, (-5,)))).value == 5
