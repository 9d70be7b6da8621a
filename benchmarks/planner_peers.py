"""The surrogate planner against what a user would otherwise pick, median and worst seed.

Run: ``.venv/bin/python benchmarks/planner_peers.py [--seeds N] [--only NAME]``
(the peers come with the ``peers`` extra: ``pip install -e '.[peers]'``; a peer that
is not installed is left out, and said so).

On standard test functions (not the demo objective the planner's prior was tuned on),
every method gets the same budget of simulations in batches of the same size, and the
same seeds 0..N-1:

* ``ours``: ``tasks.GaussianProcess`` as the campaign's surrogate planner uses it
  (a seeded Latin hypercube first, then expected improvement), round seeds
  ``[seed, round]``;
* ``optuna-tpe``: Optuna's ``TPESampler(seed=seed)``, a batch asked then told;
* ``skopt-gp``: scikit-optimize's ``Optimizer`` with a GP and EI, ``ask(n_points=batch)``
  (constant liar), ``random_state=seed``;
* ``random``: uniform in the box.

Printed per function: the simple regret (best value found minus the known minimum),
median over the seeds and the worst seed, and each method's wall time. A campaign
owner lives with one seed, so the worst seed matters as much as the median.
No timing goal: quality only; the wall time is context.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tasks import Bounds, GaussianProcess

Point = Sequence[float]


@dataclass(frozen=True)
class Problem:
    """A test function, its box, its known minimum, and the budget it gets."""

    name: str
    function: Callable[[Point], float]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    minimum: float
    budget: int
    batch: int

    @property
    def dim(self) -> int:
        return len(self.lower)


def branin(x: Point) -> float:
    """Branin-Hoo on [-5, 10] x [0, 15]; minimum 0.397887 at three points."""
    b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    return (x[1] - b * x[0] ** 2 + c * x[0] - 6) ** 2 + 10 * (1 - t) * math.cos(x[0]) + 10


_H3_A = np.array([[3.0, 10, 30], [0.1, 10, 35], [3.0, 10, 30], [0.1, 10, 35]])
_H3_P = 1e-4 * np.array(
    [[3689, 1170, 2673], [4699, 4387, 7470], [1091, 8732, 5547], [381, 5743, 8828]]
)
_H6_A = np.array(
    [
        [10, 3, 17, 3.5, 1.7, 8],
        [0.05, 10, 17, 0.1, 8, 14],
        [3, 3.5, 1.7, 10, 17, 8],
        [17, 8, 0.05, 10, 0.1, 14],
    ]
)
_H6_P = 1e-4 * np.array(
    [
        [1312, 1696, 5569, 124, 8283, 5886],
        [2329, 4135, 8307, 3736, 1004, 9991],
        [2348, 1451, 3522, 2883, 3047, 6650],
        [4047, 8828, 8732, 5743, 1091, 381],
    ]
)
_H_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])


def _hartmann(a: np.ndarray, p: np.ndarray, x: Point) -> float:
    z = np.asarray(x, dtype=float)
    return float(-np.sum(_H_ALPHA * np.exp(-np.sum(a * (z - p) ** 2, axis=1))))


def hartmann3(x: Point) -> float:
    """Hartmann 3-D on [0, 1]^3; minimum -3.86278 (four local minima)."""
    return _hartmann(_H3_A, _H3_P, x)


def hartmann6(x: Point) -> float:
    """Hartmann 6-D on [0, 1]^6; minimum -3.32237 (six local minima)."""
    return _hartmann(_H6_A, _H6_P, x)


PROBLEMS = (
    Problem("branin-2d", branin, (-5.0, 0.0), (10.0, 15.0), 0.397887, 20, 4),
    Problem("hartmann-3d", hartmann3, (0.0,) * 3, (1.0,) * 3, -3.86278, 40, 4),
    Problem("hartmann-6d", hartmann6, (0.0,) * 6, (1.0,) * 6, -3.32237, 64, 8),
)


def ours(problem: Problem, seed: int) -> float:
    model = GaussianProcess()
    bounds = Bounds(lower=problem.lower, upper=problem.upper)
    best = math.inf
    for index in range(problem.budget // problem.batch):
        batch = model.propose(problem.batch, bounds, [seed, index])
        values = [problem.function(p) for p in batch]
        model.assimilate(batch, values)
        best = min(best, *values)
    return best


def random_search(problem: Problem, seed: int) -> float:
    rng = np.random.default_rng(seed)
    points = rng.uniform(problem.lower, problem.upper, size=(problem.budget, problem.dim))
    return min(problem.function(p) for p in points)


def optuna_tpe(problem: Problem, seed: int) -> float:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
    names = [f"x{i}" for i in range(problem.dim)]
    for _ in range(problem.budget // problem.batch):
        trials = [study.ask() for _ in range(problem.batch)]
        for trial in trials:
            point = [
                trial.suggest_float(name, low, high)
                for name, low, high in zip(names, problem.lower, problem.upper, strict=True)
            ]
            study.tell(trial, problem.function(point))
    return float(study.best_value)


def skopt_gp(problem: Problem, seed: int) -> float:
    from skopt import Optimizer

    optimizer = Optimizer(
        list(zip(problem.lower, problem.upper, strict=True)),
        base_estimator="GP",
        acq_func="EI",
        random_state=seed,
    )
    best = math.inf
    for _ in range(problem.budget // problem.batch):
        batch = optimizer.ask(n_points=problem.batch)
        values = [problem.function(p) for p in batch]
        optimizer.tell(batch, values)
        best = min(best, *values)
    return best


METHODS: dict[str, Callable[[Problem, int], float]] = {
    "ours": ours,
    "optuna-tpe": optuna_tpe,
    "skopt-gp": skopt_gp,
    "random": random_search,
}
_NEEDS = {"optuna-tpe": "optuna", "skopt-gp": "skopt"}


def available() -> dict[str, Callable[[Problem, int], float]]:
    import importlib.util

    found = {}
    for name, method in METHODS.items():
        module = _NEEDS.get(name)
        if module is not None and importlib.util.find_spec(module) is None:
            print(f"{name}: not installed ({module}); pip install -e '.[peers]'")
            continue
        found[name] = method
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 per method")
    parser.add_argument("--only", choices=[p.name for p in PROBLEMS], help="one function")
    args = parser.parse_args()
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")
    warnings.filterwarnings("ignore")  # skopt's and optuna's own notices
    methods = available()
    print(f"load average at the start: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("simple regret (best found - known minimum): median over seeds (worst seed); wall s")
    for problem in PROBLEMS:
        if args.only and problem.name != args.only:
            continue
        print(
            f"\n{problem.name}: {problem.budget} simulations in batches of {problem.batch}, "
            f"seeds 0-{args.seeds - 1}"
        )
        for name, method in methods.items():
            start = time.perf_counter()
            regrets = [method(problem, seed) - problem.minimum for seed in range(args.seeds)]
            wall = time.perf_counter() - start
            worst = max(regrets)
            print(
                f"   {name:>11}: {statistics.median(regrets):9.4f} ({worst:.4f})"
                f"   worst seed {regrets.index(worst)}   {wall:6.1f} s"
            )
    print(f"\nload average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
