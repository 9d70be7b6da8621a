"""A node that half-dies mid-batch: ``slurmd`` SIGKILLed while its job's worker runs on.

Only slurmd dies: the job's processes (the Dask worker, the running simulation) live
on and the worker stays connected to the campaign's scheduler, but Slurm, hearing
nothing from the node for ``SlurmdTimeout``, sets it DOWN and ends the job
``NODE_FAIL`` (Slurm 22.05 here: ~25 s after the kill with ``SlurmdTimeout=5``).
The campaign must retire that job's workers before it relaunches the unfinished
tasks, so each task completes exactly once, counted by a log the simulation writes
outside the provenance. When slurmd comes back the node returns to service
(``ReturnToService=2``) and Slurm kills what was left of the failed job.

The test starts its own cluster (a short ``SlurmdTimeout``, and a dead slurmd must
not disturb the session's cluster); it takes ~60 s.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from private_slurm import (  # type: ignore[import-not-found]
    SlurmCluster,
    SlurmStartFailed,
    ensure_slurm_installed,
    slurm_local_site,
    start_cluster,
)
from test_executor_on_slurm import (  # type: ignore[import-not-found]
    completions,
    dask_holds_nothing_to_run,
    simulations,
)

from tasks import AllocationExecutor, TaskResult

pytestmark = pytest.mark.integration

#: Seconds without an answer from slurmd before the controller fails the node's jobs.
SLURMD_TIMEOUT = 5


@pytest.fixture(scope="module")
def fragile_slurm() -> Iterator[SlurmCluster]:
    """A private cluster of its own whose slurmd this module may kill."""
    failure = ensure_slurm_installed()
    if failure is not None:
        pytest.skip(f"SLURM TESTS SKIPPED: {failure}")
    # AF_UNIX paths (the munge socket) must stay short: not under pytest's tmp_path.
    root = Path(tempfile.mkdtemp(prefix="unattended-nodefail-"))
    try:
        cluster = start_cluster(root, slurmd_timeout=SLURMD_TIMEOUT)
    except SlurmStartFailed as exc:
        pytest.fail(f"the private Slurm did not start: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


async def relaunch_waits_for_a_worker(executor: AllocationExecutor) -> bool:
    """True when Dask holds tasks waiting for a worker and has no worker at all."""
    client = executor._parts.backend._client  # the test reads Dask's own view
    workers, waiting = await client.run_on_scheduler(
        lambda dask_scheduler: (
            len(dask_scheduler.workers),
            sum(ts.state in ("no-worker", "queued") for ts in dask_scheduler.tasks.values()),
        )
    )
    return workers == 0 and waiting > 0


@pytest.mark.asyncio
class TestNodeFailure:
    @pytest.mark.timeout(150)
    async def test_slurmd_killed_mid_batch_each_task_done_exactly_once(
        self, fragile_slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        slurm = fragile_slurm
        monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
        for key in [k for k in os.environ if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            monkeypatch.delenv(key)
        slurm.wait_idle()
        log = tmp_path / "completions.txt"
        # One worker thread runs them in turn, 40 s in all: the batch outlasts the
        # ~25 s Slurm takes to fail the node, so some tasks are still to run then.
        tasks = simulations(log, 8, 5.0)
        killed: list[str] = []

        async with AllocationExecutor.from_site(slurm_local_site(), work_dir=str(tmp_path)) as ex:
            failed_job = ex.allocations[0].job_id

            def kill_slurmd_after_the_first(result: TaskResult) -> None:
                if not killed:
                    slurm.kill_slurmd()
                    killed.append(failed_job)

            async def revive_slurmd() -> None:
                # The node comes back only once the relaunch waits with no worker to take
                # it: while slurmd is dead the failed job's worker lives on, and a relaunch
                # it took would finish first (the batch ends, and this is cancelled).
                try:
                    async with asyncio.timeout(180):
                        while True:
                            if len(ex.allocations) > 1 and await relaunch_waits_for_a_worker(ex):
                                return
                            await asyncio.sleep(0.2)
                finally:
                    if killed:
                        slurm.start_slurmd()

            reviver = asyncio.ensure_future(revive_slurmd())
            try:
                results = await ex.run_until_done(
                    tasks, key_prefix="nf/0", on_result=kill_slurmd_after_the_first
                )
                # A copy of a task still queued in Dask would run on the next worker.
                await dask_holds_nothing_to_run(ex)
            finally:
                reviver.cancel()
                await asyncio.gather(reviver, return_exceptions=True)
        records = ex.allocations

        assert killed == [failed_job]
        first = records[0]
        assert first.job_id == failed_job
        assert (first.state, first.end_reason) == ("NODE_FAIL", "node_fail"), records
        assert all(r.status == "done" for r in results), results
        # Exactly once each, by the simulations' own log (outside the provenance).
        assert completions(log) == Counter(range(len(tasks)))
        lines = log.read_text("ascii").splitlines()
        relaunched = [r for r in results if r.job_id != failed_job]
        assert relaunched, "nothing was left to relaunch: the batch ended before NODE_FAIL"
        # A relaunched task ran in a later job, and its log line says the same job.
        later = {r.job_id for r in records[1:]}
        for result in relaunched:
            assert result.job_id in later, (result, records)
            assert f"{result.index} {result.job_id}" in lines, (result, lines)
        assert all(r.end_reason is not None for r in records), records
