"""AllocationExecutor on Dask: a real two-worker LocalCluster on 127.0.0.1, shared by processes."""

from __future__ import annotations

import asyncio
import json
import operator
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasks import AllocationExecutor, ExecutableTask, FunctionTask, SiteConfig

distributed = pytest.importorskip("distributed")
dask = pytest.importorskip("dask")

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def scheduler_address() -> Iterator[str]:
    """Start one LocalCluster for the module and stop it at the end."""
    # With no allowed failures a dead worker reaches the client as KilledWorker at
    # once, instead of after Dask's own three silent reschedules.
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        cluster = distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            host="127.0.0.1",
            # None would bind the scheduler's HTTP server to 8787 and warn if taken.
            dashboard_address="127.0.0.1:0",
            processes=True,
        )
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


def dask_site(address: str, **overrides: Any) -> SiteConfig:
    data: dict[str, Any] = {
        "name": "test-dask",
        "backend": {"kind": "dask", "scheduler_address": address},
        "cost": {"node_hours_per_simulation": 0.1},
        "retry_backoff": 0.0,
        "kill_grace": 0.5,
        "max_concurrency": 16,
    }
    data.update(overrides)
    return SiteConfig.model_validate(data)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class TestDaskExecutor:
    @pytest.mark.asyncio
    async def test_function_tasks_run_on_the_workers_in_input_order(
        self, scheduler_address: str
    ) -> None:
        async with AllocationExecutor.from_site(dask_site(scheduler_address)) as executor:
            results = await executor.run_batch(
                [FunctionTask(operator.mul, (i, i)) for i in range(40)], key_prefix="c/0/d"
            )
        assert [r.value for r in results] == [i * i for i in range(40)]
        assert all(r.status == "done" and r.host for r in results)

    @pytest.mark.asyncio
    async def test_closures_travel_to_the_workers(self, scheduler_address: str) -> None:
        scale = 3

        async with AllocationExecutor.from_site(dask_site(scheduler_address)) as executor:
            result = await executor.submit(FunctionTask(lambda x: x * scale, (5,)))
        assert result.value == 15

    @pytest.mark.asyncio
    async def test_a_raising_task_is_a_failure_record(self, scheduler_address: str) -> None:
        async with AllocationExecutor.from_site(dask_site(scheduler_address)) as executor:
            result = await executor.submit(FunctionTask(operator.truediv, (1, 0)))
        assert result.status == "failed"
        assert "ZeroDivisionError" in result.stderr_tail

    @pytest.mark.asyncio
    async def test_a_function_past_its_timeout_is_a_timeout_record(
        self, scheduler_address: str
    ) -> None:
        async with AllocationExecutor.from_site(dask_site(scheduler_address)) as executor:
            result = await executor.submit(FunctionTask(time.sleep, (2.0,), timeout=0.2))
        assert result.status == "timeout"
        assert result.error_code == "deadline_exceeded"

    @pytest.mark.asyncio
    async def test_executables_run_on_a_worker_with_stdin(self, scheduler_address: str) -> None:
        script = "import json, sys; print(json.dumps(sorted(json.load(sys.stdin))))"
        async with AllocationExecutor.from_site(dask_site(scheduler_address)) as executor:
            result = await executor.submit(
                ExecutableTask([sys.executable, "-c", script], stdin=b"[3, 1, 2]")
            )
        assert result.status == "done"
        assert result.value == [1, 2, 3]
        assert result.exit_code == 0

    @pytest.mark.asyncio
    async def test_a_timeout_on_a_worker_kills_the_whole_process_group(
        self, scheduler_address: str, tmp_path: Path
    ) -> None:
        pidfile = tmp_path / "grandchild.pid"
        script = f"sleep 300 & echo $! > {pidfile}; wait"
        async with AllocationExecutor.from_site(dask_site(scheduler_address)) as executor:
            result = await executor.submit(ExecutableTask(["sh", "-c", script], timeout=1.0))
        assert result.status == "timeout"
        grandchild = int(pidfile.read_text())
        deadline = time.monotonic() + 10
        # Polling /proc: a process that is not our child offers no event to wait on.
        while alive(grandchild) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        assert not alive(grandchild)

    @pytest.mark.asyncio
    async def test_a_transient_exit_code_is_retried_under_a_new_dask_key(
        self, scheduler_address: str, tmp_path: Path
    ) -> None:
        counter = tmp_path / "runs"
        script = (
            f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; [ $n -ge 1 ]"
        )
        site = dask_site(scheduler_address, transient_exit_codes=[1], retries=2)
        async with AllocationExecutor.from_site(site) as executor:
            result = await executor.submit(ExecutableTask(["sh", "-c", script]))
        assert result.status == "done"
        assert result.attempts == 2
        assert counter.read_text().strip() == "2"

    @pytest.mark.asyncio
    async def test_a_lost_worker_is_transient_and_retried(
        self, scheduler_address: str, tmp_path: Path
    ) -> None:
        marker = tmp_path / "died-once"

        def die_once() -> str:
            import os
            import signal

            if not marker.exists():
                marker.write_text("x")
                os.kill(os.getpid(), signal.SIGKILL)  # takes the whole worker down
            return "survived"

        site = dask_site(scheduler_address, retries=1)
        async with AllocationExecutor.from_site(site) as executor:
            result = await executor.submit(FunctionTask(die_once))
        assert result.status == "done"
        assert result.value == "survived"
        assert result.attempts == 2
        assert result.retries[0].reason == "KilledWorker"


SHARED_SCHEDULER_PROGRAM = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from tasks import AllocationExecutor, FunctionTask, SiteConfig
    site = SiteConfig.model_validate({
        "name": "other-process",
        "backend": {"kind": "dask", "scheduler_address": sys.argv[1]},
        "cost": {"node_hours_per_simulation": 1.0}, "max_concurrency": 16,
    })
    async def main():
        async with AllocationExecutor.from_site(site) as executor:
            print("ready", flush=True)
            results = await executor.run_batch(
                [FunctionTask(lambda i: (time.sleep(0.02), i + 1_000_000)[1], (i,))
                 for i in range(150)],
                key_prefix="camp/0/same",
            )
        return [r.value for r in results]
    print(json.dumps(asyncio.run(main())))
    """
)


class TestSharedScheduler:
    @pytest.mark.asyncio
    async def test_two_processes_on_one_scheduler_get_their_own_results(
        self, scheduler_address: str
    ) -> None:
        other = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            SHARED_SCHEDULER_PROGRAM,
            scheduler_address,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert other.stdout is not None
            # Start together, so both batches are on the scheduler at the same time.
            ready = await asyncio.wait_for(other.stdout.readline(), 60)
            assert ready.strip() == b"ready"
            async with AllocationExecutor.from_site(dask_site(scheduler_address)) as executor:
                # Same key prefix, indices and engine task numbers as the other process.
                mine = await executor.run_batch(
                    [FunctionTask(lambda i: (time.sleep(0.02), i)[1], (i,)) for i in range(150)],
                    key_prefix="camp/0/same",
                )
            stdout, stderr = await asyncio.wait_for(other.communicate(), 100)
        finally:
            if other.returncode is None:
                other.kill()
                await other.wait()
        assert other.returncode == 0, stderr.decode()[-2000:]
        theirs = json.loads(stdout.decode().strip().splitlines()[-1])
        assert [r.value for r in mine] == list(range(150))
        assert theirs == [i + 1_000_000 for i in range(150)]
