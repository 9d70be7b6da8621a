"""An outage is not an answer: the server SIGKILLed while a run suspends, then started again.

The run is held (SIGSTOP) right after its campaign is recorded awaiting approval and
before its suspend reaches the server; the server is SIGKILLed; the run goes on into a
server that is not there. It must not record the outage as somebody's answer (it was:
``not_allowed``, then a new form and a new notice each time). After the server and a
runner start again, the watchdog continues the campaign, whose new run waits on the
same request (the same pause key: its notice was sent once) with no answer recorded.
Its own server (``test_restarts.Stack``); the session's is left alone.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import psutil
import pytest
from service_helpers import sqlite_rows  # type: ignore[import-not-found]
from test_restarts import Stack, _spec, _submit, stack  # type: ignore[import-not-found]

from flows._prefect._rest import request
from flows._prefect._server import client_env
from flows._provenance._rows import process_gone

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600, func_only=True)]
__all__ = ["stack"]  # the fixture, used by name

FAST = {
    "UNATTENDED_LEASE_TTL_SECONDS": "6",
    "UNATTENDED_HEARTBEAT_SECONDS": "1",
    "UNATTENDED_WATCHDOG_SECONDS": "0.5",
}


def _runs(stack: Stack) -> list[dict[str, Any]]:
    assert stack.handle is not None
    body = {"flow_runs": {"tags": {"all_": ["campaign:outage-suspend"]}}}
    return list(request(client_env(stack.handle), "POST", "flow_runs/filter", body))


def _kill_server(stack: Stack) -> None:
    assert stack.handle is not None
    root = psutil.Process(stack.handle.pid)
    family = [root, *root.children(recursive=True)]
    for process in family:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(family, timeout=30)


def test_a_server_killed_while_a_run_suspends_is_no_answer(stack: Stack) -> None:
    stack.extra_env |= FAST
    spec = _spec(stack, "campaign-approval.toml", "outage-suspend", rounds=3, sleep=0.0)
    submitted = _submit(spec, stack.home)
    stack.start_runner()
    database = stack.home / "campaigns" / "outage-suspend" / "provenance.db"

    deadline = time.monotonic() + 240
    query = "SELECT status FROM campaign"
    while True:
        with contextlib.suppress(Exception):  # the file exists before its schema does
            if sqlite_rows(database, query) == [("awaiting_approval",)]:
                break
        assert time.monotonic() < deadline, "the campaign never asked for approval"
        time.sleep(0.002)
    ((host, pid),) = sqlite_rows(database, "SELECT host, pid FROM campaign_lease")
    flow_run = psutil.Process(int(pid))
    flow_run.suspend()  # recorded awaiting approval, its suspend not yet on the server
    try:
        state = stack.run(submitted.flow_run_id)["state"]
        assert state["type"] == "RUNNING", f"the suspend reached the server first: {state}"
        _kill_server(stack)
    finally:
        flow_run.resume()
    deadline = time.monotonic() + 180
    while not process_gone(host, int(pid)):  # it meets no server, and stops
        assert time.monotonic() < deadline, "the flow-run process never stopped"
        time.sleep(0.2)

    stack.stop_runner()
    stack.start_server()
    stack.start_runner()
    deadline = time.monotonic() + 300  # a server's and a runner's start, a TTL, a run's start
    while True:
        again = [r for r in _runs(stack) if r["id"] != str(submitted.flow_run_id)]
        if again and again[0]["state"]["type"] == "PAUSED":
            break
        assert time.monotonic() < deadline, "the campaign was not continued"
        time.sleep(0.5)

    assert again[0]["state"]["state_details"]["pause_key"] == "outage-suspend-r2-c1-n0"
    answers = sqlite_rows(database, "SELECT decision, refusal FROM approval_event")
    assert answers == []  # the outage was nobody's answer: no not_allowed, no unreadable
    kinds = [k for (k,) in sqlite_rows(database, "SELECT kind FROM campaign_event")]
    assert "continued" in kinds
    assert stack.run(submitted.flow_run_id)["state"]["type"] == "CRASHED"
    assert sqlite_rows(database, "SELECT status FROM campaign") == [("awaiting_approval",)]
