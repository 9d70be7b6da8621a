"""The surrogate planner: cost per proposal as a campaign grows, and quality on the demo.

Run: ``.venv/bin/python benchmarks/surrogate.py [--quick] [--baseline REV]``.

(a) **Cost per proposal**, the planner's normal call: a surrogate holding ``n``
    evaluated points assimilates one more batch and proposes the next batch of 4
    (and 8). Median wall and CPU time over several consecutive rounds, the new
    implementation and the baseline measured alternately in the same run, with
    the load average. "restore" is the first proposal of a surrogate rebuilt from
    its state (what a resumed flow pays once). The data are uniform random points
    of the demo's 2-D objective. Start-up (import, first call in a fresh process)
    is reported apart.
(b) **Quality** on the demo's 2-D objective: the median distance from the best
    evaluated point to the true minimiser after 20 and 40 simulations (rounds of 4,
    round seeds ``[seed, round]``), over seeds 0-9, for the new surrogate, the
    baseline and random search with the same budget. No timing involved.

The baseline is ``tasks/_surrogate.py`` at ``--baseline`` (default: the commit
before the rewrite), loaded from git; without git the baseline columns are left
out.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from tasks import Bounds, GaussianProcess
from tasks.demo import minimiser, objective

ROOT = Path(__file__).resolve().parents[1]
BASELINE_REV = "27a5a8c"  # the isotropic RBF surrogate with a length-scale grid
UNIT2 = Bounds.unit(2)
# Seconds the baseline may spend per size; past a size where one call took more
# than a quarter of it, bigger sizes are not measured.
BASELINE_BUDGET_S = 20.0


def load_baseline(rev: str) -> ModuleType | None:
    """Import ``tasks/_surrogate.py`` as it was at ``rev``, or return None without git."""
    try:
        source = subprocess.run(
            ["git", "show", f"{rev}:tasks/_surrogate.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(tempfile.mkdtemp()) / "baseline_surrogate.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_surrogate", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min {five:.1f})"


def evaluated(rng: np.random.Generator, count: int) -> tuple[list[list[float]], list[float]]:
    points = rng.random((count, 2)).tolist()
    return points, [objective(p) for p in points]


class Side:
    """One implementation driven through a growing campaign, timing each proposal."""

    def __init__(self, factory: Callable[[], Any], n: int) -> None:
        self.rng = np.random.default_rng(n)
        self.model = factory()
        self.model.assimilate(*evaluated(self.rng, n))
        start = time.perf_counter()
        self.model.propose(4, UNIT2, 0)  # a running campaign has proposed before
        self.warm = time.perf_counter() - start
        self.wall: dict[int, list[float]] = {4: [], 8: []}
        self.cpu: dict[int, list[float]] = {4: [], 8: []}
        self.round = 0

    def step(self, count: int) -> float:
        """Assimilate one evaluated batch, then time the next proposal; return its wall time."""
        self.model.assimilate(*evaluated(self.rng, count))
        self.round += 1
        wall, cpu = time.perf_counter(), time.process_time()
        self.model.propose(count, UNIT2, [self.round])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        self.wall[count].append(wall)
        self.cpu[count].append(cpu)
        return wall


def restore_cost(factory: Callable[[], Any], n: int, repeats: int) -> tuple[float, float]:
    """Return the median wall and CPU time of the first proposal after ``from_state``."""
    model = factory()
    model.assimilate(*evaluated(np.random.default_rng(n), n))
    state = model.to_state()
    walls, cpus = [], []
    for index in range(repeats):
        restored = type(model).from_state(state)
        wall, cpu = time.perf_counter(), time.process_time()
        restored.propose(4, UNIT2, [index])
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:8.1f}" if values else "       —"


def cost_table(sizes: list[int], repeats: int, baseline: ModuleType | None) -> None:
    print(f"\n(a) cost per proposal, median ms over {repeats} rounds; {load()}")
    header = (
        "     n |  new b4 wall   cpu |  new b8 wall   cpu | restore wall   cpu "
        "|  old b4 wall   cpu |  old b8 wall | old/new (b4)"
    )
    print(header)
    print("-" * len(header))
    old_alive = baseline is not None
    for n in sizes:
        new = Side(GaussianProcess, n)
        old = Side(baseline.GaussianProcess, n) if old_alive and baseline else None
        spent = old.warm if old is not None else 0.0
        for _ in range(repeats):
            for count in (4, 8):
                new.step(count)
                if old is not None and spent < BASELINE_BUDGET_S:
                    spent += old.step(count)
        if old is not None and max([old.warm, *old.wall[4]]) > BASELINE_BUDGET_S / 4:
            old_alive = False
        restore_wall, restore_cpu = restore_cost(GaussianProcess, n, max(3, repeats // 2))
        ratio = (
            f"{statistics.median(old.wall[4]) / statistics.median(new.wall[4]):10.1f}x"
            if old is not None and old.wall[4]
            else "           —"
        )
        print(
            f"{n:6d} | {ms(new.wall[4])} {ms(new.cpu[4])[2:]} | {ms(new.wall[8])} "
            f"{ms(new.cpu[8])[2:]} |     {ms([restore_wall])} {ms([restore_cpu])[2:]} "
            f"| {ms(old.wall[4] if old else [])} {ms(old.cpu[4] if old else [])[2:]} "
            f"| {ms(old.wall[8] if old else [])}    | {ratio}"
        )
    print(f"after the table: {load()}")
    if baseline is not None and not old_alive:
        print(
            f"(old: fewer rounds where {BASELINE_BUDGET_S:.0f} s per size ran out; sizes after "
            f"a call over {BASELINE_BUDGET_S / 4:.0f} s were not measured)"
        )


def startup() -> None:
    """Print import time and the first two proposals in a fresh process."""
    snippet = (
        "import time; t0 = time.perf_counter()\n"
        "from tasks._surrogate import GaussianProcess\n"
        "from tasks import Bounds\n"
        "t1 = time.perf_counter()\n"
        "m = GaussianProcess(); m.assimilate([[0.1, 0.2], [0.5, 0.5], [0.8, 0.3], [0.3, 0.9]],"
        " [1.0, 0.2, 0.7, 2.0])\n"
        "t2 = time.perf_counter(); m.propose(4, Bounds.unit(2), 0); t3 = time.perf_counter()\n"
        "m.propose(4, Bounds.unit(2), 1); t4 = time.perf_counter()\n"
        "print((t1 - t0) * 1e3, (t3 - t2) * 1e3, (t4 - t3) * 1e3)\n"
    )
    runs = []
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, "-c", snippet], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
        runs.append([float(v) for v in out])
    imp, first, second = (statistics.median(r[i] for r in runs) for i in range(3))
    print(
        f"\nstart-up (fresh process, median of 3): import tasks._surrogate {imp:.0f} ms "
        f"(numpy included); first proposal {first:.1f} ms (threadpoolctl loaded on first use); "
        f"second {second:.1f} ms"
    )


def distance_after(factory: Callable[[], Any], seed: int, rounds: int) -> float:
    model = factory()
    points: list[list[float]] = []
    values: list[float] = []
    for index in range(rounds):
        batch = model.propose(4, UNIT2, [seed, index])
        batch_values = [objective(p) for p in batch]
        model.assimilate(batch, batch_values)
        points += batch
        values += batch_values
    best = np.array(points[int(np.argmin(values))])
    return float(np.linalg.norm(best - np.array(minimiser(2))))


def random_search(seed: int, count: int) -> float:
    points, values = evaluated(np.random.default_rng(seed), count)
    best = np.array(points[int(np.argmin(values))])
    return float(np.linalg.norm(best - np.array(minimiser(2))))


def cell(values: list[float] | None) -> str:
    """Return the median and the worst of ``values``, or a dash."""
    if not values:
        return "                 —"
    return f"{statistics.median(values):9.4f} ({max(values):.3f})"


def quality_table(budgets: list[int], baseline: ModuleType | None) -> None:
    seeds = range(10)
    print("\n(b) distance from the best evaluated point to the minimiser, seeds 0-9, batch 4")
    print(" sims | new median (worst) | old median (worst) | random median (worst)")
    print("-" * 70)
    for sims in budgets:
        rows = {
            "new": [distance_after(GaussianProcess, s, sims // 4) for s in seeds],
            "random": [random_search(s, sims) for s in seeds],
        }
        if baseline is not None:
            rows["old"] = [distance_after(baseline.GaussianProcess, s, sims // 4) for s in seeds]

        cells = [cell(rows.get(name)) for name in ("new", "old", "random")]
        print(f" {sims:4d} | " + " | ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and rounds")
    parser.add_argument("--baseline", default=BASELINE_REV, help="git revision of the old one")
    args = parser.parse_args()
    baseline = load_baseline(args.baseline)
    if baseline is None:
        print(f"baseline {args.baseline} not available (no git?): new side only")
    sizes = [8, 200, 2000] if args.quick else [8, 50, 200, 500, 1000, 2000]
    repeats = 3 if args.quick else 7
    print(f"surrogate benchmark; baseline {args.baseline}; {load()}; cpus {os.cpu_count()}")
    quality_table([20] if args.quick else [20, 40], baseline)
    startup()
    cost_table(sizes, repeats, baseline)


if __name__ == "__main__":
    main()
