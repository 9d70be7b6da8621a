"""A campaign of many rounds: is the cost of a round flat, and does the record grow linearly?

Run: ``.venv/bin/python benchmarks/long_campaign.py [--rounds 1000] [--batch 8]``.

One real Prefect server (SQLite, a free 127.0.0.1 port, a temporary state dir) and one
``unattended serve`` runner with default settings run one campaign of ``--rounds``
rounds: 3 dimensions, the surrogate planner, the 3-rule policy of ``campaign.py``, a
near-zero-cost ``awk`` simulation per candidate, so what is measured is the
orchestration (planner, gate, policy, provenance, checkpoint, Prefect), not science.

Printed, with the load average:

* the cost of a round, as round start -> next round start (everything between two
  rounds, the checkpoint included) from the provenance record: the median of the
  first 100 rounds, of the last 100, their ratio (the target is within 20 %), and
  the median of every block of 100 rounds, so a slow drift shows;
* the provenance database's logical size (pages x page size as a reader sees it, the
  WAL included) sampled while the campaign runs: bytes per round in the first and in
  the last third of the campaign (linear growth keeps them alike), and the size at the end;
* what reading the record back costs at the end, each a fresh process timed from
  start to exit: ``inspect NAME``, ``inspect NAME --round LAST``, ``report NAME``,
  ``export NAME --format jsonl``, ``--format prov`` and ``--format ro-crate``.

Nothing in the environment changes a default of the runner; BLAS runs single-threaded
as in ``campaign.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from campaign import (
    BLAS_THREADS,
    RUNNER_PID,
    load,
    log_tail,
    rounds_of,
    serve_ours,
    stamp,
    stop_runner,
    wait_for_line,
    write_spec,
)

BLOCK = 100  # rounds per block in the drift table


def _read_only(home: Path, name: str) -> Any:
    """Open the campaign's provenance database read-only (None before it exists)."""
    import sqlite3

    from flows._paths import campaign_dir

    path = campaign_dir(home, name) / "provenance.db"
    if not path.exists():
        return None
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)


def progress(home: Path, name: str) -> tuple[int, int]:
    """Return the rounds finished and the database's logical size in bytes (WAL included).

    The size is ``page_count * page_size`` as a reader sees it, so a WAL not yet
    checkpointed into the file counts, and a WAL's leftover length does not.
    """
    import sqlite3

    db = _read_only(home, name)
    if db is None:
        return 0, 0
    try:
        with db:
            done = db.execute("SELECT COUNT(*) FROM round WHERE finished_at IS NOT NULL")
            rounds = int(done.fetchone()[0])
            pages = int(db.execute("PRAGMA page_count").fetchone()[0])
            size = int(db.execute("PRAGMA page_size").fetchone()[0])
    except sqlite3.Error:
        return 0, 0
    finally:
        db.close()
    return rounds, pages * size


async def run_campaign(spec: Path, home: Path, log: Path, rounds: int) -> list[tuple[int, int]]:
    """Submit the campaign and wait for COMPLETED; return (rounds done, bytes) samples."""
    from flows._prefect._deployment import submit_campaign
    from flows._prefect._nudge import nudge_runner
    from flows._prefect._service import read_run

    submitted = await submit_campaign(spec, state_dir=home)
    nudge_runner(RUNNER_PID[0])
    samples: list[tuple[int, int]] = []
    began = time.monotonic()
    while True:
        run = await read_run(submitted.flow_run_id)
        state = run.state.type.value if run.state else "NONE"
        done, size = progress(home, spec.stem)
        if done and (not samples or done >= samples[-1][0] + max(1, rounds // 20)):
            samples.append((done, size))
            print(f"   {done} rounds, {time.monotonic() - began:.0f} s, load {load()}", flush=True)
        if state == "COMPLETED":
            if samples[-1][0] != rounds:
                samples.append(progress(home, spec.stem))
            return samples
        if state in {"FAILED", "CRASHED", "CANCELLED"}:
            raise SystemExit(f"the campaign ended {state}\n{log_tail(log)}")
        await asyncio.sleep(1.0)


def round_costs(home: Path, name: str) -> list[float]:
    """Return each round's start -> the next round's start (the last: start -> finish)."""
    rounds = rounds_of(home, name)
    starts = [stamp(r["started_at"]) for r in rounds]
    costs = [b - a for a, b in itertools.pairwise(starts)]
    return [*costs, stamp(rounds[-1]["finished_at"]) - starts[-1]]


def timed(command: list[str], env: dict[str, str], cwd: Path) -> float:
    """Run a CLI command in a fresh process; return its wall time (exit with its error)."""
    began = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds


def print_rounds(costs: list[float]) -> None:
    block = min(BLOCK, max(1, len(costs) // 4))
    first, last = statistics.median(costs[:block]), statistics.median(costs[-block:])
    print(f"\nround cost (start -> next start), median, seconds ({len(costs)} rounds)")
    print(
        f"   first {block}: {first:.3f}   last {block}: {last:.3f}   last/first x{last / first:.2f}"
    )
    blocks = [costs[i : i + block] for i in range(0, len(costs), block)]
    print("   by block: " + " ".join(f"{statistics.median(b):.3f}" for b in blocks))


def print_growth(samples: list[tuple[int, int]]) -> None:
    print("\nprovenance database (logical size: pages x page size, the WAL included)")
    if len(samples) < 3:
        print("   too few samples")
        return
    third = max(1, len(samples) // 3)
    (r0, b0), (r1, b1) = samples[0], samples[third]
    (r2, b2), (r3, b3) = samples[-third - 1], samples[-1]
    early = (b1 - b0) / max(1, r1 - r0)
    late = (b3 - b2) / max(1, r3 - r2)
    print(f"   bytes per round: rounds {r0}-{r1}: {early:,.0f}   rounds {r2}-{r3}: {late:,.0f}")
    print(f"   at the end: {b3 / 1e6:.1f} MB for {r3} rounds")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=8, help="candidates per round")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    for variable in BLAS_THREADS:
        os.environ.setdefault(variable, "1")
    folder = Path(tempfile.mkdtemp(prefix="unattended-bench-long-"))
    os.chdir(folder)  # asyncflow's session folders land here, not in the checkout

    from flows._prefect._server import stop_server

    print(f"load average (1, 5, 15 min) at the start: {load()} on {os.cpu_count()} CPUs")
    config, runner = serve_ours(folder)
    home, log = folder / "home", folder / "runner.log"
    name = "bench-long"
    try:
        wait_for_line(log, "serving campaign runs")
        spec = write_spec(folder, name, args.rounds, args.batch, "policy.toml")
        print(f"{args.rounds} rounds x {args.batch} candidates, 3-D, awk simulation")
        began = time.perf_counter()
        samples = asyncio.run(run_campaign(spec, home, log, args.rounds))
        print(f"campaign completed in {time.perf_counter() - began:.0f} s")
        print_rounds(round_costs(home, name))
        print_growth(samples)
        cli = [sys.executable, "-m", "flows._cli"]
        env = dict(os.environ)
        reads: dict[str, list[str]] = {
            f"inspect {name}": ["inspect", name],
            f"inspect {name} --round {args.rounds - 1}": [
                "inspect",
                name,
                "--round",
                str(args.rounds - 1),
            ],
            f"report {name}": ["report", name, "--output", str(folder / "report")],
            "export --format jsonl": [
                *("export", name, "--format", "jsonl", "--output", str(folder / "all.jsonl")),
            ],
            "export --format prov": [
                *("export", name, "--format", "prov", "--output", str(folder / "prov")),
            ],
            "export --format ro-crate": [
                *("export", name, "--format", "ro-crate", "--output", str(folder / "crate")),
            ],
        }
        print("\nreading the record back (fresh process, start to exit)")
        for label, argv in reads.items():
            print(f"   {label:44} {timed([*cli, *argv], env, folder):6.2f} s", flush=True)
        print(f"\nload average (1, 5, 15 min) at the end: {load()}")
    finally:
        stop_runner(runner)  # before the server
        stop_server(config)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
