"""A campaign that fails at run time, outside any round, says so in its record.

The site's Dask scheduler is down (a port nothing listens on): ``check`` cannot
know, the executor fails as the run starts. Before, the provenance kept saying
``running`` and so did ``inspect``; now it says ``failed`` with a stable code.
Through the real command line against the session's Prefect server.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flows._prefect._rest import request

PROJECT = Path(__file__).resolve().parents[3]
Campaign = Any  # conftest's Campaign (conftest is not importable)

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


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _rows(database: Path, sql: str) -> list[tuple[Any, ...]]:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as c:
            return [tuple(r) for r in c.execute(sql)]
    except sqlite3.OperationalError:
        return []


@pytest.fixture
def campaign(prefect_server: Any, make_campaign: Callable[..., Campaign]) -> Iterator[Campaign]:
    made = make_campaign("scheduler-down")
    made.site.write_text(DASK_SITE.format(port=_closed_port()))
    yield made
    _cli(made, "serve", "--stop")


def _cli(campaign: Campaign, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNATTENDED_")}
    env |= {
        "UNATTENDED_HOME": str(campaign.home),
        "UNATTENDED_WATCHDOG_SECONDS": "0.5",
        "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s",  # the scheduler is down: fail fast
    }
    return subprocess.run(
        [sys.executable, "-m", "flows._cli", *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_a_run_that_fails_as_it_starts_is_recorded_failed_and_inspect_says_so(
    campaign: Campaign,
) -> None:
    submitted = _cli(campaign, "submit", str(campaign.spec))
    assert submitted.returncode == 0, submitted.stderr
    assert _cli(campaign, "serve", "--detach", "--query-seconds", "0.5").returncode == 0

    body = {"flow_runs": {"tags": {"all_": [f"campaign:{campaign.name}"]}}}
    deadline = time.monotonic() + 150
    state = None
    while time.monotonic() < deadline:
        runs = request(os.environ, "POST", "flow_runs/filter", body)
        state = runs[0]["state"]["type"] if runs else None
        if state in {"FAILED", "CRASHED", "COMPLETED", "CANCELLED"}:
            break
        time.sleep(0.5)
    assert state == "FAILED"

    ((status, code),) = _rows(campaign.database, "SELECT status, error_code FROM campaign")
    assert status == "failed"
    assert code
    shown = _cli(campaign, "inspect", campaign.name)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"Campaign {campaign.name}: failed ({code})"
