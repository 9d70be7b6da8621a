"""The allocation budget is the campaign's on a real Slurm: it holds across crashed runs.

The site's prologue fails (``exit 3``: a ``module load`` on a machine without
modules), so no worker ever starts, and every run of the campaign is SIGKILLed by
a failpoint once its first allocation is requested and its first round has begun
(``after_fallback_recorded``), as a process that dies with its allocation pending
would. Each run is a new process (``python -m flows._cli._direct``): before the
budget was the campaign's, each started counting at zero and asked for another
job every time. With ``max_allocations = 2`` the third run asks for nothing and
stops ``blocked`` with ``budget_exceeded``, and its ``blocked`` notice reaches the
campaign's webhook (a receiver on 127.0.0.1).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from private_slurm import SlurmCluster  # type: ignore[import-not-found]

from flows._prefect._server import ServerHandle, client_env
from tasks import load_site

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "demo"
NAME = "budget-crash"


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A webhook receiver on 127.0.0.1: its URL and the JSON bodies it was sent."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            received.append(json.loads(self.rfile.read(length)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook", received
    finally:
        server.shutdown()
        server.server_close()


def _campaign(tmp_path: Path, webhook_url: str) -> Path:
    for item in EXAMPLES.iterdir():
        shutil.copy(item, tmp_path / item.name)
    spec = tmp_path / "campaign.toml"
    text = spec.read_text()
    assert 'name = "demo"' in text
    text = text.replace('name = "demo"', f'name = "{NAME}"')
    spec.write_text(f'{text}\n[notify]\nwebhook_url = "{webhook_url}"\nevents = ["blocked"]\n')
    return spec


FAILING_PROLOGUE = ["echo 'module: command not found' >&2", "exit 3"]


def _site(tmp_path: Path, prologue: list[str] = FAILING_PROLOGUE) -> Path:
    data = load_site("slurm-local", env={}).model_dump(mode="json", exclude_none=True)
    data.pop("secrets", None)
    data["scheduler"].update(max_allocations=2, prologue=prologue)
    path = tmp_path / "slurm-site.toml"
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path


def _run(slurm: SlurmCluster, tmp_path: Path, spec: Path, site: Path, **extra: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNATTENDED_")}
    env |= {**slurm.env, **extra}
    argv = [sys.executable, "-m", "flows._cli._direct", str(spec), "--site", str(site)]
    return subprocess.run(
        [*argv, "--state-dir", str(tmp_path / "home")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_crashing_prologue_stops_at_max_allocations_counted_across_restarts(
    slurm: SlurmCluster, tmp_path: Path, webhook: tuple[str, list[dict[str, Any]]]
) -> None:
    url, notices = webhook
    spec, site = _campaign(tmp_path, url), _site(tmp_path)
    for _ in range(2):
        crashed = _run(slurm, tmp_path, spec, site, UNATTENDED_FAILPOINTS="after_fallback_recorded")
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]

    stopped = _run(slurm, tmp_path, spec, site)
    result = json.loads(stopped.stdout.strip().splitlines()[-1])
    assert (result["status"], result["error_code"]) == ("blocked", "budget_exceeded"), result
    assert "2 of scheduler.max_allocations=2" in result["message"]

    database = tmp_path / "home" / "campaigns" / NAME / "provenance.db"
    with sqlite3.connect(database) as connection:
        jobs = connection.execute(
            "SELECT request, job_id FROM allocation ORDER BY request"
        ).fetchall()
        status = connection.execute("SELECT status, error_code FROM campaign").fetchone()
    assert [request for request, _ in jobs] == [1, 2]  # numbered for the campaign
    assert len({job for _, job in jobs}) == 2  # two sbatch in all, none by the third run
    assert status == ("blocked", "budget_exceeded")
    with sqlite3.connect(database) as connection:
        ends = connection.execute("SELECT end_reason FROM allocation").fetchall()
    # Ended by the next run: as Slurm says (the prologue failed), or cancelled if not yet.
    assert {reason for (reason,) in ends} <= {"failed", "released"}, ends
    (notice,) = notices
    assert f"campaign {NAME} was blocked" in notice["text"]
    assert "(budget_exceeded)" in notice["text"]


def test_jobs_a_killed_run_left_running_are_cancelled_by_the_next_run(
    slurm: SlurmCluster, tmp_path: Path, webhook: tuple[str, list[dict[str, Any]]]
) -> None:
    """The workers of a dead run serve nobody: the next run cancels their job and records it."""
    spec, site = _campaign(tmp_path, webhook[0]), _site(tmp_path, ["export OMP_NUM_THREADS=1"])
    for _ in range(2):
        crashed = _run(slurm, tmp_path, spec, site, UNATTENDED_FAILPOINTS="after_fallback_recorded")
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    stopped = _run(slurm, tmp_path, spec, site)
    assert json.loads(stopped.stdout.strip().splitlines()[-1])["error_code"] == "budget_exceeded"

    database = tmp_path / "home" / "campaigns" / NAME / "provenance.db"
    with sqlite3.connect(database) as connection:
        jobs = connection.execute(
            "SELECT job_id, state, end_reason, ended_at FROM allocation ORDER BY request"
        ).fetchall()
    assert [(state, reason) for _, state, reason, _ in jobs] == [("RELEASED", "released")] * 2
    assert all(ended_at is not None for *_, ended_at in jobs)
    live = slurm.run(["squeue", "-h", "-t", "all", "-j", ",".join(j for j, *_ in jobs), "-o", "%T"])
    assert set(live.stdout.split()) <= {"CANCELLED"}, live.stdout


def _cli(env: dict[str, str], tmp_path: Path, *args: str) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "flows._cli", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _campaign_status(database: Path) -> tuple[Any, ...] | None:
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
            return connection.execute("SELECT status, error_code FROM campaign").fetchone()
    except sqlite3.OperationalError:
        return None


@pytest.mark.long  # the budget across restarts is in the default run: the direct runner's above
@pytest.mark.timeout(400)
def test_through_the_runner_a_crashing_campaign_stops_at_its_budget_across_a_restart(
    prefect_server: ServerHandle,
    slurm: SlurmCluster,
    tmp_path: Path,
    webhook: tuple[str, list[dict[str, Any]]],
) -> None:
    """``submit`` + ``serve``: the watchdog continues crashed runs, the budget stops them."""
    spec, site = _campaign(tmp_path, webhook[0]), _site(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNATTENDED_")}
    env |= {**slurm.env, **client_env(prefect_server)}
    env |= {
        "UNATTENDED_HOME": str(tmp_path / "home"),
        "PREFECT_LOCAL_STORAGE_PATH": str(tmp_path / "prefect-results"),
        "UNATTENDED_LEASE_TTL_SECONDS": "6",
        "UNATTENDED_HEARTBEAT_SECONDS": "1",
        "UNATTENDED_WATCHDOG_SECONDS": "0.5",
    }
    crash = env | {"UNATTENDED_FAILPOINTS": "after_fallback_recorded"}
    database = tmp_path / "home" / "campaigns" / NAME / "provenance.db"

    def jobs() -> int:
        try:
            with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
                return int(connection.execute("SELECT count(*) FROM allocation").fetchone()[0])
        except sqlite3.OperationalError:
            return 0

    def wait(condition: Any, what: str) -> None:
        deadline = time.monotonic() + 240.0
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.5)

    try:
        submitted = _cli(env, tmp_path, "submit", str(spec), "--site", str(site))
        assert submitted.returncode == 0, submitted.stderr[-3000:]
        served = _cli(crash, tmp_path, "serve", "--detach", "--query-seconds", "0.5")
        assert served.returncode == 0, served.stderr[-3000:]
        wait(lambda: jobs() >= 1, "the first allocation")
        assert _cli(env, tmp_path, "serve", "--stop").returncode == 0  # a runner restart
        served = _cli(crash, tmp_path, "serve", "--detach", "--query-seconds", "0.5")
        assert served.returncode == 0, served.stderr[-3000:]
        wait(lambda: _campaign_status(database) == ("blocked", "budget_exceeded"), "the budget")
    finally:
        _cli(env, tmp_path, "serve", "--stop")
    assert jobs() == 2  # max_allocations, whatever the runners and runs in between
    (notice,) = webhook[1]
    assert "(budget_exceeded)" in notice["text"]
