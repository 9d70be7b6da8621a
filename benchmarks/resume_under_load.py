"""Does a UI Resume answer while campaigns run? The embedded SQLite server, and PostgreSQL.

Measured side by side, one fresh embedded server (SQLite, ``start_server``) per side
and repetition, the sides alternating:

* ``no-retry``: ``ours`` with the server's retry of busy answers off
  (``UNATTENDED_SERVER_BUSY_RETRY_SECONDS=0``): every 503 reaches the UI;
* ``plain-retry``: ``ours`` with a person's answer run again like any request
  (``UNATTENDED_SERVER_ANSWER_RETRY_SECONDS=0``: up to 3 s, nothing held back);
* ``ours``: what ``unattended server start`` runs (``UNUSED_SERVICES`` off, a 503 run
  again in the server for up to 3 s, a person's answer for up to 30 s with the floor to
  itself);
* ``all`` (with ``--all-services``): ``ours`` with every Prefect server service on;
* ``postgres`` (with ``--postgres URL``): ``ours`` on PostgreSQL, a fresh database
  per repetition on the server at ``URL`` (created and dropped here), as
  ``unattended server start --database-url`` runs it.

On each, one ``unattended serve`` runner with default settings runs 4 demo
campaigns (surrogate planner, R rounds x 8 candidates, each simulation sleeping
``--sim-seconds``). While they run, N flow runs that wait on an approval form are
resumed one after another through the call the UI's Resume button makes:
``POST /api/flow_runs/{id}/resume`` with the form's input, once, no retry. Those
runs are made paused with a run-input schema through the API (no process behind
them: only the resume is measured). Counted: answers that are not ``ACCEPT``
(HTTP 503 "database is locked", or a refusal), and the resume's latency.

    python benchmarks/resume_under_load.py [--resumes N] [--reps R] [--rounds R]
        [--all-services] [--postgres postgresql://postgres@127.0.0.1:5432/postgres]

Printed: per side, refused / tried, latency median, p95 and max, campaigns completed,
and the load average at the start and the end. The runners are stopped (by PID)
before their servers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
SIDES = ("no-retry", "plain-retry", "ours")
CAMPAIGNS = 4
FORM_SCHEMA = {
    "title": "Approval",
    "type": "object",
    "properties": {
        "approver": {"type": "string", "title": "Approver"},
        "decision": {"type": "string", "enum": ["approve", "reject"], "default": "approve"},
    },
    "required": ["approver"],
}


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_campaign(folder: Path, name: str, rounds: int, sim_seconds: float) -> Path:
    """Copy the demo as campaign ``name``: surrogate planner, ``rounds`` rounds, slow sims."""
    folder.mkdir(parents=True)
    for item in (ROOT / "examples" / "demo").iterdir():
        if item.is_file():
            shutil.copy(item, folder / item.name)
    spec = folder / "campaign.toml"
    text = spec.read_text()
    for old, new in {
        'name = "demo"': f'name = "{name}"',
        "rounds = 4": f"rounds = {rounds}",
        "simulation_cost = 0.0": f"simulation_cost = {sim_seconds}",
        'kind = "scripted"': 'kind = "surrogate"',
        'transcript = "transcript.jsonl"': "",
    }.items():
        assert old in text, old
        text = text.replace(old, new)
    spec.write_text(text)
    return spec


def setup_call(client: httpx.Client, path: str, body: Any) -> Any:
    """POST for the set-up (not measured), asked again while the server answers 503."""
    for _ in range(20):
        answer = client.post(path, json=body)
        if answer.status_code < 500:
            answer.raise_for_status()
            return answer.json()
        time.sleep(0.5)
    answer.raise_for_status()
    return None


def paused_runs(client: httpx.Client, count: int) -> list[str]:
    """Create ``count`` flow runs paused on an approval form; return their ids."""
    flow = setup_call(client, "flows/", {"name": "bench-resume"})
    ids = []
    for _ in range(count):
        run = setup_call(client, "flow_runs/", {"flow_id": flow["id"]})
        key = f"bench-{uuid.uuid4().hex[:8]}"
        keyset = {k: f"{key}-{k}" for k in ("description", "response", "schema")}
        setup_call(
            client,
            f"flow_runs/{run['id']}/input",
            {"key": keyset["schema"], "value": json.dumps(FORM_SCHEMA)},
        )
        for state in (
            {"type": "RUNNING", "name": "Running"},
            {
                "type": "PAUSED",
                "name": "Paused",
                "state_details": {
                    "pause_reschedule": False,
                    "pause_key": key,
                    "run_input_keyset": keyset,
                },
            },
        ):
            setup_call(client, f"flow_runs/{run['id']}/set_state", {"state": state, "force": True})
        ids.append(run["id"])
    return ids


def fresh_database(admin_url: str) -> tuple[str, str]:
    """Create an empty database on ``admin_url``'s server; return its name and asyncpg URL."""
    import psycopg

    name = f"bench_resume_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://", 1)
    return name, f"{base}/{name}"


def drop_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def one_side(folder: Path, side: str, args: argparse.Namespace) -> dict[str, Any]:
    if side != "postgres":
        return measure_side(folder, side, args, None)
    name, url = fresh_database(args.postgres)
    try:
        return measure_side(folder, side, args, url)
    finally:
        drop_database(args.postgres, name)


def measure_side(
    folder: Path, side: str, args: argparse.Namespace, database_url: str | None
) -> dict[str, Any]:
    from flows._prefect._server import ServerConfig, client_env, start_server, stop_server
    from flows._prefect._server_env import UNUSED_SERVICES

    base = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    if side == "all":
        base |= dict.fromkeys(UNUSED_SERVICES, "true")
    if side == "no-retry":
        base["UNATTENDED_SERVER_BUSY_RETRY_SECONDS"] = "0"
    if side == "plain-retry":
        base["UNATTENDED_SERVER_ANSWER_RETRY_SECONDS"] = "0"
    config = ServerConfig(port=free_port(), state_dir=folder / "server", database_url=database_url)
    handle = start_server(config, timeout=180, base_env=base)
    env = base | client_env(handle) | {"UNATTENDED_HOME": str(folder / "home")}
    runner = None
    try:
        with (folder / "runner.log").open("wb") as log:
            runner = subprocess.Popen(
                [sys.executable, "-m", "flows._cli", "serve"],
                env=env,
                cwd=folder,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        auth = handle.basic_auth
        with httpx.Client(
            base_url=handle.api_url + "/", auth=auth, timeout=60, verify=handle.verify()
        ) as client:
            waiting = paused_runs(client, args.resumes)
            for n in range(CAMPAIGNS):
                spec = write_campaign(folder / f"c{n}", f"load-{n}", args.rounds, args.sim_seconds)
                done = subprocess.run(
                    [sys.executable, "-m", "flows._cli", "submit", str(spec)],
                    env=env,
                    cwd=folder,
                    capture_output=True,
                    text=True,
                    timeout=180,
                    check=False,
                )
                if done.returncode != 0:
                    raise SystemExit(f"submit failed: {done.stderr[-1000:]}")
            # Resume as soon as campaigns are running (the runner may take them in turn).
            running = wait_running(client, 2, limit=120)
            refused: list[str] = []
            seconds: list[float] = []
            for run_id in waiting:
                start = time.perf_counter()
                answer = client.post(
                    f"flow_runs/{run_id}/resume",
                    json={"run_input": {"approver": "alice", "decision": "approve"}},
                )
                seconds.append(time.perf_counter() - start)
                status = answer.json().get("status") if answer.status_code < 500 else None
                if status != "ACCEPT":
                    refused.append(f"{answer.status_code} {answer.text[:80]}")
                time.sleep(args.gap)
            still = wait_running(client, 0, limit=0)
            completed = count_state(client, "COMPLETED")
    finally:
        if runner is not None:
            os.killpg(runner.pid, signal.SIGTERM)
            try:
                runner.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(runner.pid, signal.SIGKILL)
        stop_server(config)
    return {
        "refused": refused,
        "tried": len(waiting),
        "median": statistics.median(seconds),
        "p95": statistics.quantiles(seconds, n=20)[-1],
        "max": max(seconds),
        "seconds": seconds,
        "running_at_start": running,
        "running_at_end": still,
        "completed": completed,
    }


def count_state(client: httpx.Client, state: str) -> int:
    body = {"flow_runs": {"tags": {"all_": ["unattended"]}, "state": {"type": {"any_": [state]}}}}
    return int(client.post("flow_runs/count", json=body).json())


def wait_running(client: httpx.Client, wanted: int, limit: float) -> int:
    """Wait until ``wanted`` campaign runs are Running (``limit`` s); return how many are."""
    deadline = time.monotonic() + limit
    while True:
        running = count_state(client, "RUNNING")
        if running >= wanted or time.monotonic() >= deadline:
            return running
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resumes", type=int, default=20, help="resumes per side and rep")
    parser.add_argument("--reps", type=int, default=2, help="repetitions of each side")
    parser.add_argument("--rounds", type=int, default=30, help="rounds per load campaign")
    parser.add_argument("--sim-seconds", type=float, default=0.2, help="each simulation sleeps")
    parser.add_argument("--gap", type=float, default=0.3, help="seconds between resumes")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--postgres",
        metavar="URL",
        help="also a side on PostgreSQL: a database on this server is created per repetition",
    )
    parser.add_argument(
        "--all-services", action="store_true", help="also a side with every Prefect service on"
    )
    parser.add_argument(
        "--sides", help="measure only these sides (comma-separated, e.g. ours)", default=None
    )
    args = parser.parse_args()
    sides = (*SIDES, *(("all",) if args.all_services else ()))
    sides = (*sides, "postgres") if args.postgres else sides
    if args.sides:
        sides = tuple(side for side in sides if side in args.sides.split(","))
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")
    root = Path(tempfile.mkdtemp(prefix="unattended-bench-resume-"))
    print(f"load average (1, 5, 15 min) at the start: {load()} on {os.cpu_count()} CPUs")
    found: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    try:
        for rep in range(args.reps):
            for side in sides if rep % 2 == 0 else sides[::-1]:
                result = one_side(root / f"{side}-{rep}", side, args)
                found[side].append(result)
                print(
                    f"rep {rep} {side:>11}: refused {len(result['refused'])}/{result['tried']}, "
                    f"resume median {result['median'] * 1e3:.0f} ms, p95 "
                    f"{result['p95'] * 1e3:.0f} ms, max "
                    f"{result['max'] * 1e3:.0f} ms, campaigns running at start/end "
                    f"{result['running_at_start']}/{result['running_at_end']}  (load {load()})",
                    flush=True,
                )
                for line in result["refused"][:3]:
                    print(f"          {line}")
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\n{CAMPAIGNS} campaigns x {args.rounds} rounds running; resumes through the UI's call")
    for side in sides:
        # A repetition whose campaigns were not running yet measured an idle server.
        loaded = [r for r in found[side] if r["running_at_start"] >= 2]
        if not loaded:
            print(f"   {side:>8}: no repetition ran under load (campaigns not running)")
            continue
        refused = sum(len(r["refused"]) for r in loaded)
        tried = sum(r["tried"] for r in loaded)
        every = [s for r in loaded for s in r["seconds"]]
        median = statistics.median(every) * 1e3
        p95 = statistics.quantiles(every, n=20)[-1] * 1e3
        idle = len(found[side]) - len(loaded)
        note = f" ({idle} repetition(s) left out: campaigns not running)" if idle else ""
        print(
            f"   {side:>11}: refused {refused}/{tried}; resume median {median:.0f} ms, "
            f"p95 {p95:.0f} ms, max {max(every) * 1e3:.0f} ms{note}"
        )
    print(f"load average at the end: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
