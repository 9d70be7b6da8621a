"""The crash tests' login node: the real CLI against the session's Prefect server.

Shared by the tests that drive a campaign through ``unattended submit|serve|cancel``
and kill things from outside (``test_recovery``, ``test_cancel``,
``test_watchdog_only``, ``test_continuation_cap``, ``test_run_failure``). The crash
suite's ``conftest.py`` puts this folder on ``sys.path`` (importlib mode) and builds
the campaigns; ``login_nodes`` there hands out a ``LoginNode`` and stops its runner
at the end of the test.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from flows._prefect._rest import request

PROJECT = Path(__file__).resolve().parents[3]
SIMULATION = Path(__file__).resolve().parent / "simulation.py"
# conftest.py's Campaign or DemoCampaign (a conftest is not importable).
Campaign = Any

WAIT = 180.0
CLI_TIMEOUT = 180.0
# Short waits for the tests: the defaults are 60 s, 10 s, 2 s, 6 tries and 1 s.
FAST = {
    "UNATTENDED_LEASE_TTL_SECONDS": "6",
    "UNATTENDED_HEARTBEAT_SECONDS": "1",
    "UNATTENDED_WATCHDOG_SECONDS": "0.5",
    "UNATTENDED_STORAGE_RETRIES": "3",
    "UNATTENDED_STORAGE_BACKOFF_SECONDS": "0.2",
}
SLOW_SIMULATION = """\
import os, runpy, sys, time
time.sleep(float(os.environ.get("SIM_SLEEP", "0")))
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def wait_until(condition: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Return ``condition()``'s first true value; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def rows(database: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Read ``sql``'s rows from a provenance database; none while it has no schema yet."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as c:
            return [tuple(r) for r in c.execute(sql, args)]
    except sqlite3.OperationalError:
        return []  # the file exists before its schema does


def status(campaign: Campaign) -> str | None:
    """Return the campaign's recorded status."""
    found = rows(campaign.database, "SELECT status FROM campaign")
    return found[0][0] if found else None


def campaign_row(campaign: Campaign) -> tuple[Any, ...] | None:
    """Return the campaign's recorded (status, error_code)."""
    found = rows(campaign.database, "SELECT status, error_code FROM campaign")
    return found[0] if found else None


def events(campaign: Campaign) -> list[str]:
    """Return the kinds of the campaign's recorded events, in order."""
    return [k for (k,) in rows(campaign.database, "SELECT kind FROM campaign_event ORDER BY id")]


def batch_launched(campaign: Campaign, round_index: int) -> bool:
    """Return whether the round's batch was recorded launched."""
    return bool(rows(campaign.database, "SELECT 1 FROM batch WHERE round_index = ?", round_index))


def slow(campaign: Campaign, seconds: float) -> dict[str, str]:
    """Make each simulation take ``seconds`` (a wrapper in front of the logging one).

    Returns the environment the runner needs for it (``SIM_SLEEP``).
    """
    wrapper = campaign.folder / "slow_simulation.py"
    wrapper.write_text(SLOW_SIMULATION)
    quoted = json.dumps(str(SIMULATION))
    text = campaign.spec.read_text()
    campaign.spec.write_text(text.replace(quoted, f"{json.dumps(str(wrapper))}, {quoted}"))
    return {"SIM_SLEEP": str(seconds)}


def assert_same_record(campaign: Campaign, reference: Any, server: Any) -> None:
    """The campaign completed with an uncrashed run's record and no answer asked twice."""
    record, inferences, _executions = reference
    got = campaign.record()
    assert got.status == "completed"
    assert got.attempts == record.attempts
    assert got.decisions == record.decisions
    assert got.gate_calls == record.gate_calls
    assert got.batches == record.batches
    assert got.task_results == record.task_results
    assert server.requests == inferences  # no model answer asked twice


def assert_like_reference(
    campaign: Campaign, reference: Any, server: Any, *, rerun: Counter[int] | None = None
) -> None:
    """``assert_same_record``, and exactly the simulations of ``rerun`` ran again."""
    assert_same_record(campaign, reference, server)
    _record, _inferences, executions = reference
    assert campaign.executions() == executions + (rerun or Counter())


class LoginNode:
    """The user's shell: the real CLI, with the campaign's state directory and short waits."""

    def __init__(self, campaign: Campaign, **extra: str) -> None:
        self.campaign = campaign
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("UNATTENDED_")}
        self.env |= {"UNATTENDED_HOME": str(campaign.home), **FAST, **extra}

    def cli(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        """Run ``unattended ARGS`` with this node's environment (and ``extra``)."""
        return subprocess.run(
            [sys.executable, "-m", "flows._cli", *args],
            cwd=PROJECT,
            env=self.env | extra,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            check=False,
        )

    def submit(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.cli("submit", str(self.campaign.spec), *extra)

    def serve(self, query_seconds: float = 0.5, **extra: str) -> float:
        """Start ``unattended serve --detach``; return when it returned (monotonic)."""
        done = self.cli("serve", "--detach", "--query-seconds", str(query_seconds), **extra)
        assert done.returncode == 0, done.stderr
        return time.monotonic()

    def runner_pid(self) -> int | None:
        """Return the pid of the runner serving this state directory, if one does."""
        lock = self.campaign.home / "runner.lock"
        if not lock.exists():
            return None
        with lock.open() as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return int(lock.read_text())
        return None

    def runner_alive(self) -> bool:
        return self.runner_pid() is not None

    def wait_runner_gone(self) -> None:
        wait_until(lambda: not self.runner_alive(), "the runner to die")

    def kill_runner_tree(self) -> None:
        """SIGKILL the runner and the flow-run processes under it, as a lost session does."""
        root = psutil.Process(int((self.campaign.home / "runner.lock").read_text()))
        family = [root, *root.children(recursive=True)]
        for process in family:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(family, timeout=30)
        self.wait_runner_gone()

    def stop(self) -> None:
        """``unattended serve --stop``, and wait for the runner to be gone."""
        self.cli("serve", "--stop")
        self.wait_runner_gone()

    def runs(self) -> list[dict[str, Any]]:
        """Return the campaign's flow runs, newest first."""
        body = {
            "flow_runs": {"tags": {"all_": [f"campaign:{self.campaign.name}"]}},
            "sort": "EXPECTED_START_TIME_DESC",
        }
        return list(request(os.environ, "POST", "flow_runs/filter", body))

    def state_of(self, run_id: str) -> str:
        return str(request(os.environ, "GET", f"flow_runs/{run_id}")["state"]["type"])

    def completes(self) -> None:
        """Wait for the campaign to be recorded completed and a run of it Completed."""

        def done() -> bool:
            finished = any(run["state"]["type"] == "COMPLETED" for run in self.runs())
            return status(self.campaign) == "completed" and finished

        wait_until(done, "the campaign to complete")
