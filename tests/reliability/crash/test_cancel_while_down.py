"""A UI Cancel while no runner serves: the run waits *Cancelling*, then ends by itself.

Prefect's runner stops only the runs it is executing, so a run proposed *Cancelling*
(the UI's Cancel, through the API the UI uses) while the runner tree is gone has
nobody to end it. ``status`` says so meanwhile; once a runner is back its watchdog
ends the run *Cancelled* and the provenance records the campaign cancelled, without
a human command.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from crash_harness import LoginNode, campaign_row, events, rows, slow, wait_until

from flows._prefect._rest import request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]


def test_a_ui_cancel_while_the_runner_is_down_ends_cancelled_when_it_comes_back(
    login_nodes: Callable[..., LoginNode],
) -> None:
    node = login_nodes("cancel-runner-down")
    node.env |= slow(node.campaign, 4.0)
    assert node.submit().returncode == 0
    node.serve()
    wait_until(
        lambda: rows(node.campaign.database, "SELECT 1 FROM batch WHERE round_index = 0"),
        "round 0's batch to be launched",
    )
    (run,) = node.runs()
    run_id = str(run["id"])
    node.kill_runner_tree()

    # What the UI's Cancel does: propose Cancelling through the API.
    request(
        os.environ,
        "POST",
        f"flow_runs/{run_id}/set_state",
        {"state": {"type": "CANCELLING", "name": "Cancelling"}},
    )
    assert node.state_of(run_id) == "CANCELLING"

    shown = node.cli("status", node.campaign.name)
    assert shown.returncode == 0, shown.stderr
    assert "Cancelling" in shown.stdout
    assert "no runner is serving to stop it" in shown.stdout
    assert "'unattended serve --detach' ends it as cancelled" in shown.stdout
    assert campaign_row(node.campaign) == ("running", None)  # nothing decided yet

    node.serve()

    wait_until(lambda: node.state_of(run_id) == "CANCELLED", "the run to end Cancelled", 60)
    wait_until(lambda: campaign_row(node.campaign) == ("blocked", "cancelled"), "the record", 60)
    assert [r["id"] for r in node.runs()] == [run_id]  # never continued
    kinds = events(node.campaign)
    assert "cancelled" in kinds
    assert "continued" not in kinds
    assert "orphan_crashed" not in kinds
    inspected = node.cli("inspect", node.campaign.name)
    assert inspected.returncode == 0, inspected.stderr
    assert f"Campaign {node.campaign.name}: cancelled" in inspected.stdout
    after = node.cli("status", node.campaign.name)
    assert "Cancelled" in after.stdout
    assert "no runner is serving" not in after.stdout
