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
not disturb the session's cluster); it takes ~50 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from allocation_properties import (  # type: ignore[import-not-found]
    assert_allocations_follow_one_another,
    assert_end_reasons_as_slurm_says,
)
from private_slurm import (  # type: ignore[import-not-found]
    SlurmCluster,
    SlurmStartFailed,
    ensure_slurm_installed,
    slurm_local_site,
    start_cluster,
)
from test_campaign_on_slurm import (  # type: ignore[import-not-found]
    ROOT,
    assert_every_candidate_once,
    campaign,
    cli_env,
    database_of,
    rows,
    unattended,
    wait_for,
)
from test_executor_on_slurm import (  # type: ignore[import-not-found]
    completions,
    dask_holds_nothing_to_run,
)

from flows._prefect._server import ServerHandle
from tasks import AllocationExecutor, ExecutableTask
from tasks._slurm import read_jobcomp

pytestmark = pytest.mark.integration

#: Seconds without an answer from slurmd before the controller fails the node's jobs.
SLURMD_TIMEOUT = 5
ALLOCATIONS = "SELECT job_id FROM allocation"
INTERRUPTED = "SELECT DISTINCT job_id FROM task_result WHERE status = 'interrupted'"
DONE_IN = "SELECT job_id FROM task_result WHERE status = 'done'"


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
        cluster.cancel_all()
        cluster.wait_steps_ended()  # the failed job's slurmstepd, cleaned up by slurmd
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


async def until(check: Callable[[], bool | Awaitable[bool]]) -> None:
    """Return once ``check()`` is true, asking every 0.1 s (the caller bounds the wait)."""
    while True:
        answer = check()
        if not isinstance(answer, bool):
            answer = await answer
        if answer:
            return
        await asyncio.sleep(0.1)


# A simulation that waits for the test's gate, then appends "<index> <job id>" to a
# log of completions. Held at the gate, the task a worker runs when its node fails
# is still running when the campaign relaunches it: were it not killed, it would
# complete once the gate opens, and its relaunch again.
GATED_SIMULATION = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    candidate = json.load(sys.stdin)
    log, gate = sys.argv[1:3]
    index = int(candidate[0])
    pathlib.Path(f"{gate}.started-{index}").touch()
    while not os.path.exists(gate):
        time.sleep(0.05)
    with open(log, "a", encoding="ascii") as out:
        out.write(f"{index} {os.environ.get('SLURM_JOB_ID')}\\n")
    print(json.dumps({"value": candidate[0]}))
    """
)


def gated_simulations(log: Path, gate: Path, count: int) -> list[ExecutableTask]:
    return [
        ExecutableTask(
            argv=[sys.executable, "-c", GATED_SIMULATION, str(log), str(gate)],
            stdin=json.dumps([float(i)]).encode(),
        )
        for i in range(count)
    ]


@pytest.mark.asyncio
class TestNodeFailure:
    @pytest.mark.long  # ~35 s; test_several_nodes.py kills one node's slurmd of three by default
    @pytest.mark.timeout(180)
    async def test_slurmd_killed_mid_batch_each_task_done_exactly_once(
        self, fragile_slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        slurm = fragile_slurm
        monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
        for key in [k for k in os.environ if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            monkeypatch.delenv(key)
        slurm.wait_idle()
        log, gate = tmp_path / "completions.txt", tmp_path / "gate"
        tasks = gated_simulations(log, gate, 4)
        killed: list[str] = []

        async with AllocationExecutor.from_site(slurm_local_site(), work_dir=str(tmp_path)) as ex:
            failed_job = ex.allocations[0].job_id

            async def fail_the_node_then_revive_it() -> None:
                try:
                    async with asyncio.timeout(150):
                        # A task runs (held at the gate): kill slurmd under it.
                        await until(lambda: any(tmp_path.glob("gate.started-*")))
                        slurm.kill_slurmd()
                        killed.append(failed_job)
                        # Slurm fails the job, the executor sees it and asks for the next.
                        await until(lambda: len(ex.allocations) > 1)
                        gate.touch()
                        # The node comes back only once the relaunch waits with no worker
                        # to take it: the failed job's worker lives on meanwhile, and a
                        # relaunch it took would finish (the batch ends, this is cancelled).
                        await until(lambda: relaunch_waits_for_a_worker(ex))
                finally:
                    gate.touch()
                    if killed:
                        slurm.start_slurmd()

            breaker = asyncio.ensure_future(fail_the_node_then_revive_it())
            try:
                results = await ex.run_until_done(tasks, key_prefix="nf/0")
                # A copy of a task still queued in Dask would run on the next worker.
                await dask_holds_nothing_to_run(ex)
            finally:
                breaker.cancel()
                await asyncio.gather(breaker, return_exceptions=True)
        records = ex.allocations

        assert killed == [failed_job]
        first = records[0]
        assert first.job_id == failed_job
        assert (first.state, first.end_reason) == ("NODE_FAIL", "node_fail"), records
        logged = read_jobcomp(slurm.jobcomp, failed_job)  # Slurm's own record agrees
        assert logged is not None
        assert logged.state == "NODE_FAIL", logged
        assert all(r.status == "done" for r in results), results
        # Exactly once each, by the simulations' own log (outside the provenance),
        # and in the job the result names: a later one, none in the failed job.
        assert completions(log) == Counter(range(len(tasks)))
        later = {r.job_id for r in records[1:]}
        lines = log.read_text("ascii").splitlines()
        for result in results:
            assert result.job_id in later, (result, records)
            assert f"{result.index} {result.job_id}" in lines, (result, lines)
        assert all(r.end_reason is not None for r in records), records


@pytest.mark.long  # ~90 s and a Prefect server; the executor test above runs by default
@pytest.mark.timeout(600)
def test_slurmd_killed_mid_batch_the_campaign_counts_each_candidate_once(
    prefect_server: ServerHandle, fragile_slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Through ``unattended run``: the provenance and the execution log agree, once each."""
    slurm = fragile_slurm
    slurm.wait_idle()
    name = "slurm-node-fail"
    # One worker thread, 3 x 15 s: the kill comes after the first, NODE_FAIL ~25 s
    # later, while the last is still to finish.
    spec, log = campaign(tmp_path, name, rounds=1, batch_size=3, seconds=15.0)
    env = cli_env(prefect_server, slurm, tmp_path)
    site = ROOT / "site-configs" / "slurm-local.toml"
    database = database_of(tmp_path, name)
    killed = False
    with (tmp_path / "run.out").open("w") as out:
        run = subprocess.Popen(
            [sys.executable, "-m", "flows._cli", "run", str(spec), "--site", str(site)],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: log.exists() and log.read_text().strip(), timeout=300)
        (job,) = rows(database, "SELECT job_id FROM allocation WHERE end_reason IS NULL")
        slurm.kill_slurmd()
        killed = True
        # The node comes back once the campaign has asked for the next job.
        wait_for(lambda: run.poll() is not None or len(rows(database, ALLOCATIONS)) > 1, 240)
        slurm.start_slurmd()
        killed = False
        code = run.wait(timeout=300)
    finally:
        if killed:
            slurm.start_slurmd()
        if run.poll() is None:
            run.kill()
        unattended(env, "serve", "--stop", cwd=tmp_path, timeout=60)
    output = (tmp_path / "run.out").read_text()
    assert code == 0, output[-3000:]
    windows = assert_allocations_follow_one_another(database, between=("node_fail",))
    assert windows[0].job_id == job[0]
    assert windows[0].end_reason == "node_fail"
    assert_end_reasons_as_slurm_says(database, slurm.jobcomp)
    interrupted = {j for (j,) in rows(database, INTERRUPTED)}
    assert interrupted == {job[0]}
    # One done result per candidate in the provenance, one completion in the log.
    assert_every_candidate_once(database, log, rounds=1, batch_size=3)
    # ... and each done result names the job its completion was logged in.
    logged_in = Counter(line.split()[2] for line in log.read_text().splitlines())
    assert Counter(j for (j,) in rows(database, DONE_IN)) == logged_in
    later = {w.job_id for w in windows[1:]}
    relaunched = rows(database, "SELECT t.job_id FROM task_result t JOIN batch b "
                      "ON b.id = t.batch_id WHERE b.relaunch > 0")  # fmt: skip
    assert relaunched
    assert {j for (j,) in relaunched} <= later
