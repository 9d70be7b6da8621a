"""What durable provenance commits cost: SQLite ``synchronous = FULL`` against ``NORMAL``.

The store runs SQLite in WAL mode. ``NORMAL`` syncs only at checkpoints, so a power
loss or file-system error can take the last commits; ``FULL`` (the store's setting,
``flows._provenance._engines.SQLITE_SYNCHRONOUS``) syncs the WAL at every commit.
Measured side by side in one run, the sides alternating (who goes first swaps each
repetition) so load drifts hit both alike, one warm-up campaign per side first:

* a real campaign through ``CampaignEngine`` (``benchmarks/campaign.py``'s engine
  side: surrogate planner, a 3-rule policy, R rounds x B candidates, the objective
  run in-process so the round is mostly the engine and its store): seconds per
  round (median round), and commits per round (counted on the store's engine);
* one commit alone (``record_event``, 200 in a row): milliseconds per commit.

Printed: medians, the added cost per round, FULL / NORMAL ratios, and the load
average at the start and the end. The campaign directory is a temporary folder
unless ``--dir`` names one (put it where campaigns live: a login node's home).

    python benchmarks/durability.py [--quick] [--reps N] [--dir FOLDER]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SIDES = ("FULL", "NORMAL")


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def set_synchronous(mode: str) -> None:
    """Make new store connections use ``PRAGMA synchronous = mode``."""
    from flows._provenance import _engines

    _engines.SQLITE_SYNCHRONOUS = mode


class Commits:
    """Count COMMITs on every SQLAlchemy engine of this process."""

    def __init__(self) -> None:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        self.count = 0

        def on_commit(_connection: Any) -> None:
            self.count += 1

        event.listen(Engine, "commit", on_commit)


async def campaign_side(folder: Path, name: str, rounds: int, batch: int) -> dict[str, float]:
    """Run one campaign through the engine; return seconds per round and commits per round."""
    sys.path.insert(0, str(HERE))
    import campaign as bench_campaign  # benchmarks/campaign.py

    spec = bench_campaign.write_spec(folder, name, rounds, batch, "policy.toml")
    before = COMMITS.count
    timings = await bench_campaign.engine_seconds(spec, folder / "home", function=False)
    return {
        "per_round": timings["per_round"],
        "total": timings["total"],
        "commits_per_round": (COMMITS.count - before) / rounds,
    }


def commit_side(folder: Path, commits: int) -> float:
    """Return the median seconds of one small commit (``record_event``) on a fresh store."""
    from flows._provenance import ProvenanceStore

    times = []
    with ProvenanceStore.open(folder / "commits.db") as store:
        store.ensure_campaign("bench", spec={}, site="local", seed=1, code_version="bench")
        for number in range(commits):
            start = time.perf_counter()
            store.record_event("bench", "bench", details={"n": number})
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(root: Path, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    rounds, batch = (4, 16) if args.quick else (10, 32)
    found: dict[str, dict[str, list[float]]] = {
        side: {"per_round": [], "commits_per_round": [], "commit": []} for side in SIDES
    }
    for side in SIDES:  # warm-up: imports, numpy, the first store of each mode
        set_synchronous(side)
        folder = Path(tempfile.mkdtemp(prefix=f"warm-{side}-", dir=root))
        asyncio.run(campaign_side(folder, f"warm-{side.lower()}", 2, 8))
        commit_side(folder, 20)
    for rep in range(args.reps):
        order = SIDES if rep % 2 == 0 else SIDES[::-1]
        for side in order:
            set_synchronous(side)
            folder = Path(tempfile.mkdtemp(prefix=f"{side}-{rep}-", dir=root))
            result = asyncio.run(campaign_side(folder, f"bench-{rep}", rounds, batch))
            found[side]["per_round"].append(result["per_round"])
            found[side]["commits_per_round"].append(result["commits_per_round"])
            found[side]["commit"].append(commit_side(folder, 200))
            shutil.rmtree(folder, ignore_errors=True)
        print(
            f"rep {rep}: "
            + "; ".join(
                f"{side} {found[side]['per_round'][-1] * 1e3:.1f} ms/round, "
                f"{found[side]['commit'][-1] * 1e3:.2f} ms/commit"
                for side in SIDES
            )
            + f"  (load {load()})",
            flush=True,
        )
    print(f"\n{rounds} rounds x {batch} candidates per campaign, medians of {args.reps}")
    return found


def print_table(found: dict[str, dict[str, list[float]]]) -> None:
    def med(side: str, key: str) -> float:
        return statistics.median(found[side][key])

    print(f"   {'':36} {'FULL':>10} {'NORMAL':>10} {'FULL/NORMAL':>12}")
    for label, key, scale in (
        ("per round (median round), ms", "per_round", 1e3),
        ("one commit (record_event), ms", "commit", 1e3),
        ("commits per round", "commits_per_round", 1.0),
    ):
        full, normal = med("FULL", key) * scale, med("NORMAL", key) * scale
        print(f"   {label:36} {full:>10.2f} {normal:>10.2f} {full / normal:>11.2f}x")
    added = (med("FULL", "per_round") - med("NORMAL", "per_round")) * 1e3
    print(f"   FULL adds {added:+.1f} ms per round")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 rounds x 16 instead of 10 x 32")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each side")
    parser.add_argument("--dir", type=Path, help="folder for the campaigns (default: a temp dir)")
    args = parser.parse_args()
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="unattended-bench-durability-", dir=args.dir))
    os.chdir(root)  # asyncflow's session folders land here, not in the checkout
    print(f"load average (1, 5, 15 min) at the start: {load()} on {os.cpu_count()} CPUs")
    print(f"campaigns under {root}")
    try:
        print_table(measure(root, args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average at the end: {load()}")
    return 0


COMMITS = Commits()

if __name__ == "__main__":
    raise SystemExit(main())
