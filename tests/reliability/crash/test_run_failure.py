"""A campaign that fails at run time, outside any round, says so in its record.

The site's Dask scheduler is down (a port nothing listens on): ``check`` cannot
know, the executor fails as the run starts. Before, the provenance kept saying
``running`` and so did ``inspect``; now it says ``failed`` with a stable code.
Through the real command line against the session's Prefect server.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
from crash_harness import LoginNode, campaign_row, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]

DASK_SITE = """\
name = "scheduler-down"
max_concurrency = 1
task_timeout = 60.0
retries = 0
retry_backoff = 0.0
kill_grace = 1.0
listen = "127.0.0.1"

[backend]
kind = "dask"
scheduler_address = "tcp://127.0.0.1:{port}"

[scheduler]
system = "none"

[cost]
node_hours_per_simulation = 0.01
node_hours_per_verifier = 0.001
"""
ENDED = {"FAILED", "CRASHED", "COMPLETED", "CANCELLED"}


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def login(login_nodes: Callable[..., LoginNode]) -> LoginNode:
    node = login_nodes("scheduler-down")
    node.campaign.site.write_text(DASK_SITE.format(port=_closed_port()))
    node.env["DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT"] = "2s"  # the scheduler is down
    return node


def test_a_run_that_fails_as_it_starts_is_recorded_failed_and_inspect_says_so(
    login: LoginNode,
) -> None:
    campaign = login.campaign
    submitted = login.submit()
    assert submitted.returncode == 0, submitted.stderr
    login.serve()

    wait_until(lambda: login.runs() and login.runs()[0]["state"]["type"] in ENDED, "the run to end")
    assert login.runs()[0]["state"]["type"] == "FAILED"

    row = campaign_row(campaign)
    assert row is not None
    status, code = row
    assert status == "failed"
    assert code
    shown = login.cli("inspect", campaign.name)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"Campaign {campaign.name}: failed ({code})"
