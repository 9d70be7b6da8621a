"""AllocationExecutor on the local backend: real process and thread pools, real processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tasks import AllocationExecutor, ExecutableTask, FunctionTask, SiteConfig, TaskResult


def local_site(**overrides: Any) -> SiteConfig:
    backend = {"kind": "local", "executor": "thread", "max_workers": 4}
    backend.update(overrides.pop("backend", {}))
    data: dict[str, Any] = {
        "name": "test-local",
        "backend": backend,
        "cost": {"node_hours_per_simulation": 0.1},
        "retry_backoff": 0.0,
        "kill_grace": 0.5,
    }
    data.update(overrides)
    return SiteConfig.model_validate(data)


def square(x: int) -> int:
    return x * x


def alive(pid: int) -> bool:
    """Return True while ``pid`` exists and is not a zombie waiting for a reaper."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def gone_soon(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


class TestFunctionTasks:
    @pytest.mark.asyncio
    async def test_results_come_back_in_input_order(self) -> None:
        async with AllocationExecutor.from_site(local_site(max_concurrency=8)) as executor:
            results = await executor.run_batch(
                [FunctionTask(square, (i,)) for i in range(200)], key_prefix="c/0/b"
            )
        assert [r.value for r in results] == [i * i for i in range(200)]
        assert [r.index for r in results] == list(range(200))
        assert all(r.status == "done" and r.attempts == 1 for r in results)

    @pytest.mark.asyncio
    async def test_every_key_is_unique_and_starts_with_prefix_and_index(self) -> None:
        async with AllocationExecutor.from_site(local_site()) as executor:
            results = await executor.run_batch(
                [FunctionTask(square, (i,)) for i in range(50)], key_prefix="camp/3/abc"
            )
        assert len({r.key for r in results}) == 50
        assert all(r.key.startswith(f"camp/3/abc/{r.index}-") for r in results)

    @pytest.mark.asyncio
    async def test_a_process_pool_runs_closures(self) -> None:
        offset = 7
        site = local_site(backend={"executor": "process", "max_workers": 2})
        async with AllocationExecutor.from_site(site) as executor:
            results = await executor.run_batch(
                [FunctionTask(lambda x: (x + offset, os.getpid()), (i,)) for i in range(20)],
                key_prefix="c/0/p",
            )
        assert [r.value[0] for r in results] == [i + offset for i in range(20)]
        assert os.getpid() not in {r.value[1] for r in results}

    @pytest.mark.asyncio
    async def test_async_functions_are_run_to_completion(self) -> None:
        async def doubled(x: int) -> int:
            await asyncio.sleep(0)
            return 2 * x

        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(FunctionTask(doubled, (21,)))
        assert result.value == 42

    @pytest.mark.asyncio
    async def test_on_result_sees_every_result_once(self) -> None:
        seen: list[int] = []

        async def progress(result: TaskResult) -> None:
            seen.append(result.index)

        async with AllocationExecutor.from_site(local_site(max_concurrency=3)) as executor:
            await executor.run_batch(
                [FunctionTask(square, (i,)) for i in range(30)],
                key_prefix="c/0/b",
                on_result=progress,
            )
        assert sorted(seen) == list(range(30))

    @pytest.mark.asyncio
    async def test_a_raising_function_is_a_failure_record_not_an_exception(self) -> None:
        def broken() -> None:
            raise ValueError("the mesh is inverted")

        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(FunctionTask(broken))
        assert result.status == "failed"
        assert result.error_code == "task_failed"
        assert "ValueError: the mesh is inverted" in result.stderr_tail
        assert result.attempts == 1

    @pytest.mark.asyncio
    async def test_a_value_that_is_not_json_is_a_failure_record(self) -> None:
        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(FunctionTask(object))
        assert result.status == "failed"
        assert "not JSON-serialisable" in result.stderr_tail

    @pytest.mark.asyncio
    async def test_numpy_values_become_json_lists(self) -> None:
        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(FunctionTask(np.arange, (3,)))
        assert result.value == [0, 1, 2]
        assert json.loads(result.model_dump_json())["value"] == [0, 1, 2]

    @pytest.mark.asyncio
    async def test_a_function_past_its_timeout_is_a_timeout_record(self) -> None:
        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(FunctionTask(time.sleep, (1.0,), timeout=0.05))
        assert result.status == "timeout"
        assert result.error_code == "deadline_exceeded"

    @pytest.mark.asyncio
    async def test_engine_dispatch_runs_tasks_through_the_asyncflow_engine(self) -> None:
        site = local_site(backend={"dispatch": "engine"})
        async with AllocationExecutor.from_site(site) as executor:
            assert executor._parts is not None
            engine = executor._parts.engine
            results = await executor.run_batch(
                [FunctionTask(square, (i,)) for i in range(20)], key_prefix="c/0/e"
            )
            registered = len(engine.components)
        assert [r.value for r in results] == [i * i for i in range(20)]
        assert registered == 20

    @pytest.mark.asyncio
    async def test_engine_dispatch_turns_a_timeout_into_a_timeout_record(self) -> None:
        site = local_site(backend={"dispatch": "engine"})
        async with AllocationExecutor.from_site(site) as executor:
            result = await executor.submit(FunctionTask(time.sleep, (1.0,), timeout=0.05))
        assert result.status == "timeout"
        assert result.error_code == "deadline_exceeded"


class TestExecutableTasks:
    @pytest.mark.asyncio
    async def test_stdin_goes_in_and_json_stdout_becomes_the_value(self) -> None:
        script = "import json, sys; x = json.load(sys.stdin); print(json.dumps({'sum': sum(x)}))"
        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(
                ExecutableTask([sys.executable, "-c", script], stdin=b"[1.5, 2.5]")
            )
        assert result.status == "done"
        assert result.value == {"sum": 4.0}
        assert result.exit_code == 0

    @pytest.mark.asyncio
    async def test_a_program_that_cannot_start_is_a_failure_record(self) -> None:
        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(ExecutableTask(["/no/such/solver", "--fast"]))
        assert result.status == "failed"
        assert result.error_code == "task_failed"
        assert "cannot start '/no/such/solver'" in result.stderr_tail

    @pytest.mark.asyncio
    async def test_stdout_that_is_not_json_is_a_bad_output_failure_keeping_stdout(self) -> None:
        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(ExecutableTask(["echo", "hello"]))
        assert (result.status, result.error_code, result.attempts) == ("failed", "bad_output", 1)
        assert result.value is None
        assert "stdout is not JSON" in result.stderr_tail
        assert "\nhello\n" in result.stderr_tail

    @pytest.mark.asyncio
    async def test_nan_is_not_json_either(self) -> None:
        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(ExecutableTask(["echo", '{"value": NaN}']))
        assert (result.status, result.error_code) == ("failed", "bad_output")

    @pytest.mark.asyncio
    async def test_empty_stdout_is_done_with_no_value(self) -> None:
        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(ExecutableTask(["true"]))
        assert (result.status, result.value) == ("done", None)

    @pytest.mark.asyncio
    async def test_a_nonzero_exit_is_a_failure_record_with_the_stderr_tail(self) -> None:
        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(
                ExecutableTask(["sh", "-c", "echo 'solver diverged' >&2; exit 3"])
            )
        assert result.status == "failed"
        assert result.exit_code == 3
        assert result.stderr_tail.strip() == "solver diverged"
        assert result.error_code == "task_failed"

    @pytest.mark.asyncio
    async def test_env_and_cwd_are_those_of_the_task(self, tmp_path: Path) -> None:
        script = "import json, os; print(json.dumps([os.getcwd(), os.environ['FLAVOUR']]))"
        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(
                ExecutableTask(
                    [sys.executable, "-c", script],
                    env={"FLAVOUR": "mint", "PATH": os.environ.get("PATH", "")},
                    cwd=str(tmp_path),
                )
            )
        assert result.value == [str(tmp_path), "mint"]

    @pytest.mark.asyncio
    async def test_a_timeout_kills_the_whole_process_group(self, tmp_path: Path) -> None:
        pidfile = tmp_path / "grandchild.pid"
        # The child starts a grandchild `sleep` and waits: killing the child alone
        # would leave the grandchild running (and holding the output pipe).
        script = f"sleep 300 & echo $! > {pidfile}; wait"
        async with AllocationExecutor.from_site(local_site()) as executor:
            result = await executor.submit(ExecutableTask(["sh", "-c", script], timeout=1.0))
        grandchild = int(pidfile.read_text())
        assert result.status == "timeout"
        assert result.error_code == "deadline_exceeded"
        assert gone_soon(grandchild)

    @pytest.mark.asyncio
    async def test_a_grandchild_that_ignores_sigterm_is_killed_after_the_grace(
        self, tmp_path: Path
    ) -> None:
        pidfile = tmp_path / "stubborn.pid"
        script = f"sh -c 'trap \"\" TERM; sleep 300' & echo $! > {pidfile}; wait"
        async with AllocationExecutor.from_site(local_site(kill_grace=0.2)) as executor:
            result = await executor.submit(ExecutableTask(["sh", "-c", script], timeout=0.5))
        assert result.status == "timeout"
        assert gone_soon(int(pidfile.read_text()))

    @pytest.mark.asyncio
    async def test_cancelling_a_batch_kills_its_running_executables(self, tmp_path: Path) -> None:
        pidfile = tmp_path / "running.pid"
        script = f"sleep 300 & echo $! > {pidfile}; wait"
        async with AllocationExecutor.from_site(local_site()) as executor:
            batch = asyncio.ensure_future(
                executor.run_batch([ExecutableTask(["sh", "-c", script])], key_prefix="c/0/x")
            )
            # Polling a file the child writes: there is no event to wait on.
            while not pidfile.exists() or not pidfile.read_text().strip():  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            batch.cancel()
            with pytest.raises(asyncio.CancelledError):
                await batch
        assert gone_soon(int(pidfile.read_text()))


class TestRetryGivesItsSlotBack:
    @pytest.mark.asyncio
    async def test_the_next_task_runs_while_a_failed_one_waits_for_its_retry(
        self, tmp_path: Path
    ) -> None:
        """One slot: the first task fails (transient) and waits; the second runs meanwhile.

        The evidence is the first task's own second attempt: it reports whether the
        second task's file exists. Held through the backoff, the slot would keep the
        second task from starting until the first one finished.
        """
        first_try, second_ran = tmp_path / "first-try", tmp_path / "second-ran"
        flaky = textwrap.dedent(
            f"""
            import json, os, sys
            if not os.path.exists({str(first_try)!r}):
                open({str(first_try)!r}, "w").close()
                sys.exit(75)
            print(json.dumps({{"second_ran_meanwhile": os.path.exists({str(second_ran)!r})}}))
            """
        )
        site = local_site(
            max_concurrency=1, retries=1, retry_backoff=2.0, transient_exit_codes=[75]
        )
        async with AllocationExecutor.from_site(site) as executor:
            first, second = await executor.run_batch(
                [
                    ExecutableTask([sys.executable, "-c", flaky]),
                    ExecutableTask(["sh", "-c", f"touch {second_ran} && echo 1"]),
                ],
                key_prefix="c/0/slots",
            )
        assert (second.status, second.value) == ("done", 1)
        assert (first.status, first.attempts) == ("done", 2)
        assert first.value == {"second_ran_meanwhile": True}


class TestOpenFilesLimit:
    def test_hundreds_of_executables_finish_under_a_low_open_files_limit(self) -> None:
        program = textwrap.dedent(
            """
            import asyncio, json, resource
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
            from tasks import AllocationExecutor, ExecutableTask, SiteConfig
            site = SiteConfig.model_validate({
                "name": "fd", "max_concurrency": 1000, "retries": 0,
                "backend": {"kind": "local", "executor": "thread", "max_workers": 2},
                "cost": {"node_hours_per_simulation": 1.0},
            })
            async def main():
                async with AllocationExecutor.from_site(site) as executor:
                    results = await executor.run_batch(
                        [ExecutableTask(["/bin/true"]) for _ in range(400)], key_prefix="fd"
                    )
                    return executor.executable_concurrency, [r.status for r in results]
            slots, statuses = asyncio.run(main())
            print(json.dumps({"slots": slots, "statuses": statuses}))
            """
        )
        done = subprocess.run(
            [sys.executable, "-c", program],
            capture_output=True,
            text=True,
            timeout=110,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["statuses"] == ["done"] * 400
        assert 1 <= report["slots"] < 256 // 8
