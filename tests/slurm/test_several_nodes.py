"""Allocations over several Slurm nodes, and one node dying among its peers.

The module starts its own private Slurm of three nodes ``n1``-``n3`` on this host,
one CPU each, each its own ``slurmd -N nX`` (``private_slurm.start_cluster(nodes=3)``),
with a short ``SlurmdTimeout`` so a node whose slurmd dies is failed in ~25 s.

The default test runs a Dask site whose allocation is three worker jobs, one per
node: a batch spreads over the three nodes (the node each task ran on is recorded),
then one node's ``slurmd`` is SIGKILLed mid-batch. Only slurmd dies: its job's
worker and the simulation it runs live on, until Slurm ends that job ``NODE_FAIL``
and the executor retires its worker. The tasks on the other two nodes finish where
they started and are kept; the one on the failed node runs again, once, on the
jobs still alive (the same allocation: Dask can); each completion is counted by a
log the simulations write, outside the provenance.
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
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from allocation_properties import (  # type: ignore[import-not-found]
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
from flows._provenance._readers import charged_node_hours
from tasks import AllocationExecutor, ExecutableTask
from tasks._allocations import AllocationWatch
from tasks._slurm import read_jobcomp

pytestmark = pytest.mark.integration

NODES = ("n1", "n2", "n3")
#: Seconds without an answer from a slurmd before the controller fails its node's jobs.
SLURMD_TIMEOUT = 5


@pytest.fixture(scope="module")
def three_nodes() -> Iterator[SlurmCluster]:
    """A private cluster of three one-CPU nodes whose slurmd this module may kill."""
    failure = ensure_slurm_installed()
    if failure is not None:
        pytest.skip(f"SLURM TESTS SKIPPED: {failure}")
    # AF_UNIX paths (the munge socket) must stay short: not under pytest's tmp_path.
    root = Path(tempfile.mkdtemp(prefix="unattended-nodes-"))
    try:
        cluster = start_cluster(root, cpus=1, nodes=len(NODES), slurmd_timeout=SLURMD_TIMEOUT)
    except SlurmStartFailed as exc:
        pytest.fail(f"the private 3-node Slurm did not start: {exc}")
    try:
        yield cluster
        cluster.cancel_all()
        cluster.wait_steps_ended()  # a failed job's slurmstepd, cleaned up by its slurmd
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def on_three_nodes(
    three_nodes: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SlurmCluster]:
    """The module's cluster, every node idle, as this process's Slurm (``SLURM_CONF``)."""
    monkeypatch.setenv("SLURM_CONF", str(three_nodes.conf))
    for key in [k for k in os.environ if k.startswith("SLURM_") and k != "SLURM_CONF"]:
        monkeypatch.delenv(key)
    three_nodes.cancel_all()
    three_nodes.wait_idle()
    yield three_nodes
    three_nodes.cancel_all()


async def until(check: Callable[[], bool | Awaitable[bool]]) -> None:
    """Return once ``check()`` is true, asking every 0.1 s (the caller bounds the wait)."""
    while True:
        answer = check()
        if not isinstance(answer, bool):
            answer = await answer
        if answer:
            return
        await asyncio.sleep(0.1)


# A simulation that says where it started ("<node> <job>" in "<gate>.started-<index>"),
# waits for the test's gate, then appends "<index> <node> <job>" to a log of
# completions. Held at the gate, the task on the node that fails is still running
# when the executor retires that node's worker: were it not killed, it would
# complete once the gate opens, and its relaunch again.
GATED_SIMULATION = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    candidate = json.load(sys.stdin)
    log, gate = sys.argv[1:3]
    index = int(candidate[0])
    where = f"{os.environ.get('SLURMD_NODENAME')} {os.environ.get('SLURM_JOB_ID')}"
    started = pathlib.Path(f"{gate}.started-{index}")
    pathlib.Path(f"{started}.tmp").write_text(where)
    pathlib.Path(f"{started}.tmp").rename(started)
    while not os.path.exists(gate):
        time.sleep(0.05)
    with open(log, "a", encoding="ascii") as out:
        out.write(f"{index} {where}\\n")
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


def started_where(gate: Path) -> dict[int, tuple[str, str]]:
    """Return ``{index: (node, job)}`` of every simulation that has started so far."""
    found = {}
    for path in gate.parent.glob(f"{gate.name}.started-*"):
        if path.suffix == ".tmp":
            continue
        node, job = path.read_text().split()
        found[int(path.name.rsplit("-", 1)[1])] = (node, job)
    return found


async def dask_workers(executor: AllocationExecutor) -> int:
    client = executor._parts.backend._client  # the test reads Dask's own view
    return int(await client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.workers)))


@pytest.mark.asyncio
class TestOneNodeOfThreeFails:
    @pytest.mark.timeout(240)
    @pytest.mark.parametrize(
        "death",
        [
            "slurmd",  # half-dead: the job's worker and simulation live on
            # The whole node (slurmd, the job's processes, its slurmstepd): Dask loses
            # the worker at once; the same outcome by another route.
            pytest.param("node", marks=pytest.mark.long),
        ],
    )
    async def test_one_node_dies_the_others_keep_their_tasks_each_done_once(
        self, on_three_nodes: SlurmCluster, tmp_path: Path, death: str
    ) -> None:
        slurm = on_three_nodes
        log, gate = tmp_path / "completions.txt", tmp_path / "gate"
        tasks = gated_simulations(log, gate, 6)
        site = slurm_local_site(backend__jobqueue__jobs=3, scheduler__poll_seconds=1.0)
        victim: list[tuple[int, str, str]] = []  # (index, node, job) of the killed task
        before_kill: dict[int, tuple[str, str]] = {}

        async with AllocationExecutor.from_site(site, work_dir=str(tmp_path)) as ex:
            jobs = [r.job_id for r in ex.allocations]

            async def fail_one_node() -> None:
                try:
                    async with asyncio.timeout(200):
                        # One task started on every node: the batch spans the three.
                        await until(
                            lambda: {n for n, _ in started_where(gate).values()} >= set(NODES)
                        )
                        before_kill.update(started_where(gate))
                        index, (node, job) = min(before_kill.items())
                        victim.append((index, node, job))
                        if death == "slurmd":
                            slurm.kill_slurmd(node)
                        else:
                            assert slurm.kill_node(node), f"no process of {node} found"
                        # Slurm fails that job; the executor retires its worker.
                        await until(
                            lambda: any(
                                r.job_id == job and r.end_reason is not None for r in ex.allocations
                            )
                        )
                        await until(two_workers_left)
                finally:
                    gate.touch()

            async def two_workers_left() -> bool:
                return await dask_workers(ex) == 2

            breaker = asyncio.ensure_future(fail_one_node())
            try:
                results = await ex.run_until_done(tasks, key_prefix="nodes/0")
                await dask_holds_nothing_to_run(ex)
            finally:
                breaker.cancel()
                await asyncio.gather(breaker, return_exceptions=True)
                if victim:
                    slurm.start_slurmd(victim[0][1])
        records = ex.allocations

        assert victim, "no task started on every node"
        lost_index, lost_node, lost_job = victim[0]
        # One allocation of three jobs, one per node; only the victim's ended NODE_FAIL.
        assert len(jobs) == 3, records
        assert [r.job_id for r in records] == jobs, records
        assert {r.request for r in records} == {1}, records
        failed = next(r for r in records if r.job_id == lost_job)
        assert failed.nodes == (lost_node,), failed
        logged = read_jobcomp(slurm.jobcomp, lost_job)  # Slurm's own record agrees
        assert logged is not None
        assert failed.state == logged.state, (failed, logged)
        if death == "slurmd":
            assert (failed.state, failed.end_reason) == ("NODE_FAIL", "node_fail"), records
        else:
            # Its worker gone, dask-jobqueue cancels the job after the lost-worker
            # timeout (15 s), before Slurm hears nothing for SlurmdTimeout (5 s here,
            # but ~25 s to fail the node): Slurm logs CANCELLED, as recorded.
            assert failed.end_reason in ("node_fail", "cancelled"), records
        assert {node for r in records for node in r.nodes} == set(NODES), records
        # Every task done exactly once, by the simulations' own log.
        assert all(r.status == "done" for r in results), results
        assert completions(log) == Counter(range(len(tasks)))
        lines = log.read_text("ascii").splitlines()
        assert not [line for line in lines if line.split()[2] == lost_job], lines
        # The tasks running on the other nodes at the kill finished where they started.
        for index, (node, job) in before_kill.items():
            if index != lost_index:
                assert (results[index].host, results[index].job_id) == (node, job), results
        # The lost one ran again, in the same allocation, on a node still alive.
        again = results[lost_index]
        assert again.job_id in set(jobs) - {lost_job}, again
        assert again.host in set(NODES) - {lost_node}, again
        for result in results:
            assert f"{result.index} {result.host} {result.job_id}" in lines, (result, lines)


@pytest.mark.long  # a 3-node job; the 3-node cluster is kept by the node-failure test above
@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_three_node_allocation_is_charged_for_its_three_nodes(
    on_three_nodes: SlurmCluster, tmp_path: Path
) -> None:
    """The budget counts nodes x hours: a job of ``-N 3`` is charged three times its hours."""
    slurm = on_three_nodes

    async def submit() -> list[str]:
        done = slurm.run(
            ["sbatch", "--parsable", "-N", "3", "-t", "5", "--no-requeue",
             "-o", str(tmp_path / "job.out"), "--wrap", "sleep 300"]
        )  # fmt: skip
        return [done.stdout.strip().split(";")[0]]

    watch = AllocationWatch(submit, env=slurm.env, poll_seconds=0.5, max_node_hours=100.0)
    await watch.request()
    try:
        async with asyncio.timeout(60):
            while watch.current[0].started_at is None:
                await asyncio.sleep(0.2)
                await watch.refresh()
        (record,) = watch.current
        assert record.node_count == 3, record
        assert record.nodes == NODES, record
        assert record.started_at is not None
        # This run's watch: nodes x hours between the start and now.
        before = time.time()
        used = watch.node_hours()
        after = time.time()
        assert 3 * (before - record.started_at) / 3600 <= used, (used, record)
        assert used <= 3 * (after - record.started_at) / 3600, (used, record)
        # The provenance's reading of the same row, as later runs' budget sees it.
        start = datetime.fromtimestamp(record.started_at, UTC)
        row = {
            "started_at": start.isoformat(),
            "ended_at": None,
            "ends_at": datetime.fromtimestamp(record.started_at + 3600, UTC).isoformat(),
            "node_count": record.node_count,
        }
        at = datetime.fromtimestamp(record.started_at + 1800, UTC)
        assert charged_node_hours(row, at) == pytest.approx(1.5)  # 3 nodes x 0.5 h
        one_node = {**row, "node_count": 1}
        assert charged_node_hours(row, at) == pytest.approx(3 * charged_node_hours(one_node, at))
    finally:
        slurm.cancel_all()


# The campaign's simulation (``test_campaign_on_slurm.SIMULATION``) behind a line
# "<round> <index> <node> <job>" in a log of starts, written when it starts.
STARTS_FIRST = textwrap.dedent(
    """
    import os, runpy, sys
    starts = sys.argv.pop(1)
    if sys.argv[2] != "{round}":  # not the verifier
        with open(starts, "a", encoding="ascii") as out:
            node, job = os.environ.get("SLURMD_NODENAME"), os.environ.get("SLURM_JOB_ID")
            out.write(f"{sys.argv[2]} {sys.argv[3]} {node} {job}\\n")
    sys.argv.pop(0)
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


@pytest.mark.long  # ~2 min and a Prefect server; the executor test above keeps the capability
@pytest.mark.timeout(600)
def test_a_campaign_on_three_nodes_loses_one_and_counts_each_candidate_once(
    prefect_server: ServerHandle, on_three_nodes: SlurmCluster, tmp_path: Path
) -> None:
    """``unattended run`` on ``site-configs/slurm-multinode.toml``: one node's slurmd dies."""
    slurm = on_three_nodes
    name = "three-nodes"
    # Three 40 s simulations start together, one a node; one node's slurmd is killed
    # then, and Slurm fails its job ~25 s later, while its simulation still runs.
    spec, log = campaign(tmp_path, name, rounds=1, batch_size=3, seconds=40.0)
    starts = tmp_path / "starts.txt"
    wrapper = tmp_path / "starts_first.py"
    wrapper.write_text(STARTS_FIRST, encoding="utf-8")
    text = spec.read_text()
    simulation = str(tmp_path / "simulation.py")
    assert f'"{simulation}"' in text
    spec.write_text(text.replace(f'"{simulation}"', f'"{wrapper}", "{starts}", "{simulation}"'))
    env = cli_env(prefect_server, slurm, tmp_path)
    site = ROOT / "site-configs" / "slurm-multinode.toml"
    database = database_of(tmp_path, name)
    victim: str | None = None
    with (tmp_path / "run.out").open("w") as out:
        run = subprocess.Popen(
            [sys.executable, "-m", "flows._cli", "run", str(spec), "--site", str(site)],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def started() -> dict[str, str]:  # node -> job of each simulation started so far
        if not starts.exists():
            return {}
        return {line.split()[2]: line.split()[3] for line in starts.read_text().splitlines()}

    try:
        where = wait_for(lambda: len(started()) == len(NODES) and started(), timeout=300)
        victim = sorted(where)[0]
        failed_job = where[victim]
        slurm.kill_slurmd(victim)
        # The node comes back once the campaign has recorded its job's end.
        wait_for(
            lambda: (
                run.poll() is not None
                or rows(
                    database, f"SELECT end_reason FROM allocation WHERE job_id = '{failed_job}'"
                )
                == [("node_fail",)]
            ),
            240,
        )
        slurm.start_slurmd(victim)
        victim = None
        code = run.wait(timeout=300)
    finally:
        if victim is not None:
            slurm.start_slurmd(victim)
        if run.poll() is None:
            run.kill()
        unattended(env, "serve", "--stop", cwd=tmp_path, timeout=60)
    output = (tmp_path / "run.out").read_text()
    assert code == 0, output[-3000:]
    # One allocation of three jobs; the failed one recorded as Slurm logged it.
    allocations = rows(database, "SELECT job_id, request, end_reason FROM allocation")
    assert len(allocations) == len(NODES), allocations
    assert {request for _, request, _ in allocations} == {1}, allocations
    assert {job: reason for job, _, reason in allocations}[failed_job] == "node_fail"
    assert_end_reasons_as_slurm_says(database, slurm.jobcomp)
    # Each candidate done once (the provenance and the log), none in the failed job.
    assert_every_candidate_once(database, log, rounds=1, batch_size=3)
    assert failed_job not in {line.split()[2] for line in log.read_text().splitlines()}
    done = rows(database, "SELECT host, job_id FROM task_result WHERE status = 'done'")
    assert failed_job not in {job for _, job in done}, done
    assert {host for host, _ in done} <= set(NODES) - {victim_node(where, failed_job)}, done
    # inspect --round 0 counts the batch's tasks per node, as recorded.
    shown = unattended(env, "inspect", name, "--round", "0", cwd=tmp_path, timeout=60)
    assert shown.returncode == 0, shown.stderr
    spread = Counter(host for host, _ in done)
    line = next(line for line in shown.stdout.splitlines() if line.startswith("Nodes:"))
    for host, count in spread.items():
        assert f"{host} {count} done" in line, (line, spread)


def victim_node(where: dict[str, str], job: str) -> str:
    return next(node for node, started_in in where.items() if started_in == job)


def test_inspect_counts_a_batch_per_node_and_status() -> None:
    """``inspect --round N`` prints a ``Nodes:`` line under each batch's results."""
    from flows._cli._render import _node_spread

    results = [
        {"host": "n2", "status": "done"},
        {"host": "n1", "status": "done"},
        {"host": "n1", "status": "interrupted"},
        {"host": "n1", "status": "done"},
        {"host": None, "status": "failed"},  # never reached a node
    ]
    assert _node_spread(results) == "n1 2 done, 1 interrupted; n2 1 done"
    assert _node_spread([{"host": None, "status": "failed"}]) == ""


# RADICAL-Pilot: one pilot over the three nodes. Run by the overlay Python (the
# pilot's extra is not in the test extra); the test process kills and revives the
# node, watching the files the tasks write.
PILOT_SCRIPT = """
import asyncio, json, sys
from tasks import AllocationExecutor, ExecutableTask, load_site

SITE, WORK, GATED, LOG, GATE = sys.argv[1:6]

def task(code, *args):
    return ExecutableTask([sys.executable, "-c", code, *args])

SPREAD = "import time; time.sleep(3)"  # three at once: one a node

async def main():
    site = load_site(SITE)
    async with AllocationExecutor.from_site(site, work_dir=WORK) as ex:
        spread = await ex.run_batch([task(SPREAD) for _ in range(3)], key_prefix="rp/spread")
        gated = [task(GATED, LOG, GATE, str(i)) for i in range(3)]
        results = await ex.run_until_done(gated, key_prefix="rp/gated")
    print(json.dumps({
        "spread": [r.model_dump(mode="json") for r in spread],
        "results": [r.model_dump(mode="json") for r in results],
        "allocations": [r.__dict__ for r in ex.allocations],
    }))

asyncio.run(main())
"""

# A pilot task that says where it started, waits for the gate, then logs its completion.
PILOT_GATED = (
    "import os, pathlib, sys, time; log, gate, index = sys.argv[1:4]; "
    "where = os.environ.get('SLURMD_NODENAME', '') + ' ' + os.environ.get('SLURM_JOB_ID', ''); "
    "pathlib.Path(gate + '.started-' + index + '-' + where.replace(' ', '-')).touch(); "
    "exec('while not os.path.exists(gate): time.sleep(0.1)'); "
    "open(log, 'a').write(index + ' ' + where + chr(10))"
)


@pytest.mark.long  # ~4 min: two pilots of 40-80 s each; the Dask node failure runs by default
@pytest.mark.timeout(1500)
def test_one_pilot_over_three_nodes_loses_a_node_and_its_tasks_run_once_in_the_next(
    radical_python: Path, on_three_nodes: SlurmCluster, tmp_path: Path
) -> None:
    """``site-configs/slurm-radical-multinode.toml`` as shipped: tasks spread, one node dies.

    Slurm fails the whole pilot job when one of its nodes fails (``NODE_FAIL``): its
    tasks come back interrupted and run, once, in the next pilot.
    """
    slurm = on_three_nodes
    site = ROOT / "site-configs" / "slurm-radical-multinode.toml"
    log, gate = tmp_path / "completions.txt", tmp_path / "gate"
    home = tmp_path / "home"
    home.mkdir()
    env = {**slurm.env, "HOME": str(home)}
    argv = [str(radical_python), "-c", PILOT_SCRIPT, str(site), str(tmp_path / "work")]
    argv += [PILOT_GATED, str(log), str(gate)]

    def started() -> list[tuple[str, str, str]]:  # (index, node, job) of each start
        found = []
        for path in tmp_path.glob("gate.started-*"):
            index, node, job = path.name.removeprefix("gate.started-").split("-")
            found.append((index, node, job))
        return found

    victim: str | None = None
    with (tmp_path / "pilot.err").open("w") as err:
        run = subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=err, text=True
        )
    try:
        first = wait_for(lambda: len(started()) == len(NODES) and started(), timeout=600)
        assert {node for _, node, _ in first} == set(NODES), first
        (failed_job,) = {job for _, _, job in first}
        victim = "n2"
        slurm.kill_slurmd(victim)

        def node_failed() -> bool:
            logged = read_jobcomp(slurm.jobcomp, failed_job)
            return logged is not None and logged.state == "NODE_FAIL"

        wait_for(node_failed, timeout=180)
        slurm.start_slurmd(victim)
        victim = None
        # The gate opens once the three run again, in the next pilot.
        wait_for(lambda: sum(job != failed_job for *_, job in started()) == len(NODES), 600)
        gate.touch()
        stdout, _ = run.communicate(timeout=600)
    finally:
        gate.touch()
        if victim is not None:
            slurm.start_slurmd(victim)
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, (tmp_path / "pilot.err").read_text()[-3000:]
    report = json.loads(stdout.strip().splitlines()[-1])
    # The batch spread over the pilot's three nodes, each result naming its node.
    assert {r["host"] for r in report["spread"]} == set(NODES), report["spread"]
    assert {r["job_id"] for r in report["spread"]} == {failed_job}
    jobs = {r["job_id"]: r for r in report["allocations"]}
    assert next(iter(jobs)) == failed_job
    assert jobs[failed_job]["node_count"] == len(NODES), jobs
    assert jobs[failed_job]["end_reason"] == "node_fail", jobs
    # Each gated task done once, by the tasks' own log, in the next pilot.
    assert all(r["status"] == "done" for r in report["results"]), report["results"]
    lines = log.read_text().splitlines()
    assert Counter(line.split()[0] for line in lines) == Counter(["0", "1", "2"]), lines
    assert all(line.split()[2] != failed_job for line in lines), lines
    assert {r["job_id"] for r in report["results"]} <= set(jobs) - {failed_job}
