"""What a user waits for: submit -> round 0, resume -> next batch, campaign end -> exit.

One real Prefect server (SQLite, a free 127.0.0.1 port, a temporary state dir) and
one ``unattended serve`` runner at a time with default settings (polling every
``RUNNER_QUERY_SECONDS``), warmed by a first campaign. The sides take turns, the
order rotated each repetition so load drifts hit all alike:

* ``warm``: flow runs fork from the runner's pre-imported forkserver (the default);
* ``cold``: ``UNATTENDED_WARM_START=0``, every flow run a fresh spawned process
  importing Prefect and the engine (Prefect's own behaviour); submit and approve
  still go through the runner and nudge it;
* ``before`` (with ``--before REF``): the runner and commands of another version, a
  commit or tag of this repository (exported with ``git archive``) or a directory,
  with its default settings (warm start on where it has one).

Per repetition and side, from Prefect's and the provenance database's timestamps:

1. ``unattended submit`` (a fresh CLI process, as a user types it) -> round 0
   ``started_at``; the submit command's own wall time apart;
2. campaign end (last round's ``finished_at``) -> flow run COMPLETED, and -> the
   flow-run process exited (the lease holder's pid from the provenance, watched with
   psutil every 10 ms);
3. ``unattended approve`` (CLI; it nudges the runner) -> round 1's batch
   ``launched_at``; and the UI's path (``POST /flow_runs/{id}/resume`` alone, no
   nudge: the runner's poll finds it) -> batch launched.

Goals: 1 <= 2 s; 3 (median) <= 1.5 s; 2 (to exit) <= 0.3 s. Medians, with the load
average at the start and the end (times stretch with load; the warm/cold ratio
much less).

    python benchmarks/latency.py [--reps N] [--before REF|DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from uuid import UUID

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _before import checkout, describe
from campaign import free_port, rounds_of, stamp, write_spec

TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
SIDES: tuple[str, ...] = ("warm", "cold")
CLI = [sys.executable, "-m", "flows._cli"]


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


class Side:
    """One runner (warm or cold) serving its own state directory."""

    def __init__(
        self, name: str, folder: Path, base_env: dict[str, str], code: Path | None = None
    ) -> None:
        self.name = name
        self.home = folder / f"home-{name}"
        self.log = folder / f"runner-{name}.log"
        self.env = {
            **base_env,
            "UNATTENDED_HOME": str(self.home),
            # "before" runs another checkout with its own defaults (warm start on).
            "UNATTENDED_WARM_START": "0" if name == "cold" else "1",
        }
        if code is not None:  # another checkout's code for the runner and the commands
            self.env["PYTHONPATH"] = str(code)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # The log is appended to across repetitions: only what this runner writes counts.
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [*CLI, "serve"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        deadline = time.monotonic() + 120
        while b"serving campaign runs" not in self.log.read_bytes()[offset:]:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise SystemExit(f"the {self.name} runner did not start:\n{self.tail()}")
            time.sleep(0.2)
        self.wait_until_warm()

    def wait_until_warm(self) -> None:
        """Wait until the runner's forkserver (if any) has imported: a runner up a while."""
        import psutil

        assert self.process is not None
        previous = -1.0
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            time.sleep(1.0)
            children = psutil.Process(self.process.pid).children(recursive=True)
            cpu = sum(sum(c.cpu_times()[:2]) for c in children if c.is_running())
            if cpu == previous:
                return
            previous = cpu

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.process = None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def cli(self, *args: str) -> tuple[float, str]:
        """Run ``unattended ARGS``; return its wall time and stdout."""
        began = time.time()
        done = subprocess.run(
            [*CLI, *args], capture_output=True, text=True, env=self.env, timeout=300
        )
        if done.returncode != 0:
            raise SystemExit(f"unattended {' '.join(args)}: {done.stderr}\n{self.tail()}")
        return time.time() - began, done.stdout

    def submit(self, spec: Path) -> tuple[float, float, UUID]:
        """Submit through the CLI; return (moment, wall, flow run id)."""
        began = time.time()
        wall, out = self.cli("submit", str(spec))
        found = re.search(r"flow run ([0-9a-f-]{36})", out)
        if found is None:
            raise SystemExit(f"no flow run id in: {out}")
        return began, wall, UUID(found.group(1))


class ExitWatcher(threading.Thread):
    """Note when the process running campaign ``name``'s flow run exits (polling every 10 ms).

    The process is the one holding the campaign's lease: the provenance records the
    holder's pid when the run starts (``campaign_lease.pid``, kept after release), so
    the watcher finds exactly the flow-run process, whichever way it was started.
    """

    def __init__(self, home: Path, name: str) -> None:
        super().__init__(daemon=True)
        self._database = home / "campaigns" / name / "provenance.db"
        self._name = name
        self.pid: int | None = None
        self.exited = float("nan")
        self._halt = threading.Event()

    def _holder(self) -> int | None:
        import sqlite3

        if not self._database.exists():
            return None
        try:
            with contextlib.closing(
                sqlite3.connect(f"file:{self._database}?mode=ro", uri=True, timeout=1)
            ) as connection:
                row = connection.execute(
                    "SELECT l.pid FROM campaign_lease l JOIN campaign c "
                    "ON c.id = l.campaign_id WHERE c.name = ?",
                    (self._name,),
                ).fetchone()
        except sqlite3.Error:  # the run is creating the database or its tables
            return None
        return None if row is None else int(row[0])

    def run(self) -> None:
        import psutil

        while self.pid is None and not self._halt.is_set():
            self.pid = self._holder()
            time.sleep(0.01)
        try:
            process = psutil.Process(self.pid)
            while not self._halt.is_set() and process.status() != psutil.STATUS_ZOMBIE:
                time.sleep(0.01)
        except psutil.NoSuchProcess:
            pass
        self.exited = time.time()

    def stop(self) -> None:
        self._halt.set()


def wait_for(env: dict[str, str], flow_run_id: UUID, states: set[str], log: str) -> Any:
    from flows._prefect import _rest as rest

    deadline = time.monotonic() + 600
    run = rest.read_run(env, flow_run_id)
    while time.monotonic() < deadline:
        run = rest.read_run(env, flow_run_id)
        if run.state_type in states:
            return run
        if run.state_type in TERMINAL:
            break
        time.sleep(0.1)
    raise SystemExit(
        f"flow run {flow_run_id} is {run.state_name} ({run.state_message}), "
        f"wanted {sorted(states)}\n{log}"
    )


def completed_at(env: dict[str, str], flow_run_id: UUID) -> float:
    from flows._prefect import _rest as rest

    with rest.api(env) as client:
        found = client.checked("GET", f"flow_runs/{flow_run_id}")
    return stamp(found["end_time"])


def launched_at(home: Path, name: str, round_index: int) -> float:
    from flows._paths import campaign_dir
    from flows._provenance import ProvenanceStore

    with ProvenanceStore.open(campaign_dir(home, name), read_only=True) as store:
        batches = store.round_view(name, round_index)["batches"]
    return stamp(batches[0]["launched_at"])


def start_and_exit(side: Side, folder: Path, rep: int) -> dict[str, float]:
    """Measure 1 and 2 on one campaign of 2 rounds x 8 candidates."""
    name = f"start-{side.name}-{rep}"
    spec = write_spec(folder, name, 2, 8, "policy.toml")
    watcher = ExitWatcher(side.home, name)
    watcher.start()
    began, wall, flow_run_id = side.submit(spec)
    wait_for(side.env, flow_run_id, {"COMPLETED"}, side.tail())
    watcher.join(timeout=60)
    watcher.stop()
    if watcher.pid is None:
        raise SystemExit(f"campaign {name}: no lease holder recorded\n{side.tail()}")
    rounds = rounds_of(side.home, name)
    end = stamp(rounds[-1]["finished_at"])
    return {
        "submit_cli": wall,
        "submit_to_round0": stamp(rounds[0]["started_at"]) - began,
        "end_to_completed": completed_at(side.env, flow_run_id) - end,
        "end_to_exit": watcher.exited - end,
    }


def resume(side: Side, folder: Path, rep: int, *, by_cli: bool) -> dict[str, float]:
    """Measure 3: approve a campaign suspended on round 1, until round 1's batch launched."""
    from flows._prefect import _rest as rest

    how = "cli" if by_cli else "ui"
    name = f"resume-{how}-{side.name}-{rep}"
    spec = write_spec(folder, name, 2, 8, "approval-policy.toml")
    _, _, flow_run_id = side.submit(spec)
    wait_for(side.env, flow_run_id, {"PAUSED"}, side.tail())
    time.sleep(1.5)  # the runner is idle, mid-poll, as when a human answers
    began = time.time()
    if by_cli:
        # --no-wait: the command's own cost; the wait for the verdict is the resume measured below
        wall, _ = side.cli("approve", str(flow_run_id), "--as", "alice", "--no-wait")
    else:
        rest.approve(side.env, flow_run_id, approver="alice", comment="benchmark")
        wall = time.time() - began
    wait_for(side.env, flow_run_id, {"COMPLETED"}, side.tail())
    return {
        f"approve_{how}": wall,
        f"{how}_resume_to_batch": launched_at(side.home, name, 1) - began,
    }


ROWS = (
    ("submit_cli", "`unattended submit` wall"),
    ("submit_to_round0", "submit -> round 0 started (goal <= 2 s)"),
    ("approve_cli", "`unattended approve` wall"),
    ("cli_resume_to_batch", "approve (CLI) -> batch launched (goal <= 1.5 s)"),
    ("ui_resume_to_batch", "resume API alone (UI) -> batch launched"),
    ("end_to_completed", "campaign end -> flow run COMPLETED"),
    ("end_to_exit", "campaign end -> process exit (goal <= 0.3 s)"),
)


def report(results: dict[str, list[dict[str, float]]], reps: int) -> None:
    print(f"\nmedians over {reps} repetitions per side, seconds [min-max]")
    print(f"   {'':50} " + " ".join(f"{side:>20}" for side in SIDES))
    for key, label in ROWS:
        cells = []
        for side in SIDES:
            values = [r[key] for r in results[side] if key in r]
            cells.append(
                f"{statistics.median(values):6.2f} [{min(values):.2f}-{max(values):.2f}]"
                if values
                else "-"
            )
        print(f"   {label:50} " + " ".join(f"{cell:>20}" for cell in cells))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions per side")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--before",
        metavar="REF|DIR",
        help="also measure a side 'before': a commit or tag of this repository, or a checkout",
    )
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        before = stack.enter_context(checkout(args.before)) if args.before else None
        return measure(args, before)


def measure(args: argparse.Namespace, before: Path | None) -> int:
    global SIDES
    if args.before is not None:
        SIDES = (*SIDES, "before")
    folder = Path(tempfile.mkdtemp(prefix="unattended-bench-latency-"))
    os.chdir(folder)  # asyncflow's session folders land here, not in the checkout

    from flows._prefect._runner import RUNNER_QUERY_SECONDS
    from flows._prefect._server import ServerConfig, client_env, start_server, stop_server

    print(f"load average (1, 5, 15 min) at the start: {load()} on {os.cpu_count()} CPUs")
    config = ServerConfig(port=free_port(), state_dir=folder / "server")
    handle = start_server(config, timeout=180)
    base_env = {**os.environ, **client_env(handle)}
    print(f"server {handle.api_url}; runner polls every {RUNNER_QUERY_SECONDS} s; dir {folder}")
    if args.before:
        print(f"before: {describe(args.before)}")
    results: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    sides = {
        name: Side(name, folder, base_env, before if name == "before" else None) for name in SIDES
    }
    try:
        for rep in range(-1, args.reps):  # rep -1 warms the server and each runner
            for name in SIDES[rep % len(SIDES) :] + SIDES[: rep % len(SIDES)]:
                side = sides[name]
                side.start()
                try:
                    measured = start_and_exit(side, folder, rep)
                    measured |= resume(side, folder, rep, by_cli=True)
                    measured |= resume(side, folder, rep, by_cli=False)
                finally:
                    side.stop()
                if rep >= 0:
                    results[name].append(measured)
                    print(
                        f"rep {rep} {name}: "
                        + ", ".join(f"{k} {v:.2f}" for k, v in measured.items()),
                        flush=True,
                    )
        report(results, args.reps)
        print(f"load average (1, 5, 15 min) at the end: {load()}")
    finally:
        for side in sides.values():
            side.stop()
        stop_server(config)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
