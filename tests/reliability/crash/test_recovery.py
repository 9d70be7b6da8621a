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
import json
import os
import shutil
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
from crash_harness import (
    LoginNode,
    assert_like_reference,
    batch_launched,
    events,
    rows,
    slow,
    status,
    wait_until,
)

from flows._cli._runner import LISTENING_LINE
from flows._prefect._rest import approve, request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]


def running_again(node: LoginNode, crashed: set[str]) -> bool:
    """A run other than the crashed ones is running (or the campaign already finished)."""
    return any(
        run["id"] not in crashed and run["state"]["type"] in {"RUNNING", "COMPLETED", "PAUSED"}
        for run in node.runs()
    )


def recover_and_complete(node: LoginNode, label: str) -> float:
    """Start the runner again; return seconds until the campaign runs again; wait for the end."""
    crashed = {run["id"] for run in node.runs()}
    back = node.serve()
    wait_until(lambda: running_again(node, crashed), "the campaign to run again")
    seconds = time.monotonic() - back
    print(f"recovery: {label}: running again {seconds:.1f} s after 'serve --detach'")
    node.completes()
    return seconds


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
        login_nodes: Callable[..., LoginNode],
        model_server: Any,
        reference: Any,
        point: str,
        rerun: Counter[int],
    ) -> None:
        login = login_nodes(f"kill-{point.split(':')[0].replace('_', '-')}")
        _kill_at(login, point)
        shown = login.cli("status")
        assert "orphaned: its process" in shown.stdout, shown.stdout
        assert "'unattended serve --detach' continues it" in shown.stdout
        recover_and_complete(login, point)
        assert_like_reference(login.campaign, reference, model_server, rerun=rerun)
        assert "orphan_crashed" in events(login.campaign)

    @pytest.mark.long  # a restart while suspended is in the default run (test_restarts)
    def test_a_kill_while_suspended_keeps_the_request_and_the_answer_completes_it(
        self,
        login_nodes: Callable[..., LoginNode],
        model_server: Any,
        reference: Any,
        ask_options: dict[str, str],
    ) -> None:
        login = login_nodes("kill-suspended", **ask_options)
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
        login.completes()
        record, _inferences, executions = reference
        got = login.campaign.record()
        assert got.attempts == record.attempts
        assert got.task_results == record.task_results
        assert [d for _, _, d in got.decisions] == ["continue", "suspend", "retry", "continue"]
        assert login.campaign.approval_events() == [("kill-suspended-r1-c1", "alice", "approved")]
        assert login.campaign.executions() == executions


class TestRunnerStopped:
    # The same stop mid-batch is in the default run: test_restarts.TestRestartWhileRunning.
    @pytest.mark.long
    def test_a_run_cancelled_by_serve_stop_is_continued_by_the_next_runner(
        self, login_nodes: Callable[..., LoginNode], model_server: Any, reference: Any
    ) -> None:
        login = login_nodes("stop-mid-run")
        login.env |= slow(login.campaign, 0.5)
        assert login.submit().returncode == 0
        login.serve()
        wait_until(lambda: batch_launched(login.campaign, 1), "round 1's batch")
        login.stop()
        (stopped,) = login.runs()  # the stopping runner started nothing new
        # Cancelled by the runner, or Crashed when the flow-run process saw SIGTERM first.
        assert stopped["state"]["type"] in {"CANCELLED", "CRASHED"}
        assert status(login.campaign) == "running"
        recover_and_complete(login, "serve --stop")
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
        login_nodes: Callable[..., LoginNode],
        model_server: Any,
        reference: Any,
        small_disk: Callable[[Path], Path],
    ) -> None:
        login = login_nodes("disk-full")
        disk = small_disk(login.campaign.home / "campaigns" / "disk-full")
        assert login.submit().returncode == 0
        filler = _fill(disk)
        login.serve()
        _failed_on_storage(login)
        login.stop()
        filler.unlink()
        recover_and_complete(login, "disk full")
        assert_like_reference(login.campaign, reference, model_server)

    @pytest.mark.long  # the full disk is the default run's storage fault
    def test_a_read_only_directory_fails_the_run_and_the_campaign_continues_once_writable(
        self,
        login_nodes: Callable[..., LoginNode],
        model_server: Any,
        reference: Any,
        small_disk: Callable[[Path], Path],
    ) -> None:
        login = login_nodes("read-only")
        disk = small_disk(login.campaign.home / "campaigns" / "read-only")
        assert login.submit().returncode == 0
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        try:
            login.serve()
            _failed_on_storage(login)
            login.stop()
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
        recover_and_complete(login, "read-only directory")
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
            recover_and_complete(login, "mid_verifier:2")
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
        login_nodes: Callable[..., LoginNode],
        model_server: Any,
        reference: Any,
        ask_options: dict[str, str],
    ) -> None:
        """The UI's form only calls the resume API (no nudge): the event stream wakes the runner.

        The runner polls once an hour, so the campaign can only complete within the
        test's wait if the ``Resuming`` event reached it.
        """
        login = login_nodes("ui-resume", **ask_options)
        waiting = _suspended(login, query_seconds=3600)
        log = login.campaign.home / "runner.log"
        wait_until(lambda: LISTENING_LINE in log.read_text(), "the runner to listen")
        approve(os.environ, UUID(waiting), approver="alice")  # the form's request, no nudge
        login.completes()
        record, _inferences, _executions = reference
        assert login.campaign.record().task_results == record.task_results
        assert login.campaign.approval_events() == [("ui-resume-r1-c1", "alice", "approved")]


class TestApprovalBypass:
    # Runs of the deployment with a copied spec or site are refused (run_refused) in the
    # default run: test_run_authority.TestRunsOfTheOwnersDeployment.
    @pytest.mark.long
    def test_a_second_run_on_a_copied_weakened_spec_launches_nothing(
        self,
        login_nodes: Callable[..., LoginNode],
        model_server: Any,
        reference: Any,
        tmp_path: Path,
        ask_options: dict[str, str],
    ) -> None:
        login = login_nodes("bypass-copy", **ask_options)
        original = _suspended(login)
        copy = tmp_path / "copy"
        shutil.copytree(login.campaign.folder, copy, ignore=shutil.ignore_patterns("home"))
        _weaken(copy / "policy.toml")
        deployment = login.runs()[0]["deployment_id"]
        attack = request(
            os.environ,
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
        message = request(os.environ, "GET", f"flow_runs/{attack['id']}")["state"]["message"]
        assert "run_refused" in message
        assert "(site, spec_path)" in message
        assert not batch_launched(login.campaign, 1)
        assert login.state_of(original) == "PAUSED"
        assert status(login.campaign) == "awaiting_approval"
        assert "run_refused" in events(login.campaign)

        answered = login.cli("approve", original, "--as", "alice")
        assert answered.returncode == 0, answered.stderr
        login.completes()
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
        self, login_nodes: Callable[..., LoginNode], model_server: Any, ask_options: dict[str, str]
    ) -> None:
        login = login_nodes("bypass-edit", **ask_options)
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


@pytest.mark.long  # in the default run: test_up.TestUp::test_serve_detach_with_a_runner_up...
def test_serve_detach_twice_leaves_one_runner(login_nodes: Callable[..., LoginNode]) -> None:
    login = login_nodes("detach-twice")
    login.serve()
    first = int((login.campaign.home / "runner.lock").read_text())
    login.serve()
    assert int((login.campaign.home / "runner.lock").read_text()) == first
    assert psutil.Process(first).is_running()
    login.stop()  # and waits for the runner to be gone
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
