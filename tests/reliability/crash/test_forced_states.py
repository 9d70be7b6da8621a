"""A waiting run forced out of its suspension through the API never leaves the campaign stuck.

Anyone holding the server's secret (the UI, ``prefect`` on the command line, the API) can
set a suspended run's state by force. The run's process is gone (it suspended), so the
flow records nothing: the provenance says the campaign awaits approval and no ending is
recorded for the run, while Prefect says the run ended. The runner's watchdog sees them
disagree: a run forced Completed or Failed is continued (a new run waits on the same
request; nothing is answered for anyone), a run forced Cancelled is recorded as a
person's cancel, as ``unattended cancel`` records it. Real CLI, runner and server.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from crash_harness import LoginNode, campaign_row, events, rows, wait_until

from flows._prefect._rest import request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]


def _waiting(node: LoginNode, ask_options: dict[str, str]) -> tuple[str, str]:
    """Submit, serve, wait for round 1's suspend; return the run id and its pause key."""
    assert node.submit().returncode == 0
    node.serve()
    wait_until(lambda: node.runs()[0]["state"]["type"] == "PAUSED", "the suspend")
    run = node.runs()[0]
    return run["id"], run["state"]["state_details"]["pause_key"]


def _force(run_id: str, state: str) -> None:
    body = {"state": {"type": state, "message": "forced through the API"}, "force": True}
    request(os.environ, "POST", f"flow_runs/{run_id}/set_state", body)


@pytest.mark.parametrize("state", ["COMPLETED", "FAILED"])
def test_a_waiting_run_forced_to_end_is_continued_on_the_same_request(
    login_nodes: Callable[..., LoginNode],
    model_server: Any,
    ask_options: dict[str, str],
    state: str,
) -> None:
    node = login_nodes(f"forced-{state.lower()}", **ask_options)
    forced, key = _waiting(node, ask_options)
    _force(forced, state)

    def continued() -> dict[str, Any] | None:
        return next(
            (r for r in node.runs() if r["id"] != forced and r["state"]["type"] == "PAUSED"),
            None,
        )

    again = wait_until(continued, "the watchdog to continue the campaign")
    assert again["state"]["state_details"]["pause_key"] == key  # the same request
    assert node.state_of(forced) == state  # left as it was forced
    assert node.campaign.approval_events() == []  # nobody answered, nothing refused
    (why,) = rows(
        node.campaign.database,
        "SELECT json_extract(details, '$.why') FROM campaign_event WHERE kind = 'continued'",
    )
    assert f"set {state.title()}" in why[0] or "failed without recording" in why[0]
    assert campaign_row(node.campaign)[:2] == ("awaiting_approval", None)

    answered = node.cli("approve", again["id"], "--as", "alice")
    assert answered.returncode == 0, answered.stderr
    node.completes()
    assert node.campaign.approval_events() == [(key.rsplit("-n", 1)[0], "alice", "approved")]


def test_a_waiting_run_forced_cancelled_is_recorded_as_a_cancel(
    login_nodes: Callable[..., LoginNode], model_server: Any, ask_options: dict[str, str]
) -> None:
    node = login_nodes("forced-cancelled", **ask_options)
    forced, _key = _waiting(node, ask_options)
    _force(forced, "CANCELLED")

    wait_until(lambda: "cancelled" in events(node.campaign), "the cancel to be recorded")
    assert campaign_row(node.campaign)[:2] == ("blocked", "cancelled")
    ending = "SELECT status, code FROM run_ending WHERE flow_run_id = ?"
    assert rows(node.campaign.database, ending, forced) == [("blocked", "cancelled")]
    assert [r["id"] for r in node.runs()] == [forced]  # never continued
    assert node.campaign.approval_events() == []


def test_a_rejection_shows_in_prefect_as_a_stop_not_a_failure(
    login_nodes: Callable[..., LoginNode], model_server: Any, ask_options: dict[str, str]
) -> None:
    node = login_nodes("rejected", **ask_options)
    waiting, _key = _waiting(node, ask_options)
    answered = node.cli("approve", waiting, "--as", "alice", "--reject")
    assert answered.returncode == 0, answered.stderr
    wait_until(lambda: node.state_of(waiting) == "CANCELLED", "the run to stop")
    run = request(os.environ, "GET", f"flow_runs/{waiting}")
    assert "approval rejected by alice (blocked, approval_rejected)" in run["state"]["message"]
    ending = "SELECT status, code FROM run_ending WHERE flow_run_id = ?"
    assert rows(node.campaign.database, ending, waiting) == [("blocked", "approval_rejected")]
    # The watchdog takes it for what it is: not a person's cancel, not continued.
    assert campaign_row(node.campaign)[:2] == ("blocked", "approval_rejected")
    assert "cancelled" not in events(node.campaign)
    assert [r["id"] for r in node.runs()] == [waiting]


def test_cancelling_a_waiting_run_speaks_of_no_batch_in_flight(
    login_nodes: Callable[..., LoginNode], model_server: Any, ask_options: dict[str, str]
) -> None:
    node = login_nodes("cancel-waiting", **ask_options)
    waiting, _key = _waiting(node, ask_options)
    cancelled = node.cli("cancel", node.campaign.name)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancelled: recorded in its provenance" in cancelled.stdout
    assert "batch in flight" not in cancelled.stdout
    ending = "SELECT status, code FROM run_ending WHERE flow_run_id = ?"
    assert rows(node.campaign.database, ending, waiting) == [("blocked", "cancelled")]
