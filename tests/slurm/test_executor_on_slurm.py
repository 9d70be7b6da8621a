"""The executor on ``site-configs/slurm-local.toml``: Dask workers in real Slurm jobs.

Real Slurm (the session's private cluster), real dask-jobqueue, real asyncflow
engine. Each test starts its own allocation; a worker job takes ~5 s to connect.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
from private_slurm import SlurmCluster, slurm_local_site  # type: ignore[import-not-found]

from acceptance import Rejected
from policies import BudgetExceeded
from tasks import AllocationExecutor, ExecutableTask, TaskResult, verifier
from tasks._slurm import query_job

pytestmark = pytest.mark.integration

DEMO = [sys.executable, "-m", "tasks.demo.objective"]

# A simulation that takes `seconds`, then appends "<index> <job id>" to a log of
# completions: a candidate simulated twice to completion would appear twice.
SIMULATION = textwrap.dedent(
    """
    import json, os, sys, time
    candidate = json.load(sys.stdin)
    time.sleep(float(sys.argv[2]))
    with open(sys.argv[1], "a", encoding="ascii") as log:
        log.write(f"{int(candidate[0])} {os.environ.get('SLURM_JOB_ID')}\\n")
    print(json.dumps({"value": candidate[0]}))
    """
)


def simulations(log: Path, count: int, seconds: float) -> list[ExecutableTask]:
    return [
        ExecutableTask(
            argv=[sys.executable, "-c", SIMULATION, str(log), str(seconds)],
            stdin=json.dumps([float(i)]).encode(),
        )
        for i in range(count)
    ]


def completions(log: Path) -> Counter[int]:
    if not log.exists():
        return Counter()
    return Counter(int(line.split()[0]) for line in log.read_text("ascii").splitlines())


async def dask_holds_nothing_to_run(executor: AllocationExecutor) -> None:
    """Return once the executor's Dask scheduler has no waiting, queued or running task."""
    client = executor._parts.backend._client  # the test reads Dask's own view
    deadline = time.monotonic() + 60.0
    while True:
        states = await client.run_on_scheduler(
            lambda dask_scheduler: sorted(
                ts.state
                for ts in dask_scheduler.tasks.values()
                if ts.state in ("waiting", "queued", "no-worker", "processing")
            )
        )
        if not states:
            return
        assert time.monotonic() < deadline, f"Dask still holds tasks: {states}"
        await asyncio.sleep(0.2)


async def run_until_done(
    executor: AllocationExecutor, tasks: list[ExecutableTask], *, allocations: int
) -> dict[int, TaskResult]:
    """Run ``tasks``, relaunching the interrupted ones in new allocations; return final results."""
    final: dict[int, TaskResult] = {}
    todo = list(range(len(tasks)))
    for attempt in range(allocations):
        results = await executor.run_batch([tasks[i] for i in todo], key_prefix=f"t/{attempt}")
        for index, result in zip(todo, results, strict=True):
            final[index] = result
        todo = [i for i in todo if final[i].status == "interrupted"]
        if not todo:
            break
        await executor.request_allocation()
    return final


@pytest.mark.asyncio
class TestTasksInSlurmJobs:
    async def test_simulation_and_verifier_tasks_carry_the_slurm_job_id(
        self, slurm: SlurmCluster, tmp_path: Path
    ) -> None:
        candidates = [[0.1, 0.2], [0.5, 0.5], [0.9, 0.3]]
        judged: list[TaskResult] = []

        def judge(proposal: list[list[float]], results: list[TaskResult]) -> str | None:
            judged.extend(results)
            return None

        async with AllocationExecutor.from_site(slurm_local_site(), work_dir=str(tmp_path)) as ex:
            check = verifier(
                ex,
                task_for=lambda proposal: [
                    ExecutableTask([*DEMO, "--fidelity", "low"], stdin=json.dumps(c).encode())
                    for c in proposal
                ],
                judge=judge,
            )
            await check(candidates)
            simulated = await ex.run_batch(
                [ExecutableTask([*DEMO], stdin=json.dumps(c).encode()) for c in candidates],
                key_prefix="demo/0/b",
            )
            jobs = [record.job_id for record in ex.allocations]
        assert len(jobs) == 1
        for result in [*judged, *simulated]:
            assert result.status == "done"
            assert result.job_id == jobs[0]
            assert result.host == slurm.host
        assert [r.value["fidelity"] for r in simulated] == ["high"] * 3

    async def test_a_verifier_rejection_still_comes_from_a_slurm_job(
        self, slurm: SlurmCluster, tmp_path: Path
    ) -> None:
        async with AllocationExecutor.from_site(slurm_local_site(), work_dir=str(tmp_path)) as ex:
            check = verifier(
                ex,
                task_for=lambda c: ExecutableTask([*DEMO], stdin=json.dumps(c).encode()),
                judge=lambda c, r: f"ran in job {r.job_id}",
            )
            with pytest.raises(Rejected, match=r"ran in job \d+"):
                await check([0.5, 0.5])

    async def test_the_allocation_is_recorded_and_released_at_the_end(
        self, slurm: SlurmCluster, tmp_path: Path
    ) -> None:
        async with AllocationExecutor.from_site(slurm_local_site(), work_dir=str(tmp_path)) as ex:
            await ex.run_batch([ExecutableTask(["true"])], key_prefix="r/0")
            await ex.refresh_allocations()
            (running,) = ex.allocations
            assert running.state == "RUNNING"
            assert running.started_at is not None
            assert running.ends_at == running.started_at + 600.0  # the site's walltime
            assert ex.allocation_end() == running.ends_at
        (released,) = ex.allocations
        assert released.end_reason == "released"
        assert released.ended_at is not None
        deadline = time.monotonic() + 20
        while (job := query_job(released.job_id)) is not None and not job.ended:
            assert time.monotonic() < deadline, job
            await asyncio.sleep(0.3)
        assert job is not None
        assert job.end_reason == "cancelled"  # what Slurm saw: the executor let it go
        assert list((tmp_path / "slurm-logs").glob(f"*-{released.job_id}.err"))


@pytest.mark.asyncio
class TestInterruptions:
    async def test_scancel_mid_batch_interrupts_exactly_the_unfinished_tasks(
        self, slurm: SlurmCluster, tmp_path: Path
    ) -> None:
        log = tmp_path / "completions.txt"
        tasks = simulations(log, 5, 2.0)
        cancelled: list[str] = []

        async with AllocationExecutor.from_site(slurm_local_site(), work_dir=str(tmp_path)) as ex:

            def cancel_after_the_first(result: TaskResult) -> None:
                if not cancelled:
                    cancelled.append(ex.allocations[-1].job_id)
                    slurm.run(["scancel", cancelled[0]])

            first = await ex.run_batch(tasks, key_prefix="c/0", on_result=cancel_after_the_first)
            statuses = Counter(r.status for r in first)
            assert statuses["done"] >= 1
            assert statuses["interrupted"] >= 1
            assert set(statuses) <= {"done", "interrupted"}
            for result in first:
                if result.status == "interrupted":
                    assert result.error_code == "allocation_ended"
                    # The job it had started in, or none: it was still queued (issue 43).
                    assert result.job_id in (cancelled[0], None)
                    assert "CANCELLED" in result.stderr_tail
            # One worker thread: at most one task was running in the job when it ended.
            cut = [r for r in first if r.status == "interrupted" and r.job_id is not None]
            assert len(cut) <= 1, first
            assert ex.allocations[0].end_reason == "cancelled"

            again = [i for i, r in enumerate(first) if r.status == "interrupted"]
            (second_job,) = await ex.request_allocation()
            second = await ex.run_batch([tasks[i] for i in again], key_prefix="c/1")
            # Were a copy of an interrupted task still queued in Dask, the new job's worker
            # would run it: wait until the scheduler holds no task that could still run.
            await dask_holds_nothing_to_run(ex)
        assert all(r.status == "done" and r.job_id == second_job.job_id for r in second)
        assert completions(log) == Counter(range(5))  # each candidate exactly once

    async def test_a_new_allocation_beyond_the_budget_is_refused(
        self, slurm: SlurmCluster, tmp_path: Path
    ) -> None:
        site = slurm_local_site(scheduler__max_allocations=1)
        async with AllocationExecutor.from_site(site, work_dir=str(tmp_path)) as ex:
            slurm.run(["scancel", ex.allocations[0].job_id])
            results = await ex.run_batch([ExecutableTask(["sleep", "30"])], key_prefix="b/0")
            assert results[0].status == "interrupted"
            with pytest.raises(BudgetExceeded, match="max_allocations"):
                await ex.request_allocation()

    async def test_a_job_waiting_for_cores_is_the_queue_line(
        self, slurm: SlurmCluster, tmp_path: Path
    ) -> None:
        blocker = slurm.run(
            ["sbatch", "--parsable", "-c", str(slurm.cpus), "-o", "/dev/null", "--wrap", "sleep 60"]
        ).stdout.strip()
        async with AllocationExecutor.from_site(slurm_local_site(), work_dir=str(tmp_path)) as ex:
            job = ex.allocations[0].job_id
            deadline = time.monotonic() + 20
            while "Resources" not in ex.queue_line() and time.monotonic() < deadline:
                await asyncio.sleep(0.3)
                await ex.refresh_allocations()
            assert ex.queue_line() == f"waiting in queue: job {job} PENDING (Resources)"
            slurm.run(["scancel", blocker])
            (result,) = await ex.run_batch([ExecutableTask(["true"])], key_prefix="q/0")
            assert ex.queue_line() == ""
        assert result.status == "done"
        assert result.job_id == job
        started = ex.allocations[0].started_at
        assert started is not None
        assert started >= ex.allocations[0].requested_at - 1.0  # queue wait is recorded


@pytest.mark.asyncio
class TestWalltime:
    @pytest.mark.timeout(300)
    async def test_a_one_minute_allocation_ends_mid_batch_and_its_tasks_come_back(
        self, slurm: SlurmCluster, tmp_path: Path
    ) -> None:
        """Slurm kills a 1-minute job at 60-90 s: the task it ran and those queued come back."""
        log = tmp_path / "completions.txt"
        site = slurm_local_site(scheduler__walltime="00:01:00", max_concurrency=2)
        # One worker thread runs them in turn: the first ends ~50 s into the job, the
        # second would end ~95 s in, after Slurm's kill (60-90 s).
        tasks = simulations(log, 3, 45.0)
        async with AllocationExecutor.from_site(site, work_dir=str(tmp_path)) as ex:
            results = await ex.run_batch(tasks, key_prefix="w/0")
            (record,) = ex.allocations
        statuses = [r.status for r in results]
        # The worker runs them in turn: some (on a quiet machine, the first) are done,
        # the rest interrupted. The third would end >= 135 s in, long after the kill.
        finished = statuses.count("done")
        assert finished < 3
        assert statuses == ["done"] * finished + ["interrupted"] * (3 - finished), statuses
        assert record.end_reason == "timeout"
        # Done tasks and the one running at the kill name the job; queued ones none.
        assert [r.job_id for r in results if r.status == "done"] == [record.job_id] * finished
        cut = [r.job_id for r in results if r.status == "interrupted"]
        assert set(cut) <= {record.job_id, None}
        assert cut.count(record.job_id) <= 1, results
        done = {i for i, r in enumerate(results) if r.status == "done"}
        assert set(completions(log)) == done

    @pytest.mark.long
    @pytest.mark.timeout(900)
    async def test_a_batch_that_needs_three_one_minute_allocations_completes_once_each(
        self, slurm: SlurmCluster, tmp_path: Path
    ) -> None:
        log = tmp_path / "completions.txt"
        site = slurm_local_site(scheduler__walltime="00:01:00", max_concurrency=2)
        # A job runs 60-90 s, ~6 s of it starting the worker: at most 2 of these finish
        # in one, so 6 need at least 3 allocations.
        tasks = simulations(log, 6, 30.0)
        async with AllocationExecutor.from_site(site, work_dir=str(tmp_path)) as ex:
            final = await run_until_done(ex, tasks, allocations=8)
            records = ex.allocations
        assert all(r.status == "done" for r in final.values())
        assert completions(log) == Counter(range(6))
        assert len(records) >= 3
        assert [r.end_reason for r in records[:-1]] == ["timeout"] * (len(records) - 1)
        assert len({r.job_id for r in final.values()}) >= 3


def test_nothing_is_written_to_home_or_the_current_directory(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """dask-jobqueue's config file, slurm-%j.out and Dask's files all stay out of ~ and cwd."""
    home, cwd, work = tmp_path / "home", tmp_path / "cwd", tmp_path / "campaign"
    for folder in (home, cwd, work):
        folder.mkdir()
    site_file = Path(__file__).parents[2] / "site-configs" / "slurm-local.toml"
    script = textwrap.dedent(
        f"""
        import asyncio
        from tasks import AllocationExecutor, ExecutableTask, load_site

        async def main():
            site = load_site({str(site_file)!r})
            async with AllocationExecutor.from_site(site, work_dir={str(work)!r}) as ex:
                (r,) = await ex.run_batch([ExecutableTask(["true"])], key_prefix="h/0")
                assert r.status == "done", r

        asyncio.run(main())
        """
    )
    env = {**slurm.env, "HOME": str(home)}
    env.pop("DASK_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in home.rglob("*")) == []
    assert sorted(p.name for p in cwd.rglob("*")) == []
    assert list((work / "slurm-logs").glob("*.err"))
