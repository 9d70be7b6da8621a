"""A campaign whose every run crashes stops at its continuation cap, counted across runners.

Through the real command line (``unattended submit|serve|status``) and the session's
real Prefect server. ``UNATTENDED_FAILPOINTS=campaign_start:1`` in the runner's
environment SIGKILLs every flow-run process it starts as soon as it holds the
campaign's lease (what a site prologue that always fails does to a run): the runner
marks each run *Crashed* and its watchdog continues the campaign. The continuations
are counted in the provenance, so a runner stopped and started again in between does
not start a new count; after ``MAX_CONTINUATIONS`` the campaign is recorded
``failed`` with ``continuations_exhausted`` and no further run is started.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flows._prefect._recovery import EXHAUSTED_CODE, MAX_CONTINUATIONS
from flows._prefect._rest import request

PROJECT = Path(__file__).resolve().parents[3]
Campaign = Any  # tests/reliability/crash/conftest.py's Campaign (conftest is not importable)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]

WAIT = 180.0
FAST = {
    "UNATTENDED_LEASE_TTL_SECONDS": "6",
    "UNATTENDED_HEARTBEAT_SECONDS": "1",
    "UNATTENDED_WATCHDOG_SECONDS": "0.5",
}
CRASH_EVERY_RUN = {"UNATTENDED_FAILPOINTS": "campaign_start:1"}


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

    def serve(self, **extra: str) -> None:
        done = self.cli("serve", "--detach", "--query-seconds", "0.5", **extra)
        assert done.returncode == 0, done.stderr

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

    def stop(self) -> None:
        self.cli("serve", "--stop")
        wait_until(lambda: not self.runner_alive(), "the runner to stop")

    def runs(self) -> list[dict[str, Any]]:
        body = {
            "flow_runs": {"tags": {"all_": [f"campaign:{self.campaign.name}"]}},
            "sort": "EXPECTED_START_TIME_DESC",
        }
        return list(request(os.environ, "POST", "flow_runs/filter", body))


def wait_until(condition: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def rows(database: Path, sql: str) -> list[tuple[Any, ...]]:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as c:
            return [tuple(r) for r in c.execute(sql)]
    except sqlite3.OperationalError:
        return []


def counted_continuations(campaign: Campaign) -> int:
    found = rows(
        campaign.database,
        "SELECT count(*) FROM campaign_event WHERE kind = 'continued' "
        "AND json_extract(details, '$.counted') = 1",
    )
    return int(found[0][0]) if found else 0


def campaign_row(campaign: Campaign) -> tuple[Any, ...] | None:
    found = rows(campaign.database, "SELECT status, error_code FROM campaign")
    return found[0] if found else None


@pytest.fixture
def login(prefect_server: Any, make_campaign: Callable[..., Campaign]) -> Iterator[LoginNode]:
    node = LoginNode(make_campaign("crash-loop"))
    yield node
    if node.runner_alive():
        node.stop()


def test_a_campaign_crashing_on_every_run_stops_at_its_cap_across_a_runner_restart(
    login: LoginNode,
) -> None:
    campaign = login.campaign
    submitted = login.cli("submit", str(campaign.spec))
    assert submitted.returncode == 0, submitted.stderr
    login.serve(**CRASH_EVERY_RUN)
    wait_until(lambda: counted_continuations(campaign) >= 2, "two continuations")
    login.stop()
    before_restart = counted_continuations(campaign)
    assert before_restart < MAX_CONTINUATIONS

    login.serve(**CRASH_EVERY_RUN)
    wait_until(lambda: campaign_row(campaign) == ("failed", EXHAUSTED_CODE), "the cap")
    assert counted_continuations(campaign) == MAX_CONTINUATIONS  # not restarted at 0
    exhausted = rows(
        campaign.database, f"SELECT count(*) FROM campaign_event WHERE kind = '{EXHAUSTED_CODE}'"
    )
    assert exhausted == [(1,)]

    # Nothing more is started, however many sweeps pass.
    runs = len(login.runs())
    time.sleep(3.0)  # six watchdog sweeps
    assert len(login.runs()) == runs
    assert all(r["state"]["type"] not in {"RUNNING", "PENDING", "SCHEDULED"} for r in login.runs())

    shown = login.cli("status")
    assert f"stopped ({EXHAUSTED_CODE})" in shown.stdout, shown.stdout
    assert "continues it within" not in shown.stdout
    print(
        f"continuation cap: {runs} runs, {MAX_CONTINUATIONS} counted continuations "
        f"({before_restart} before the runner's restart)"
    )
