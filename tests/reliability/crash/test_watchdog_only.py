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

import contextlib
import fcntl
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from flows._prefect._rest import request
from flows._provenance._lease import process_gone

PROJECT = Path(__file__).resolve().parents[3]
Campaign = Any  # conftest.py's Campaign (conftest is not importable)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]

WAIT = 150.0
# Short waits, as in test_recovery.py: the defaults are 60 s, 10 s and 2 s.
FAST = {
    "UNATTENDED_LEASE_TTL_SECONDS": "6",
    "UNATTENDED_HEARTBEAT_SECONDS": "1",
    "UNATTENDED_WATCHDOG_SECONDS": "0.5",
}
SLOW_SIMULATION = """\
import os, runpy, sys, time
time.sleep(float(os.environ.get("SIM_SLEEP", "0")))
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


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
        return []  # the file exists before its schema does


class Operator:
    """The user's shell: submits once, starts the runner once, then only watches."""

    def __init__(self, campaign: Campaign) -> None:
        self.campaign = campaign
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("UNATTENDED_")}
        self.env |= {"UNATTENDED_HOME": str(campaign.home), **FAST}

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flows._cli", *args],
            cwd=PROJECT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def runner_pid(self) -> int | None:
        lock = self.campaign.home / "runner.lock"
        if not lock.exists():
            return None
        with lock.open() as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return int(lock.read_text())
        return None

    def runs(self) -> list[dict[str, Any]]:
        body = {
            "flow_runs": {"tags": {"all_": [f"campaign:{self.campaign.name}"]}},
            "sort": "EXPECTED_START_TIME_DESC",
        }
        return list(request(os.environ, "POST", "flow_runs/filter", body))


@pytest.fixture
def operator(prefect_server: Any, make_campaign: Callable[..., Campaign]) -> Iterator[Operator]:
    login = Operator(make_campaign("watchdog-only"))
    try:
        yield login
    finally:
        if login.runner_pid() is not None:
            login.cli("serve", "--stop")


def _slow(campaign: Campaign, seconds: float) -> dict[str, str]:
    """Make each simulation take ``seconds`` (a wrapper in front of the logging one)."""
    wrapper = campaign.folder / "slow_simulation.py"
    wrapper.write_text(SLOW_SIMULATION)
    quoted = json.dumps(str(PROJECT / "tests" / "reliability" / "crash" / "simulation.py"))
    text = campaign.spec.read_text()
    campaign.spec.write_text(text.replace(quoted, f"{json.dumps(str(wrapper))}, {quoted}"))
    return {"SIM_SLEEP": str(seconds)}


def test_a_killed_flow_run_process_is_continued_by_the_watchdog_alone(
    operator: Operator, model_server: Any, reference: Any
) -> None:
    campaign = operator.campaign
    operator.env |= _slow(campaign, 0.5)
    submitted = operator.cli("submit", str(campaign.spec))
    assert submitted.returncode == 0, submitted.stderr
    served = operator.cli("serve", "--detach", "--query-seconds", "0.5")
    assert served.returncode == 0, served.stderr
    runner = operator.runner_pid()
    assert runner is not None

    wait_until(
        lambda: rows(campaign.database, "SELECT 1 FROM batch WHERE round_index = 1"),
        "round 1's batch on the allocation",
    )
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

    def completed() -> bool:
        status = rows(campaign.database, "SELECT status FROM campaign")
        return status == [("completed",)] and any(
            run["state"]["type"] == "COMPLETED" for run in operator.runs()
        )

    wait_until(completed, "the campaign to complete")
    assert operator.runner_pid() == runner  # the same runner throughout
    killed = next(run for run in operator.runs() if run["id"] == owner)
    assert killed["state"]["type"] == "CRASHED", killed["state"]
    kinds = {k for (k,) in rows(campaign.database, "SELECT kind FROM campaign_event")}
    assert "continued" in kinds

    record, inferences, executions = reference
    got = campaign.record()
    assert got.attempts == record.attempts
    assert got.decisions == record.decisions
    assert got.gate_calls == record.gate_calls
    assert got.batches == record.batches
    assert got.task_results == record.task_results
    assert model_server.requests == inferences  # no model answer asked twice
    ran = campaign.executions()
    # Round 0 finished before the kill and round 2 ran once after it; of round 1's
    # batch, only the tasks without a recorded result ran again (at most the batch).
    assert ran[0] == executions[0]
    assert ran[2] == executions[2]
    assert executions[1] <= ran[1] <= 2 * executions[1]
