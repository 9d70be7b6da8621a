"""Crashed and stopped runners come back by themselves; approvals cannot be routed around.

Everything goes through the real command line (``unattended submit|serve|approve``)
against the session's real Prefect server. A failpoint armed with
``UNATTENDED_FAILPOINT_SCOPE=runner`` SIGKILLs the whole runner tree (runner first,
then the flow-run process) at a named point of the campaign. In every case the
only action afterwards is ``unattended serve --detach`` (where the runner is gone)
and the campaign completes with the provenance of an uncrashed run (attempts,
decisions, batches, task results), no model answer asked twice and no finished
batch run again. The time from the runner's return to the campaign running again
is printed (``-s``) as ``recovery: ...``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import psutil
import pytest

from flows._cli._service import LISTENING_LINE
from flows._prefect._rest import approve, request

PROJECT = Path(__file__).resolve().parents[3]
Campaign = Any  # tests/reliability/crash/conftest.py's Campaign (conftest is not importable)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]

WAIT = 150.0
# Short waits for the tests: the defaults are 60 s, 10 s and 2 s.
FAST = {
    "UNATTENDED_LEASE_TTL_SECONDS": "6",
    "UNATTENDED_HEARTBEAT_SECONDS": "1",
    "UNATTENDED_WATCHDOG_SECONDS": "0.5",
    "UNATTENDED_STORAGE_RETRIES": "3",
    "UNATTENDED_STORAGE_BACKOFF_SECONDS": "0.2",
}
SLOW_SIMULATION = """\
import os, runpy, sys, time
time.sleep(float(os.environ.get("SIM_SLEEP", "0")))
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _call(method: str, path: str, body: Any = None) -> Any:
    """Ask the session's Prefect API as the commands do: its auth, retried while it is busy.

    Under load the SQLite-backed server answers 503 ("database is locked"); Prefect's
    own client asks again, and so does ``flows._prefect._rest.Api``.
    """
    return request(os.environ, method, path, body)


class LoginNode:
    """The user's shell: the real CLI, with the campaign's state directory."""

    def __init__(self, campaign: Campaign) -> None:
        self.campaign = campaign
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("UNATTENDED_")}
        self.env |= {"UNATTENDED_HOME": str(campaign.home), **FAST}

    def cli(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flows._cli", *args],
            cwd=PROJECT,
            env=self.env | extra,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def submit(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.cli("submit", str(self.campaign.spec), *extra)

    def serve(self, query_seconds: float = 0.5, **extra: str) -> float:
        """Start ``unattended serve --detach``; return when it returned (monotonic)."""
        done = self.cli("serve", "--detach", "--query-seconds", str(query_seconds), **extra)
        assert done.returncode == 0, done.stderr
        return time.monotonic()

    def runner_alive(self) -> bool:
        lock = self.campaign.home / "runner.lock"
        if not lock.exists():
            return False
        with lock.open() as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
        return False

    def wait_runner_gone(self) -> None:
        wait_until(lambda: not self.runner_alive(), "the runner to die")

    def kill_runner_tree(self) -> None:
        pid = int((self.campaign.home / "runner.lock").read_text())
        root = psutil.Process(pid)
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                process.kill()
        self.wait_runner_gone()

    def stop(self) -> None:
        self.cli("serve", "--stop")

    def runs(self) -> list[dict[str, Any]]:
        body = {
            "flow_runs": {"tags": {"all_": [f"campaign:{self.campaign.name}"]}},
            "sort": "EXPECTED_START_TIME_DESC",
        }
        return list(_call("POST", "flow_runs/filter", body))

    def state_of(self, run_id: str) -> str:
        return str(_call("GET", f"flow_runs/{run_id}")["state"]["type"])


def wait_until(condition: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def rows(database: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as c:
            return [tuple(r) for r in c.execute(sql, args)]
    except sqlite3.OperationalError:
        return []


def status(campaign: Campaign) -> str | None:
    found = rows(campaign.database, "SELECT status FROM campaign")
    return found[0][0] if found else None


def batch_launched(campaign: Campaign, round_index: int) -> bool:
    return bool(rows(campaign.database, "SELECT 1 FROM batch WHERE round_index = ?", round_index))


def events(campaign: Campaign) -> list[str]:
    return [k for (k,) in rows(campaign.database, "SELECT kind FROM campaign_event ORDER BY id")]


def running_again(node: LoginNode, crashed: set[str]) -> bool:
    """A run other than the crashed ones is running (or the campaign already finished)."""
    return any(
        run["id"] not in crashed and run["state"]["type"] in {"RUNNING", "COMPLETED", "PAUSED"}
        for run in node.runs()
    )


def completes(node: LoginNode, campaign: Campaign) -> None:
    def done() -> bool:
        finished = any(run["state"]["type"] == "COMPLETED" for run in node.runs())
        return status(campaign) == "completed" and finished

    wait_until(done, "the campaign to complete")


def recover_and_complete(node: LoginNode, campaign: Campaign, label: str) -> float:
    """Start the runner again; return seconds until the campaign runs again; wait for the end."""
    crashed = {run["id"] for run in node.runs()}
    back = node.serve()
    wait_until(lambda: running_again(node, crashed), "the campaign to run again")
    seconds = time.monotonic() - back
    print(f"recovery: {label}: running again {seconds:.1f} s after 'serve --detach'")
    completes(node, campaign)
    return seconds


def assert_like_reference(
    campaign: Campaign, reference: Any, server: Any, *, rerun: Counter[int] | None = None
) -> None:
    record, inferences, executions = reference
    got = campaign.record()
    assert got.status == "completed"
    assert got.attempts == record.attempts
    assert got.decisions == record.decisions
    assert got.gate_calls == record.gate_calls
    assert got.batches == record.batches
    assert got.task_results == record.task_results
    assert server.requests == inferences  # no model answer asked twice
    assert campaign.executions() == executions + (rerun or Counter())


@pytest.fixture
def node(
    prefect_server: Any, make_campaign: Callable[..., Campaign], request: pytest.FixtureRequest
) -> Iterator[Callable[..., LoginNode]]:
    nodes: list[LoginNode] = []

    def make(name: str, **options: str) -> LoginNode:
        login = LoginNode(make_campaign(name, **options))
        nodes.append(login)
        return login

    yield make
    for login in nodes:
        if login.runner_alive():
            login.stop()


def slow(campaign: Campaign, seconds: float) -> dict[str, str]:
    """Make each simulation take ``seconds`` (a wrapper in front of the logging one)."""
    wrapper = campaign.folder / "slow_simulation.py"
    wrapper.write_text(SLOW_SIMULATION)
    text = campaign.spec.read_text()
    simulation = str(PROJECT / "tests" / "reliability" / "crash" / "simulation.py")
    quoted = json.dumps(simulation)
    campaign.spec.write_text(text.replace(quoted, f"{json.dumps(str(wrapper))}, {quoted}"))
    return {"SIM_SLEEP": str(seconds)}


# The default run kills the runner tree mid-batch (the case with work in flight); the
# rest of the matrix is behind --long (the direct runner's kill points, test_crash_resume,
# cover the engine's side of each of them in the default run).
LONG = pytest.mark.long
KILL_POINTS = [
    pytest.param("mid_batch:6", Counter({1: 2}), id="mid-batch"),
    pytest.param("campaign_start:1", Counter(), id="before-the-first-round", marks=LONG),
    pytest.param("after_answer:3", Counter(), id="mid-gate", marks=LONG),
    pytest.param("after_fallback_recorded:2", Counter(), id="after-fallback", marks=LONG),
    pytest.param("after_attempt_recorded:1", Counter(), id="between-attempts", marks=LONG),
    pytest.param("after_gate:2", Counter(), id="after-gate", marks=LONG),
    pytest.param("after_decision_recorded:3", Counter(), id="after-retry-decision", marks=LONG),
    pytest.param("after_batch_launch_recorded:1", Counter(), id="batch-launched", marks=LONG),
    pytest.param("mid_batch:12", Counter({2: 4}), id="last-task-unrecorded", marks=LONG),
    pytest.param("after_batch:2", Counter(), id="after-batch", marks=LONG),
    pytest.param("checkpoint_commit:2", Counter(), id="inside-the-checkpoint", marks=LONG),
    pytest.param("after_checkpoint:3", Counter(), id="after-the-last-round", marks=LONG),
]


def _kill_at(node: LoginNode, point: str) -> None:
    submitted = node.submit()
    assert submitted.returncode == 0, submitted.stderr
    node.serve(UNATTENDED_FAILPOINTS=point, UNATTENDED_FAILPOINT_SCOPE="runner")
    node.wait_runner_gone()
    stuck = node.runs()[0]
    assert stuck["state"]["type"] in {"RUNNING", "PENDING"}  # nobody left to say otherwise


class TestRunnerKilled:
    @pytest.mark.parametrize(("point", "rerun"), KILL_POINTS)
    def test_the_campaign_continues_after_the_runner_tree_is_killed(
        self,
        node: Callable[..., LoginNode],
        model_server: Any,
        reference: Any,
        point: str,
        rerun: Counter[int],
    ) -> None:
        login = node(f"kill-{point.split(':')[0].replace('_', '-')}")
        _kill_at(login, point)
        shown = login.cli("status")
        assert "orphaned: its process" in shown.stdout, shown.stdout
        assert "'unattended serve --detach' continues it" in shown.stdout
        recover_and_complete(login, login.campaign, point)
        assert_like_reference(login.campaign, reference, model_server, rerun=rerun)
        assert "orphan_crashed" in events(login.campaign)

    @pytest.mark.long  # a restart while suspended is in the default run (test_restarts)
    def test_a_kill_while_suspended_keeps_the_request_and_the_answer_completes_it(
        self,
        node: Callable[..., LoginNode],
        model_server: Any,
        reference: Any,
        ask_options: dict[str, str],
    ) -> None:
        login = node("kill-suspended", **ask_options)
        assert login.submit().returncode == 0
        login.serve()
        wait_until(lambda: login.runs()[0]["state"]["type"] == "PAUSED", "the suspend")
        login.kill_runner_tree()
        back = login.serve()
        run_id = login.runs()[0]["id"]
        answered = login.cli("approve", run_id, "--as", "alice", "--comment", "after the kill")
        assert answered.returncode == 0, answered.stderr
        wait_until(lambda: running_again(login, set()), "the resumed run")
        print(f"recovery: while suspended: resumed {time.monotonic() - back:.1f} s after serve")
        completes(login, login.campaign)
        record, _inferences, executions = reference
        got = login.campaign.record()
        assert got.attempts == record.attempts
        assert got.task_results == record.task_results
        assert [d for _, _, d in got.decisions] == ["continue", "suspend", "retry", "continue"]
        assert login.campaign.approval_events() == [("kill-suspended-r1-c1", "alice", "approved")]
        assert login.campaign.executions() == executions


class TestRunnerStopped:
    def test_a_run_cancelled_by_serve_stop_is_continued_by_the_next_runner(
        self, node: Callable[..., LoginNode], model_server: Any, reference: Any
    ) -> None:
        login = node("stop-mid-run")
        login.env |= slow(login.campaign, 0.5)
        assert login.submit().returncode == 0
        login.serve()
        wait_until(lambda: batch_launched(login.campaign, 1), "round 1's batch")
        login.stop()
        (stopped,) = login.runs()  # the stopping runner started nothing new
        # Cancelled by the runner, or Crashed when the flow-run process saw SIGTERM first.
        assert stopped["state"]["type"] in {"CANCELLED", "CRASHED"}
        assert status(login.campaign) == "running"
        recover_and_complete(login, login.campaign, "serve --stop")
        record, inferences, _executions = reference
        got = login.campaign.record()
        assert got.attempts == record.attempts
        assert got.decisions == record.decisions
        assert got.task_results == record.task_results
        assert model_server.requests == inferences
        assert "continued" in events(login.campaign)


@pytest.fixture
def small_disk() -> Iterator[Callable[[Path], Path]]:
    """Mount a 24 MiB tmpfs of our own at a path (as root, in a container that allows it)."""
    mounted: list[Path] = []

    def mount(path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        made = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(path)],
            capture_output=True,
            check=False,
        )
        if made.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with filler.open("wb") as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * (1 << 20))
            out.flush()
    return filler


def _failed_on_storage(login: LoginNode) -> None:
    wait_until(lambda: login.runs()[0]["state"]["type"] == "FAILED", "the run to fail")
    assert "(storage_unavailable)" in login.runs()[0]["state"]["message"]


class TestStorageFaults:
    """The campaign's directory is a small tmpfs; the runner's own files are elsewhere."""

    def test_a_full_disk_fails_the_run_and_the_campaign_continues_once_there_is_room(
        self,
        node: Callable[..., LoginNode],
        model_server: Any,
        reference: Any,
        small_disk: Callable[[Path], Path],
    ) -> None:
        login = node("disk-full")
        disk = small_disk(login.campaign.home / "campaigns" / "disk-full")
        assert login.submit().returncode == 0
        filler = _fill(disk)
        login.serve()
        _failed_on_storage(login)
        login.stop()
        filler.unlink()
        recover_and_complete(login, login.campaign, "disk full")
        assert_like_reference(login.campaign, reference, model_server)

    @pytest.mark.long  # the full disk is the default run's storage fault
    def test_a_read_only_directory_fails_the_run_and_the_campaign_continues_once_writable(
        self,
        node: Callable[..., LoginNode],
        model_server: Any,
        reference: Any,
        small_disk: Callable[[Path], Path],
    ) -> None:
        login = node("read-only")
        disk = small_disk(login.campaign.home / "campaigns" / "read-only")
        assert login.submit().returncode == 0
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        try:
            login.serve()
            _failed_on_storage(login)
            login.stop()
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
        recover_and_complete(login, login.campaign, "read-only directory")
        assert_like_reference(login.campaign, reference, model_server)


def _suspended(login: LoginNode, query_seconds: float = 0.5) -> str:
    assert login.submit().returncode == 0
    login.serve(query_seconds)
    wait_until(lambda: login.runs()[0]["state"]["type"] == "PAUSED", "the suspend before round 1")
    assert not batch_launched(login.campaign, 1)
    return str(login.runs()[0]["id"])


def _weaken(policy: Path) -> None:
    policy.write_text(policy.read_text().replace('severity = "ASK"', 'severity = "TOLERATE"'))


class TestVerifierKilled:
    @pytest.mark.long  # a kill in the default run: mid-batch (TestRunnerKilled)
    def test_a_kill_mid_verifier_runs_it_again_and_launches_each_batch_once(
        self, prefect_server: Any, demo_campaign: Callable[[str], Any]
    ) -> None:
        """SIGKILL of the runner tree while the gate judges the verifier's task results.

        The demo campaign (its scripted planner and its low-fidelity verifier). Nothing of
        the killed verdict was recorded, so the next run judges that attempt again with a
        new verifier run; the record ends equal to an uncrashed run's.
        """
        clean = demo_campaign("verifier-reference")
        clean.home.mkdir()
        done = subprocess.run(
            [sys.executable, "-m", "flows._cli._direct", str(clean.spec), "--state-dir", "."],
            cwd=clean.home,
            env={k: v for k, v in os.environ.items() if not k.startswith("UNATTENDED_")},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert clean.verifier_runs() >= 2
        login = LoginNode(demo_campaign("kill-verifier"))
        try:
            _kill_at(login, "mid_verifier:2")
            recover_and_complete(login, login.campaign, "mid_verifier:2")
            assert "orphan_crashed" in events(login.campaign)
        finally:
            login.stop()
        got, want = login.campaign.record(), clean.record()
        assert got.status == "completed"
        assert got.attempts == want.attempts
        assert got.decisions == want.decisions
        assert got.gate_calls == want.gate_calls
        assert got.batches == want.batches  # each round's batch launched once
        assert got.task_results == want.task_results
        assert login.campaign.verifier_runs() == clean.verifier_runs()


class TestResumedFromTheUI:
    def test_a_runner_polling_hourly_starts_the_resumed_run_at_once(
        self,
        node: Callable[..., LoginNode],
        model_server: Any,
        reference: Any,
        ask_options: dict[str, str],
    ) -> None:
        """The UI's form only calls the resume API (no nudge): the event stream wakes the runner.

        The runner polls once an hour, so the campaign can only complete within the
        test's wait if the ``Resuming`` event reached it.
        """
        login = node("ui-resume", **ask_options)
        waiting = _suspended(login, query_seconds=3600)
        log = login.campaign.home / "runner.log"
        wait_until(lambda: LISTENING_LINE in log.read_text(), "the runner to listen")
        approve(os.environ, UUID(waiting), approver="alice")  # the form's request, no nudge
        completes(login, login.campaign)
        record, _inferences, _executions = reference
        assert login.campaign.record().task_results == record.task_results
        assert login.campaign.approval_events() == [("ui-resume-r1-c1", "alice", "approved")]


class TestApprovalBypass:
    def test_a_second_run_on_a_copied_weakened_spec_launches_nothing(
        self,
        node: Callable[..., LoginNode],
        model_server: Any,
        reference: Any,
        tmp_path: Path,
        ask_options: dict[str, str],
    ) -> None:
        login = node("bypass-copy", **ask_options)
        original = _suspended(login)
        copy = tmp_path / "copy"
        shutil.copytree(login.campaign.folder, copy, ignore=shutil.ignore_patterns("home"))
        _weaken(copy / "policy.toml")
        deployment = login.runs()[0]["deployment_id"]
        attack = _call(
            "POST",
            f"deployments/{deployment}/create_flow_run",
            {
                "parameters": {
                    "spec_path": str(copy / "campaign.toml"),
                    "site": str(copy / "site.toml"),
                    "state_dir": str(login.campaign.home),
                },
                "tags": ["unattended", f"campaign:{login.campaign.name}"],
            },
        )
        assert "id" in attack, attack
        wait_until(lambda: login.state_of(attack["id"]) == "FAILED", "the attack run to end")
        # Refused before its spec is even read: the run's parameters are not the campaign's
        # registration (the pinned inputs would refuse it next, as spec_changed).
        message = _call("GET", f"flow_runs/{attack['id']}")["state"]["message"]
        assert "run_refused" in message
        assert "(site, spec_path)" in message
        assert not batch_launched(login.campaign, 1)
        assert login.state_of(original) == "PAUSED"
        assert status(login.campaign) == "awaiting_approval"
        assert "run_refused" in events(login.campaign)

        answered = login.cli("approve", original, "--as", "alice")
        assert answered.returncode == 0, answered.stderr
        completes(login, login.campaign)
        record, _inferences, _executions = reference
        assert login.campaign.record().task_results == record.task_results
        assert login.campaign.approval_events() == [("bypass-copy-r1-c1", "alice", "approved")]
        assert [d for _, _, d in login.campaign.record().decisions] == [
            "continue",
            "suspend",
            "retry",
            "continue",
        ]

    def test_a_policy_edited_in_place_is_refused_and_never_skips_the_approval(
        self, node: Callable[..., LoginNode], model_server: Any, ask_options: dict[str, str]
    ) -> None:
        login = node("bypass-edit", **ask_options)
        original = _suspended(login)
        _weaken(login.campaign.folder / "policy.toml")

        refused = login.submit()
        assert refused.returncode == 2
        assert "spec_changed" in refused.stderr or "changed" in refused.stderr
        assert str(login.campaign.folder / "policy.toml") in refused.stderr

        accepted = login.submit("--accept-changes")
        assert accepted.returncode == 0, accepted.stderr
        revised = rows(
            login.campaign.database,
            "SELECT actor, details FROM campaign_event WHERE kind = 'inputs_revised'",
        )
        assert len(revised) == 1
        assert revised[0][0]
        assert set(json.loads(revised[0][1])["changed"]) == {"policy"}
        # Whoever answers, the replay under the weakened policy contradicts the record.
        # --no-wait: the flow stops on the mismatch and never gives this answer a verdict.
        assert login.cli("approve", original, "--as", "alice", "--no-wait").returncode == 0
        wait_until(lambda: status(login.campaign) == "failed", "the campaign to stop")
        assert rows(login.campaign.database, "SELECT error_code FROM campaign") == [
            ("decision_mismatch",)
        ]
        assert not batch_launched(login.campaign, 1)
        assert "decision_mismatch" in events(login.campaign)
        decisions = rows(
            login.campaign.database, "SELECT outcome FROM policy_decision WHERE round_index = 1"
        )
        assert decisions == [("suspend",)]


def test_serve_detach_twice_leaves_one_runner(node: Callable[..., LoginNode]) -> None:
    login = node("detach-twice")
    login.serve()
    first = int((login.campaign.home / "runner.lock").read_text())
    login.serve()
    assert int((login.campaign.home / "runner.lock").read_text()) == first
    assert psutil.Process(first).is_running()
    login.stop()
    login.wait_runner_gone()
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
