"""A login node that dies mid-batch runs no simulation twice and loses none (issue 43).

With dask-jobqueue the scheduler lives in the campaign's flow-run process on the
login node: when it dies, its workers lose it at once and the simulations they were
running finish with nobody to hear them. Each task on the allocation therefore
leaves a started marker and its result in the campaign's ``task-results`` folder
(``tasks/_task_ledger.py``), written by a wrapper in the task's own session, and
the continuation harvests them before it launches anything.

Here a login node runs its own server and runner (``unattended up``, private
state directory and port), the campaign is submitted, and once the first
simulation has completed the server and the whole runner tree (or the runner
tree alone) are SIGKILLed, as a reboot would. ``unattended up`` brings them back;
the runner continues the campaign to its end. Executions are counted by the
simulations' own log: each candidate completed exactly once.

The same on the RADICAL-Pilot site (``--long``): the pilot's tasks run under the same
supervisor (``tasks/_dispatch_pilot.py``), and the login node runs RADICAL-Pilot's
overlay Python (``radical_python``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from private_slurm import SlurmCluster  # type: ignore[import-not-found]
from test_budget_on_slurm import _campaign_status as campaign_status  # type: ignore[import-not-found]
from test_campaign_on_slurm import (  # type: ignore[import-not-found]
    assert_every_candidate_once,
    campaign,
    database_of,
    rows,
    site_file,
    wait_for,
)
from test_radical_pilot import radical_site  # type: ignore[import-not-found]

from flows._prefect._server import load_server_config, running_server
from tasks._slurm import query_jobs
from tasks._task_ledger import jobs_with_open_tasks, started_markers

pytestmark = [pytest.mark.integration]

ROUNDS, BATCH, SECONDS = 1, 4, 6.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LoginNode:
    """A shell on a login node with its own state directory, server port and Slurm."""

    def __init__(self, tmp_path: Path, slurm: SlurmCluster, python: Path | None = None) -> None:
        self.tmp_path = tmp_path
        #: The login node's Python: this one, or RADICAL-Pilot's overlay (``radical_python``).
        self.python = str(python or sys.executable)
        self.home = tmp_path / "home"
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("UNATTENDED_", "PREFECT_", "SLURM_")) and k != "DO_NOT_TRACK"
        }
        self.env |= slurm.env | {
            "UNATTENDED_HOME": str(self.home),
            "UNATTENDED_SERVER_HOST": "127.0.0.1",
            "UNATTENDED_SERVER_PORT": str(_free_port()),
            "PREFECT_LOCAL_STORAGE_PATH": str(tmp_path / "prefect-results"),
            # A dead run's lease expires in seconds, and the runner looks often.
            "UNATTENDED_LEASE_TTL_SECONDS": "6",
            "UNATTENDED_HEARTBEAT_SECONDS": "1",
            "UNATTENDED_WATCHDOG_SECONDS": "0.5",
        }

    def cli(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.python, "-m", "flows._cli", *args],
            cwd=self.tmp_path,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def pids(self, *, server: bool) -> list[int]:
        found = []
        with contextlib.suppress(OSError, ValueError):
            found.append(int((self.home / "runner.lock").read_text().strip()))
        if server:
            handle = running_server(load_server_config(self.env))
            if handle is not None:
                found.append(handle.pid)
        return found

    def kill(self, *, server: bool) -> None:
        """SIGKILL the runner's tree (and the server's): no clean stop, as in a reboot."""
        family = []
        for pid in self.pids(server=server):
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(pid)
                family += [root, *root.children(recursive=True)]
        for process in family:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(family, timeout=30)


@pytest.fixture
def login(slurm: SlurmCluster, tmp_path: Path) -> Iterator[LoginNode]:
    node = LoginNode(tmp_path, slurm)
    try:
        yield node
    finally:
        node.kill(server=True)


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("death", "later"),
    [
        # `up` at once: the wave the dead run left on the allocation still runs (waited for).
        ("everything", False),
        # `up` once that wave has ended (as cron, a minute later): its results are harvested.
        ("everything", True),
        ("runner", False),
        # The allocation dies too: its job cancelled, the running wrappers killed (as a
        # cgroup would at the job's end). That work is lost: run again, once, and said so.
        ("allocation", False),
    ],
    ids=["everything-at-once", "everything-later", "runner-at-once", "allocation-too"],
)
def test_a_login_node_killed_mid_batch_runs_each_simulation_once(
    login: LoginNode, slurm: SlurmCluster, tmp_path: Path, death: str, later: bool
) -> None:
    name = f"login-death-{death}-{int(later)}"
    spec, log = campaign(tmp_path, name, rounds=ROUNDS, batch_size=BATCH, seconds=SECONDS)
    site = site_file(tmp_path, poll_seconds=1.0)
    up = login.cli("up")
    assert up.returncode == 0, up.stdout + up.stderr
    submitted = login.cli("submit", str(spec), "--site", str(site))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    # Mid-batch: one simulation has completed, the next runs on the allocation.
    wait_for(lambda: log.exists() and log.read_text().strip(), timeout=400)
    login.kill(server=death != "runner")
    seen_at_kill = log.read_text().splitlines()
    ledger = database_of(tmp_path, name).parent / "task-results"
    lost: set[str] = set()
    if death == "allocation":
        for digest, marker in started_markers(ledger).items():
            if (
                str(marker["key"]).startswith(f"{name}/")
                and not (ledger / f"{digest}.result").exists()
            ):
                lost.add(str(marker["key"]))
                with contextlib.suppress(psutil.Error):  # the wrapper and its simulation
                    os.killpg(int(marker["pid"]), signal.SIGKILL)
                slurm.run(["scancel", str(marker["job_id"])], check=False)
    if later:  # every task the dead run started has left its result
        wait_for(lambda: not jobs_with_open_tasks(ledger), timeout=120)
    back = login.cli("up")
    assert back.returncode == 0, back.stdout + back.stderr
    database = database_of(tmp_path, name)
    wait_for(lambda: campaign_status(database) == ("completed", None), timeout=600)

    # Each candidate completed once by its own log; the provenance has one done result each.
    assert_every_candidate_once(database, log, rounds=ROUNDS, batch_size=BATCH)
    results = sorted(ledger.glob("*.result"))
    assert len(results) >= BATCH
    # What ran on the dead run's job is recorded with that job, and its node.
    completed_jobs = {line.split()[2] for line in log.read_text().splitlines()}
    recorded = rows(database, "SELECT job_id, host, status FROM task_result WHERE status = 'done'")
    assert {job for job, _, _ in recorded} == completed_jobs
    assert all(host == slurm.host for _, host, _ in recorded)
    first_job = seen_at_kill[0].split()[2]
    assert first_job in {job for job, _, _ in recorded}
    # Harvested results came from the dead run (another token than the last run's fence).
    # Lost work ran again once, and its result says what was lost, where.
    retried = [
        json.loads(text)
        for (text,) in rows(database, "SELECT retries FROM task_result WHERE status = 'done'")
        if text and json.loads(text)
    ]
    lost_records = [r for rs in retried for r in rs if r["reason"].startswith("lost:")]
    assert len(lost_records) == len(lost), (lost, retried)
    if death == "allocation":
        assert lost, "no task was running when the allocation died"
    fence = (ledger / "fence").read_text()
    tokens = {json.loads(p.read_text())["token"] for p in results}
    assert len(tokens) >= 2, (tokens, fence)
    assert fence in tokens, (tokens, fence)


def _settled(ledger: Path, env: dict[str, str]) -> bool:
    """True when every task the dead run started has its result, or its job has ended."""
    open_jobs = sorted(jobs_with_open_tasks(ledger))
    if not open_jobs:
        return True
    states = query_jobs(open_jobs, env=env)
    return all(state is None or state.ended for state in states.values())


@pytest.mark.long
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("later", [False, True], ids=["up-at-once", "up-later"])
def test_a_login_node_killed_mid_batch_runs_each_simulation_once_on_a_pilot(
    radical_python: Path, slurm: SlurmCluster, tmp_path: Path, later: bool
) -> None:
    """The same on the RADICAL-Pilot site: the pilot's tasks report to the ledger too.

    The pilot's agent outlives its client (the flow-run process) for a while: the
    wave it runs, and the tasks queued in it, finish and leave their results; tasks
    the agent kills when it gives its client up leave a marker and no result, and
    the continuation runs them again once, recording the loss. ``up`` at once: the
    new run fences the folder, so a task of the dead run the agent starts after that
    refuses to start. ``up`` later: once every task the dead run started has its
    result or its pilot job has ended.
    """
    login = LoginNode(tmp_path, slurm, python=radical_python)
    name = f"login-death-pilot-{int(later)}"
    spec, log = campaign(tmp_path, name, rounds=ROUNDS, batch_size=BATCH, seconds=SECONDS)
    site = radical_site(tmp_path, poll_seconds=1.0)
    try:
        up = login.cli("up")
        assert up.returncode == 0, up.stdout + up.stderr
        submitted = login.cli("submit", str(spec), "--site", str(site))
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        # Mid-batch: one simulation has completed on the pilot, the others run or wait.
        wait_for(lambda: log.exists() and log.read_text().strip(), timeout=900)
        login.kill(server=True)
        killed_at = time.monotonic()
        seen_at_kill = log.read_text().splitlines()
        ledger = database_of(tmp_path, name).parent / "task-results"
        if later:
            wait_for(lambda: _settled(ledger, login.env), timeout=900)
        print(f"up {time.monotonic() - killed_at:.0f} s after the kill")
        back = login.cli("up")
        assert back.returncode == 0, back.stdout + back.stderr
        database = database_of(tmp_path, name)
        wait_for(lambda: campaign_status(database) == ("completed", None), timeout=1200)
    finally:
        login.kill(server=True)

    # Each candidate completed once by its own log, and is recorded with the job it ran in.
    assert_every_candidate_once(database, log, rounds=ROUNDS, batch_size=BATCH)
    ran_in = {tuple(line.split()[:2]): line.split()[2] for line in log.read_text().splitlines()}
    recorded = rows(
        database,
        "SELECT b.round_index, t.task_index, t.job_id, t.host, t.retries FROM task_result t "
        "JOIN batch b ON b.id = t.batch_id WHERE t.status = 'done'",
    )
    assert {(str(r), str(i)): job for r, i, job, _, _ in recorded} == ran_in
    assert all(host == slurm.host for _, _, _, host, _ in recorded)
    first_job = seen_at_kill[0].split()[2]
    # Work the dead run's pilot lost (killed with its agent) ran again once, and its
    # record names the dead run's job; the ledger holds every task's result.
    lost = [
        r
        for *_, text in recorded
        if text
        for r in json.loads(text)
        if r["reason"].startswith("lost:")
    ]
    assert all(f"job {first_job} " in r["reason"] for r in lost), lost
    print(f"lost and run again: {len(lost)}; by the dead run's pilot: {seen_at_kill}")
    assert len(list(ledger.glob("*.result"))) >= BATCH
    for path in sorted(ledger.glob("*.result")):  # what each run's pilot task left
        left = json.loads(path.read_text())
        print(left["key"], left["token"], left["job_id"], left["kind"], left.get("exit_code"))
