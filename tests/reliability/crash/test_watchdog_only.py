"""The flow-run process dies, the runner stays up: its watchdog alone finishes the campaign.

The crash suite's campaign (``conftest.py``) is submitted with the real command
line to the session's Prefect server and served by ``unattended serve --detach``.
While round 1's batch is on the allocation, the test SIGKILLs the process that
holds the campaign's lease (the flow run's; never the runner) from outside, as
the OOM killer or an operator's ``kill -9`` would. Then nobody types anything:
the runner's watchdog must notice the run is gone, start a run that continues from
the checkpoint, and that run must finish the campaign with the provenance of an
uncrashed run and no model answer asked twice. The time from the kill to the
campaign running again is printed (``-s``) as ``recovery: ...``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest
from crash_harness import (
    FAST,
    LoginNode,
    assert_same_record,
    batch_launched,
    events,
    rows,
    slow,
    wait_until,
)

from flows._provenance._rows import process_gone

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]


@pytest.fixture
def operator(login_nodes: Callable[..., LoginNode]) -> LoginNode:
    """The user's shell: submits once, starts the runner once, then only watches."""
    return login_nodes("watchdog-only")


def test_a_killed_flow_run_process_is_continued_by_the_watchdog_alone(
    operator: LoginNode, model_server: Any, reference: Any
) -> None:
    campaign = operator.campaign
    operator.env |= slow(campaign, 0.5)
    submitted = operator.submit()
    assert submitted.returncode == 0, submitted.stderr
    operator.serve()
    runner = operator.runner_pid()
    assert runner is not None

    wait_until(lambda: batch_launched(campaign, 1), "round 1's batch on the allocation")
    ((owner, host, pid),) = rows(campaign.database, "SELECT owner, host, pid FROM campaign_lease")
    assert pid != runner
    assert runner in {p.pid for p in psutil.Process(pid).parents()}  # the runner's flow run
    os.kill(pid, signal.SIGKILL)  # from outside; the runner is left alone
    killed_at = time.monotonic()
    wait_until(lambda: process_gone(host, pid), "the flow-run process to be gone")

    def continued() -> bool:
        return any(
            run["id"] != owner and run["state"]["type"] in {"RUNNING", "COMPLETED"}
            for run in operator.runs()
        )

    wait_until(continued, "the watchdog to continue the campaign")
    print(f"recovery: watchdog only: running again {time.monotonic() - killed_at:.1f} s after")

    operator.completes()
    assert operator.runner_pid() == runner  # the same runner throughout
    killed = next(run for run in operator.runs() if run["id"] == owner)
    assert killed["state"]["type"] == "CRASHED", killed["state"]
    assert "continued" in events(campaign)

    assert_same_record(campaign, reference, model_server)
    _record, _inferences, executions = reference
    ran = campaign.executions()
    # Round 0 finished before the kill and round 2 ran once after it; of round 1's
    # batch, only the tasks without a recorded result ran again (at most the batch).
    assert ran[0] == executions[0]
    assert ran[2] == executions[2]
    assert executions[1] <= ran[1] <= 2 * executions[1]


@pytest.mark.parametrize(
    "new_runner",
    [
        "in_the_window",
        "mid_batch",
    ],
)
def test_a_killed_runner_never_marks_the_finished_run_crashed(
    login_nodes: Callable[..., LoginNode], model_server: Any, reference: Any, new_runner: str
) -> None:
    """Only the runner is SIGKILLed mid-batch; its flow-run process finishes the campaign.

    A new runner (``serve --detach``, as cron would) sees a Running run it does not
    execute. That run holds the lease while it works, records its ending, then gives the
    lease back a moment before Prefect hears it completed. The failpoint
    ``after_lease_released:1:stop`` makes the run stop itself (SIGSTOP) in that moment,
    so the new runner's watchdog judges it there, once its ending is a lease TTL old: it
    must settle it from its recorded ending and never take it for an orphan (issue 43: it
    marked the finished run Crashed, "running for 82 s without holding the campaign's
    lease"). Then the run goes on (SIGCONT) and ends Completed. The new runner starts
    while the run is held (``in_the_window``) or while it still works (``mid_batch``).
    """
    operator = login_nodes(f"runner-only-{new_runner}".replace("_", "-"))  # runs by tag
    campaign = operator.campaign
    operator.env |= slow(campaign, 2.0)  # the rounds outlast the new runner's start
    assert operator.submit().returncode == 0
    operator.serve(UNATTENDED_FAILPOINTS="after_lease_released:1:stop")  # its flow runs' too
    runner = operator.runner_pid()
    assert runner is not None
    wait_until(lambda: batch_launched(campaign, 1), "round 1's batch on the allocation")
    ((owner, host, pid),) = rows(campaign.database, "SELECT owner, host, pid FROM campaign_lease")
    flow_run = psutil.Process(pid)
    assert runner in {p.pid for p in flow_run.parents()}
    os.kill(runner, signal.SIGKILL)  # the runner only: its flow-run process goes on
    operator.wait_runner_gone()
    assert not process_gone(host, pid)
    if new_runner == "mid_batch":
        operator.serve()  # a new runner (no failpoint), while the old one's flow run works

    def held() -> bool:
        return flow_run.status() == psutil.STATUS_STOPPED

    ending = "SELECT status, code FROM run_ending WHERE flow_run_id = ?"
    wait_until(held, "the flow run to stop itself after giving the lease back")
    try:
        lease = "SELECT owner, released FROM campaign_lease"
        assert rows(campaign.database, lease) == [(owner, 1)]  # the lease is given back
        assert rows(campaign.database, ending, owner) == [("completed", None)]
        assert operator.state_of(owner) == "RUNNING"  # Prefect has not heard the end
        if new_runner == "in_the_window":
            operator.serve()  # a new runner (no failpoint), while the run is held there

        def judged() -> set[str]:
            return {"run_settled", "orphan_crashed"} & set(events(campaign))

        # The watchdog sweeps every 0.5 s and the run is due a lease TTL (6 s) after
        # its ending: ten TTLs is a bound on waiting for the sweep, not a timing assert.
        within = 10 * float(FAST["UNATTENDED_LEASE_TTL_SECONDS"])
        verdict = wait_until(judged, "the new runner's watchdog to judge the held run", within)
        assert verdict == {"run_settled"}
        assert held()  # judged while held in the window, not after
        assert operator.state_of(owner) == "COMPLETED"  # from its recorded ending
    finally:
        flow_run.resume()

    wait_until(lambda: process_gone(host, pid), "the flow-run process to finish")
    operator.completes()
    finished = next(run for run in operator.runs() if run["id"] == owner)
    assert finished["state"]["type"] == "COMPLETED", finished["state"]
    assert [run["id"] for run in operator.runs()] == [owner]  # nothing continued it
    assert "orphan_crashed" not in events(campaign)
    assert rows(campaign.database, ending, owner) == [("completed", None)]
    shown = operator.cli("status", campaign.name)
    assert shown.returncode == 0, shown.stderr
    assert "completed" in shown.stdout, shown.stdout
    assert "rashed" not in shown.stdout, shown.stdout
    assert_same_record(campaign, reference, model_server)
    _record, _inferences, executions = reference
    assert campaign.executions() == executions  # nothing ran twice
