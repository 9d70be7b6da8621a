"""A person stops a campaign: ``unattended cancel NAME``, or Prefect's UI Cancel.

Through the real command line against the session's Prefect server. Either way the
run ends *Cancelled*, the provenance records the campaign as cancelled (status
``blocked``, code ``cancelled``, a ``cancelled`` event), ``inspect`` shows
``cancelled`` and the runner's watchdog never continues it.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable

import psutil
import pytest
from crash_harness import Campaign, LoginNode, campaign_row, events, rows, slow, wait_until

from flows._prefect._rest import request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]


@pytest.fixture
def login(login_nodes: Callable[..., LoginNode]) -> Callable[..., LoginNode]:
    """Build a login node whose simulations each take ``sleep`` seconds."""

    def make(name: str, sleep: float, **options: str) -> LoginNode:
        node = login_nodes(name, **options)
        node.env |= slow(node.campaign, sleep)
        return node

    return make


def _simulations_running(campaign: Campaign) -> list[int]:
    """Return the pids of this campaign's simulations still running."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any(str(campaign.folder) in part and "slow_simulation" in part for part in cmdline):
            found.append(process.info["pid"])
    return found


def _start_mid_batch(node: LoginNode) -> str:
    """Submit, serve, and return the run's id once round 0's batch is in flight."""
    submitted = node.submit()
    assert submitted.returncode == 0, submitted.stderr
    node.serve()
    wait_until(
        lambda: rows(node.campaign.database, "SELECT 1 FROM batch WHERE round_index = 0"),
        "round 0's batch to be launched",
    )
    (run,) = node.runs()
    assert run["state"]["type"] == "RUNNING"
    return str(run["id"])


def _assert_cancelled_and_not_continued(node: LoginNode, run_id: str) -> None:
    campaign = node.campaign
    assert campaign_row(campaign) == ("blocked", "cancelled")
    assert "cancelled" in events(campaign)
    # The watchdog's own word that it judged the cancelled run and did not continue it.
    log = campaign.home / "runner.log"
    decided = (
        f"watchdog: left {campaign.name} cancelled (run {run_id})",
        f"watchdog: recorded {campaign.name} as cancelled (run {run_id})",
    )
    wait_until(
        lambda: any(line in log.read_text() for line in decided),
        "the watchdog's decision on the cancelled run",
    )
    runs = node.runs()
    assert [r["id"] for r in runs] == [run_id], [r["state"] for r in runs]
    assert "continued" not in events(campaign)
    shown = node.cli("inspect", campaign.name)
    assert shown.returncode == 0, shown.stderr
    assert f"Campaign {campaign.name}: cancelled" in shown.stdout
    assert "running" not in shown.stdout.splitlines()[0]


class TestCancelCommand:
    def test_cancel_mid_batch_ends_the_run_and_records_the_campaign_cancelled(
        self, login: Callable[..., LoginNode]
    ) -> None:
        node = login("cancel-cli", sleep=4.0)
        run_id = _start_mid_batch(node)

        cancelled = node.cli("cancel", node.campaign.name)

        assert cancelled.returncode == 0, cancelled.stderr
        assert _simulations_running(node.campaign) == []
        assert f"campaign {node.campaign.name} cancelled" in cancelled.stdout
        assert "a batch in flight was not finished" in cancelled.stdout
        assert node.runs()[0]["state"]["type"] == "CANCELLED"
        assert events(node.campaign).count("cancel_requested") == 1
        actors = rows(
            node.campaign.database, "SELECT actor FROM campaign_event WHERE kind = 'cancelled'"
        )
        assert actors == [(getpass.getuser(),)]
        _assert_cancelled_and_not_continued(node, run_id)
        status = node.cli("status", node.campaign.name)
        assert status.returncode == 0, status.stderr
        assert run_id in status.stdout
        assert "Cancelled" in status.stdout

    def test_a_cancelled_campaign_submitted_again_completes_rerunning_the_cancelled_round(
        self, login: Callable[..., LoginNode]
    ) -> None:
        node = login("cancel-resubmit", sleep=4.0)
        _start_mid_batch(node)
        assert node.cli("cancel", node.campaign.name).returncode == 0
        node.stop()

        node.env["SIM_SLEEP"] = "0"
        again = node.submit()
        assert again.returncode == 0, again.stderr
        node.serve()

        ended = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
        wait_until(lambda: node.runs()[0]["state"]["type"] in ended, "the new run to end")
        assert node.runs()[0]["state"]["type"] == "COMPLETED"
        assert campaign_row(node.campaign) == ("completed", None)
        executions = node.campaign.executions()
        assert executions[1] == executions[2] == 4
        assert executions[0] >= 4  # the cancelled round's batch ran again in full

    def test_cancel_of_an_unknown_campaign_is_one_clear_line(
        self, login: Callable[..., LoginNode]
    ) -> None:
        node = login("cancel-unknown", sleep=0.0)
        unknown = node.cli("cancel", "no-such-campaign")
        assert unknown.returncode == 2
        assert "no campaign named 'no-such-campaign'" in unknown.stderr
        assert "Traceback" not in unknown.stderr

    def test_cancel_while_awaiting_approval_ends_the_suspended_run_at_once(
        self, login: Callable[..., LoginNode], ask_options: dict[str, str]
    ) -> None:
        node = login("cancel-suspended", sleep=0.0, **ask_options)
        assert node.submit().returncode == 0
        node.serve()
        wait_until(lambda: node.runs()[0]["state"]["type"] == "PAUSED", "the approval request")
        run_id = str(node.runs()[0]["id"])

        cancelled = node.cli("cancel", node.campaign.name, "--wait", "0")

        assert cancelled.returncode == 0, cancelled.stderr
        assert node.runs()[0]["state"]["type"] == "CANCELLED"
        assert "by force" not in cancelled.stdout  # Prefect ends a suspended run itself
        _assert_cancelled_and_not_continued(node, run_id)


class TestCancelFromTheUI:
    def test_the_ui_cancel_of_a_running_run_ends_the_same_way(
        self, login: Callable[..., LoginNode]
    ) -> None:
        node = login("cancel-ui", sleep=4.0)
        run_id = _start_mid_batch(node)

        # What the UI's Cancel does: propose Cancelling through the API.
        request(
            os.environ,
            "POST",
            f"flow_runs/{run_id}/set_state",
            {"state": {"type": "CANCELLING", "name": "Cancelling"}},
        )

        wait_until(lambda: node.runs()[0]["state"]["type"] == "CANCELLED", "the run cancelled")
        wait_until(lambda: campaign_row(node.campaign) == ("blocked", "cancelled"), "the record")
        assert "cancel_requested" not in events(node.campaign)
        _assert_cancelled_and_not_continued(node, run_id)

    def test_a_ui_cancel_with_no_runner_serving_is_ended_by_unattended_cancel(
        self, login: Callable[..., LoginNode]
    ) -> None:
        node = login("cancel-ui-no-runner", sleep=4.0)
        run_id = _start_mid_batch(node)
        node.kill_runner_tree()
        request(
            os.environ,
            "POST",
            f"flow_runs/{run_id}/set_state",
            {"state": {"type": "CANCELLING", "name": "Cancelling"}},
        )
        assert node.runs()[0]["state"]["type"] == "CANCELLING"  # nobody to stop it

        cancelled = node.cli("cancel", node.campaign.name)

        assert cancelled.returncode == 0, cancelled.stderr
        assert "no runner serves this state directory" in cancelled.stdout
        assert "set Cancelled by force" in cancelled.stdout
        assert node.runs()[0]["state"]["type"] == "CANCELLED"
        assert campaign_row(node.campaign) == ("blocked", "cancelled")
