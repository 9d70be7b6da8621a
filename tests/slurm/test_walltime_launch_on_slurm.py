"""Walltime-aware launches on a real Slurm: a job near its end gets no work it cannot finish.

A 1-minute job of the session's private Slurm (dask-jobqueue workers). Work three
walltimes long is launched where the time left holds one of its tasks (it is split
over allocations), and once the job has less left than one task, the next
allocation is asked for first: the task runs, to completion, in the new job.
Before, ``ensure_time`` answered "launch here" for any work longer than the
walltime, whatever time was left, and a batch started after its job's planned end.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest
from private_slurm import SlurmCluster, slurm_local_site  # type: ignore[import-not-found]

from tasks import AllocationExecutor, ExecutableTask

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

TASK_SECONDS = 30.0  # the cost model's task: half the walltime
WORK_SECONDS = 180.0  # three walltimes: longer than any allocation


def _short_task() -> ExecutableTask:
    return ExecutableTask(argv=[sys.executable, "-c", "import os; print(os.getpid())"])


async def _until_left_below(executor: AllocationExecutor, seconds: float) -> float:
    deadline = time.monotonic() + 150.0
    while True:
        await executor.refresh_allocations()
        left = executor.seconds_left()
        if left is not None and left < seconds:
            return left
        assert time.monotonic() < deadline, f"the job never got below {seconds} s left"
        await asyncio.sleep(1.0)


# The launch rule is in the default run without Slurm (tests/tasks/test_walltime_launch.py),
# and a real walltime mid-batch too (test_executor_on_slurm.py::TestWalltime).
@pytest.mark.long
@pytest.mark.timeout(300)
async def test_a_job_near_its_end_gets_no_work_it_cannot_finish(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    site = slurm_local_site(scheduler__walltime="00:01:00")
    async with AllocationExecutor.from_site(site, work_dir=str(tmp_path)) as ex:
        first = ex.allocations[0].job_id
        # Fresh job: one task fits in what is left, so the long work starts here.
        (early,) = await ex.run_batch([_short_task()], key_prefix="w/0")
        assert early.job_id == first
        left = ex.seconds_left()
        assert left is not None
        assert left > TASK_SECONDS
        assert await ex.ensure_time(WORK_SECONDS, unit=TASK_SECONDS) is False

        # Near the end: not one task fits; the next job is asked for first.
        left = await _until_left_below(ex, TASK_SECONDS - 10.0)
        assert await ex.ensure_time(WORK_SECONDS, unit=TASK_SECONDS) is True
        (late,) = await ex.run_batch([_short_task()], key_prefix="w/1")
        jobs = [record.job_id for record in ex.allocations]
    assert late.status == "done"
    assert late.job_id == jobs[-1] != first
    print(f"walltime launch: {left:.0f} s left in job {first}: the work went to job {jobs[-1]}")
