"""Time to recover, with the default settings, after a runner SIGKILL and after ``serve --stop``.

    python benchmarks/recovery_times.py [--repeat N]

Starts its own Prefect server on 127.0.0.1, copies the demo campaign (simulations
slowed to 1 s so a round lasts a while) into a temporary folder and, through the
real command line:

1. ``kill``: arms a failpoint that SIGKILLs the whole runner tree in the middle of
   round 1's batch, then runs ``unattended serve --detach`` again and measures the
   time from its return to a new flow run of the campaign being *Running*;
2. ``stop``: ``unattended serve --stop`` while round 1's batch runs, then
   ``unattended serve --detach`` again, measured the same way.

Both campaigns then run to completion and their status is checked. Nothing in the
environment shortens the lease, heartbeat or watchdog: these are the defaults.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flows._prefect._rest import request
from flows._prefect._server import ServerConfig, client_env, start_server, stop_server

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Node:
    def __init__(self, folder: Path, name: str, env: dict[str, str]) -> None:
        self.folder = folder / name
        shutil.copytree(ROOT / "examples" / "demo", self.folder)
        spec = self.folder / "campaign.toml"
        text = spec.read_text().replace('name = "demo"', f'name = "{name}"')
        spec.write_text(text.replace("simulation_cost = 0.0", "simulation_cost = 1.0"))
        self.spec, self.name = spec, name
        self.home = self.folder / "home"
        self.env = env | {"UNATTENDED_HOME": str(self.home)}
        self.api = env["PREFECT_API_URL"]

    def cli(self, *args: str, **extra: str) -> None:
        subprocess.run(
            [sys.executable, "-m", "flows._cli", *args],
            env=self.env | extra,
            check=True,
            capture_output=True,
            timeout=300,
        )

    def runs(self) -> list[dict[str, Any]]:
        body = {"flow_runs": {"tags": {"all_": [f"campaign:{self.name}"]}}}
        # The project's REST client: the server's secret and its pinned certificate.
        return list(request(self.env, "POST", "flow_runs/filter", body))

    def batch_of_round(self, index: int) -> bool:
        database = self.home / "campaigns" / self.name / "provenance.db"
        try:
            with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as c:
                return bool(
                    c.execute("SELECT 1 FROM batch WHERE round_index=?", (index,)).fetchall()
                )
        except sqlite3.OperationalError:
            return False

    def status(self) -> str | None:
        database = self.home / "campaigns" / self.name / "provenance.db"
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as c:
            row = c.execute("SELECT status FROM campaign").fetchone()
        return row[0] if row else None

    def runner_gone(self) -> bool:
        import fcntl

        with (self.home / "runner.lock").open() as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
        return True


def _until(condition: Any, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.1)


def _recover(node: Node) -> tuple[float, float]:
    """Start a runner; return seconds until a new run exists, and until it is Running."""
    old = {run["id"] for run in node.runs()}
    node.cli("serve", "--detach")
    back = time.monotonic()
    _until(lambda: any(r["id"] not in old for r in node.runs()))
    created = time.monotonic() - back
    _until(lambda: any(r["id"] not in old and r["state"]["type"] == "RUNNING" for r in node.runs()))
    return created, time.monotonic() - back


def measure(folder: Path, env: dict[str, str], label: str) -> None:
    kill = Node(folder, f"kill-{label}", env)
    kill.cli("submit", str(kill.spec))
    kill.cli(
        "serve",
        "--detach",
        UNATTENDED_FAILPOINTS="mid_batch:12",  # round 1's fourth task
        UNATTENDED_FAILPOINT_SCOPE="runner",
    )
    _until(kill.runner_gone)
    created, after_kill = _recover(kill)
    print(
        f"{label}: after SIGKILL of the runner tree: new run {created:.1f} s, "
        f"Running again {after_kill:.1f} s",
        flush=True,
    )
    _until(lambda: kill.status() == "completed")
    kill.cli("serve", "--stop")

    stop = Node(folder, f"stop-{label}", env)
    stop.cli("submit", str(stop.spec))
    stop.cli("serve", "--detach")
    _until(lambda: stop.batch_of_round(1))
    stop.cli("serve", "--stop")
    created, after_stop = _recover(stop)
    print(
        f"{label}: after serve --stop: new run {created:.1f} s, Running again {after_stop:.1f} s",
        flush=True,
    )
    _until(lambda: stop.status() == "completed")
    stop.cli("serve", "--stop")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="recovery-times-"))
    config = ServerConfig(port=_port(), state_dir=folder / "server")
    handle = start_server(config, timeout=180)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "UNATTENDED_"))}
    env |= client_env(handle)
    try:
        for attempt in range(args.repeat):
            measure(folder, env, str(attempt))
    finally:
        stop_server(config)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
