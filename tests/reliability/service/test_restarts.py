"""Restart the Prefect server and the runner under a campaign; nothing is lost or run twice.

Each test starts its OWN server (it restarts it; the session's server is left
alone) and runs ``unattended serve`` as a real process. The order of a restart
is the documented one: stop the runner, then the server; start the server, then
a runner. The simulation is a small script that logs every execution, so a
batch launched twice would show up as extra executions.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from service_helpers import demo_copy, sqlite_rows  # type: ignore[import-not-found]

from flows._prefect._rest import request
from flows._prefect._server import ServerConfig, ServerHandle, client_env, start_server, stop_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]

SIMULATION = """
import json, os, sys, time
payload = json.load(sys.stdin)
x = payload["x"] if isinstance(payload, dict) else payload
with open(os.environ["SIM_LOG"], "a") as out:
    out.write(json.dumps(x) + "\\n")
time.sleep(float(os.environ.get("SIM_SLEEP", "0")))
print(json.dumps({"value": sum((v - 0.6) ** 2 for v in x)}))
"""


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _refresh() -> None:
    import prefect.context

    prefect.context.refresh_global_settings_context()


class Stack:
    """An own Prefect server and an ``unattended serve`` process, restartable."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.home = folder / "home"
        self.config = ServerConfig(port=_free_port(), state_dir=folder / "server")
        self.handle: ServerHandle | None = None
        self.runner: subprocess.Popen[bytes] | None = None
        self.extra_env: dict[str, str] = {}
        self.runner_starts = 0

    def start_server(self) -> ServerHandle:
        self.handle = start_server(self.config, timeout=180)
        os.environ.update(client_env(self.handle))
        _refresh()
        return self.handle

    def stop_server(self) -> None:
        stop_server(self.config)

    def start_runner(self) -> None:
        assert self.handle is not None
        env = dict(os.environ) | client_env(self.handle) | self.extra_env
        env["UNATTENDED_HOME"] = str(self.home)
        self.runner_starts += 1
        with (self.folder / f"runner-{self.runner_starts}.log").open("wb") as log:
            self.runner = subprocess.Popen(
                [sys.executable, "-m", "flows._cli", "serve", "--query-seconds", "0.5"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop_runner(self) -> None:
        if self.runner is None:
            return
        os.killpg(self.runner.pid, signal.SIGTERM)
        try:
            self.runner.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.runner.pid, signal.SIGKILL)
            self.runner.wait(timeout=30)
        self.runner = None

    def restart(self) -> None:
        """Stop the runner, then the server; start the server, then a new runner."""
        self.stop_runner()
        self.stop_server()
        self.start_server()
        self.start_runner()

    def run(self, flow_run_id: Any) -> dict[str, Any]:
        assert self.handle is not None
        return dict(request(client_env(self.handle), "GET", f"flow_runs/{flow_run_id}"))

    def wait_for(self, flow_run_id: Any, states: set[str], timeout: float = 180) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.run(flow_run_id)
            if run["state"]["type"] in states:
                return run
            if run["state"]["type"] in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}:
                raise AssertionError(f"flow run ended {run['state']}")
            time.sleep(0.5)
        raise AssertionError(f"flow run {flow_run_id} not in {states} within {timeout} s")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    keys = (
        "PREFECT_API_URL",
        "PREFECT_API_AUTH_STRING",
        "PREFECT_API_SSL_CERT_FILE",  # the server's certificate, pinned
        "PREFECT_API_TLS_INSECURE_SKIP_VERIFY",
        "PREFECT_UI_URL",
        "PREFECT_HOME",
        "PREFECT_LOCAL_STORAGE_PATH",
        "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE",
        "PREFECT_SERVER_ANALYTICS_ENABLED",
        "DO_NOT_TRACK",
    )
    saved = {key: os.environ.get(key) for key in keys}
    stack = Stack(tmp_path)
    (tmp_path / "sim.py").write_text(SIMULATION)
    stack.extra_env = {"SIM_LOG": str(tmp_path / "executions.jsonl")}
    os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(tmp_path / "results")
    stack.start_server()
    try:
        yield stack
    finally:
        stack.stop_runner()
        stack.stop_server()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _refresh()


def _spec(stack: Stack, demo: str, name: str, rounds: int, sleep: float) -> Path:
    stack.extra_env["SIM_SLEEP"] = str(sleep)
    argv = json.dumps([sys.executable, str(stack.folder / "sim.py")])
    return demo_copy(
        stack.folder / "spec",
        demo,
        name,
        rounds=str(rounds),
        batch_size="4",
        objective__simulation=argv,
        objective__verifier_limit="",  # no verifier: only batches run the script
        planner__kind='"surrogate"',  # the transcript's batches have 8 candidates
        planner__transcript="",  # the surrogate takes no transcript
    )


def _submit(spec: Path, home: Path) -> Any:
    from flows._prefect._deployment import submit_campaign

    return asyncio.run(submit_campaign(spec, state_dir=home))


def _complete_provenance(database: Path, rounds: int, batch: int) -> None:
    """Every round is checkpointed with one batch whose every task has one result."""
    status = sqlite_rows(database, "SELECT status FROM campaign")
    assert status == [("completed",)]
    per_round = sqlite_rows(
        database,
        "SELECT b.round_index, COUNT(DISTINCT b.key), COUNT(t.id) FROM batch b "
        "JOIN task_result t ON t.batch_id = b.id GROUP BY b.round_index ORDER BY b.round_index",
    )
    assert per_round == [(r, 1, batch) for r in range(rounds)]
    attempts = sqlite_rows(
        database, "SELECT COUNT(*) FROM attempt WHERE rejected_by IS NULL AND reason IS NOT NULL"
    )
    assert attempts == [(0,)]


def _launched(database: Path, *, round_index: int) -> bool:
    try:
        query = "SELECT COUNT(*) FROM batch WHERE round_index = ?"
        return sqlite_rows(database, query, round_index) == [(1,)]
    except sqlite3.OperationalError:
        return False  # the file exists before its schema does


def _wait_flow_run_process_gone(database: Path, timeout: float = 60) -> None:
    """Return once the process holding the campaign's lease (the flow run's) has exited."""
    from flows._provenance._rows import process_gone

    (host, pid) = sqlite_rows(database, "SELECT host, pid FROM campaign_lease")[0]
    deadline = time.monotonic() + timeout
    while not process_gone(host, int(pid)):
        assert time.monotonic() < deadline, f"flow-run process {pid} still runs"
        time.sleep(0.1)


def _executions(stack: Stack) -> Counter[str]:
    path = stack.folder / "executions.jsonl"
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def _continued(stack: Stack, cancelled: Any, timeout: float = 120) -> str:
    """Return the run the watchdog started after ``cancelled`` (no one resubmits)."""
    assert stack.handle is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = request(
            client_env(stack.handle),
            "POST",
            "flow_runs/filter",
            {"flow_runs": {"tags": {"all_": ["campaign:restart-running"]}}},
        )
        newer = [r["id"] for r in runs if r["id"] != str(cancelled)]
        if newer:
            return str(newer[0])
        time.sleep(0.5)
    raise AssertionError("no run continued the campaign")


class TestRestartWhileSuspended:
    def test_the_approval_survives_and_the_run_completes_without_rerunning_a_batch(
        self, stack: Stack
    ) -> None:
        from flows._prefect._service import approve_run

        spec = _spec(stack, "campaign-approval.toml", "restart-suspended", rounds=3, sleep=0.0)
        submitted = _submit(spec, stack.home)
        stack.start_runner()
        stack.wait_for(submitted.flow_run_id, {"PAUSED"})
        before = _executions(stack)
        # Suspended: the form is on the server; the flow-run process exits after it.
        database = stack.home / "campaigns" / "restart-suspended" / "provenance.db"
        _wait_flow_run_process_gone(database)

        stack.restart()
        asyncio.run(approve_run(submitted.flow_run_id, approver="alice", comment="after restart"))
        stack.stop_runner()
        stack.stop_server()  # and once more between the answer and the resumed run
        stack.start_server()
        stack.start_runner()
        run = stack.wait_for(submitted.flow_run_id, {"COMPLETED", "FAILED", "CRASHED"})

        assert run["state"]["type"] == "COMPLETED", run["state"]["message"]
        _complete_provenance(database, rounds=3, batch=4)
        assert sqlite_rows(database, "SELECT decided_by, decision, comment FROM approval") == [
            ("alice", "approved", "after restart")
        ]
        after = _executions(stack)
        assert sum(before.values()) == 8  # rounds 0 and 1 ran before the suspend
        assert sum(after.values()) == 12  # ... and were not run again; round 2 ran once


class TestRestartWhileRunning:
    def test_the_next_runner_continues_the_cancelled_run_from_the_checkpoint(
        self, stack: Stack
    ) -> None:
        spec = _spec(stack, "campaign.toml", "restart-running", rounds=3, sleep=1.5)
        submitted = _submit(spec, stack.home)
        stack.start_runner()
        database = stack.home / "campaigns" / "restart-running" / "provenance.db"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # round 1's batch is on the allocation
            if _launched(database, round_index=1):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("round 1's batch never launched")
        assert stack.run(submitted.flow_run_id)["state"]["type"] == "RUNNING"

        stack.restart()
        # A runner that stops ends the runs it was executing: Cancelled ("Runner is
        # shutting down.") on Prefect's own start path, Crashed when the run was
        # forked warm and saw the group's SIGTERM first. The watchdog continues both.
        stopped = stack.run(submitted.flow_run_id)["state"]
        assert stopped["type"] in {"CANCELLED", "CRASHED"}, stopped
        # ... and the next runner's watchdog starts a new run that continues the campaign.
        again = _continued(stack, submitted.flow_run_id)
        run = stack.wait_for(again, {"COMPLETED", "FAILED", "CRASHED"})

        assert run["state"]["type"] == "COMPLETED", run["state"]["message"]
        _complete_provenance(database, rounds=3, batch=4)
        executions = _executions(stack)
        round0 = sqlite_rows(
            database,
            "SELECT t.candidate FROM task_result t JOIN batch b ON b.id = t.batch_id "
            "WHERE b.round_index = 0",
        )
        for (candidate,) in round0:  # finished before the restart: never run again
            assert executions[json.dumps(json.loads(candidate))] == 1
