"""Where the surrogate looks next: candidate pools and the believer batch.

A proposal scores a seeded pool of candidates with an acquisition function
(expected improvement by default, or a lower confidence bound) and picks a
batch from it greedily. The pool mixes three kinds of points, all inside the
bounds:

- uniform samples over the whole box (exploration);
- Gaussian perturbations of the best observed points at several scales, from a
  fifth of the box down to about a hundredth (a trust region without state);
- after a first scoring, finer perturbations of the pool's best points, so the
  batch can land closer to a minimum than any fixed pool spacing allows.

Each pick is "believed" at its posterior mean (the kriging believer): that
leaves the mean unchanged and only shrinks the variance, so one pick costs one
rank-1 update of the pool's variances instead of a refit. Shrinking variances
and a falling best value only make scores worse, so each pick rescores just the
pool points whose last score could still beat the best current one (the picks
are the same as rescoring the whole pool; a batch of 64 from 64 observations in
3-D took 23 ms, now 10 ms).

A basin can trap the batch: once the model is sure of a local minimum, every
believed pick lands next to it (a believed pick barely lowers the expected
improvement of points a hair away) and the batch spends all its simulations on
one spot. So when the picks before the last all lie within
``_CLUSTER_RADIUS`` length scales of the first (with a batch of two: the first
and the one expected improvement would add), the last pick escapes: it is the
pool point with the lowest ``mean - std`` (a lower confidence bound) at least
``_ESCAPE_DISTANCE`` length scales from the first pick, the most promising spot
outside the basin. (On Hartmann 3-D, 40 simulations in batches of 4, this took
the seeds left in the local basin from 4 in 100 to none over 0.006 of regret;
the demo objective's 4-D median after 40 simulations went from 0.0068 to 0.0076
over 100 seeds; docs/benchmarks.md has the variants measured.)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from tasks._gp import Posterior, matern52_unit
from tasks._proposal import DISTINCT_DIGITS
from tasks._surrogate_model import SurrogateModel

Array = npt.NDArray[np.float64]
Acquisition = Literal["ei", "lcb"]
Indices = npt.NDArray[np.intp]

# Perturbation scales around the best observed points, as fractions of the box.
_ANCHOR_SCALES = (0.2, 0.05, 0.0125)
# Finer scales around the pool's best points after the first scoring.
_REFINE_SCALES = (0.02, 0.004)
# How many best observed points anchor the local pool, and pool points refined.
_ANCHORS = 4
_REFINED = 8
# A batch whose picks before the last lie within this many length scales of the
# first is clustered; its last pick then escapes to at least _ESCAPE_DISTANCE
# length scales from the first, by the lowest mean - _ESCAPE_KAPPA * std.
# Measured on Hartmann 3-D, 100 seeds (docs/benchmarks.md): radii 0.05-0.07 and
# distances 0.7-1.0 do the same; a radius of 0.1 costs the demo's 4-D median 2.5x,
# a distance of 1.2 leaves one seed in the basin, 2 leaves all four.
_CLUSTER_RADIUS = 0.05
_ESCAPE_DISTANCE = 1.0
_ESCAPE_KAPPA = 1.0
# Pool points rescored at once when a pick's scores are brought up to date.
_RESCORE_BLOCK = 64
_SQRT_2PI = math.sqrt(2.0 * math.pi)
_erfc = np.frompyfunc(math.erfc, 1, 1)


@dataclass(frozen=True)
class Box:
    """The proposal's bounds as arrays: ``low + unit * width`` maps the unit cube in."""

    low: Array
    width: Array

    def clip(self, points: Array) -> Array:
        """Return ``points`` moved inside the box."""
        clipped: Array = np.clip(points, self.low, self.low + self.width)
        return clipped


def expected_improvement(mean: Array, std: Array, best: float) -> Array:
    """Return the expected improvement below ``best`` (all in standardised units)."""
    z = (best - mean) / std
    cdf = 0.5 * np.asarray(_erfc(-z / math.sqrt(2.0)), dtype=np.float64)
    pdf = np.exp(-0.5 * z * z) / _SQRT_2PI
    improvement: Array = std * (z * cdf + pdf)
    return improvement


class Scorer:
    """Score pool points for minimisation: lower is better."""

    def __init__(self, acquisition: Acquisition, kappa: float) -> None:
        self.acquisition = acquisition
        self.kappa = kappa

    def __call__(self, mean: Array, std: Array, best: float) -> Array:
        """Return minus the expected improvement, or the lower confidence bound."""
        if self.acquisition == "lcb":
            bound: Array = mean - self.kappa * std
            return bound
        return -expected_improvement(mean, std, best)


def acquire(
    model: SurrogateModel,
    rng: np.random.Generator,
    box: Box,
    count: int,
    pool_size: int,
    score: Scorer,
    taken: set[tuple[float, ...]],
) -> Array:
    """Return up to ``count`` candidates (input units) from a seeded, scored pool.

    A quarter of ``pool_size`` (at least ``count``) is uniform over the box,
    half perturbs the best observations, and the rest refines the pool's best
    points after a first scoring.
    """
    global_count = max(count, pool_size // 4)
    local_count = pool_size // 2
    refine_count = pool_size - global_count - local_count
    anchors = box.clip(model.best_points(_ANCHORS))
    pool = anchored_pool(rng, box, anchors, global_count, local_count)
    posterior = model.posterior
    scaled = model.scaled(pool)
    cross = posterior.cross(scaled)
    if refine_count > 0:
        rows = posterior.whitened(cross)
        left = np.clip(1.0 - np.einsum("ij,ij->j", rows, rows), 1e-12, None)
        first = score(cross.T @ posterior.alpha, np.sqrt(posterior.variance * left), posterior.best)
        centres = pool[np.argsort(first, kind="stable")[:_REFINED]]
        extra = refined_pool(rng, box, centres, refine_count)
        extra_scaled = model.scaled(extra)
        pool = np.vstack([pool, extra])
        scaled = np.vstack([scaled, extra_scaled])
        cross = np.hstack([cross, posterior.cross(extra_scaled)])
    return believer_batch(posterior, pool, scaled, cross, count, score, taken)


def anchored_pool(
    rng: np.random.Generator, box: Box, anchors: Array, global_count: int, local_count: int
) -> Array:
    """Return uniform points over the box then perturbations of ``anchors`` (best first)."""
    dim = len(box.low)
    parts = [box.low + rng.random((global_count, dim)) * box.width]
    if len(anchors) and local_count > 0:
        per = max(1, local_count // (len(_ANCHOR_SCALES) * len(anchors)))
        for scale in _ANCHOR_SCALES:
            for anchor in anchors:
                parts.append(anchor + rng.standard_normal((per, dim)) * (scale * box.width))
    return box.clip(np.vstack(parts))


def refined_pool(rng: np.random.Generator, box: Box, centres: Array, count: int) -> Array:
    """Return ``count`` (or so) fine perturbations of ``centres``, inside the box."""
    if not len(centres) or count <= 0:
        return np.empty((0, len(box.low)))
    dim = len(box.low)
    per = max(1, count // (len(_REFINE_SCALES) * len(centres)))
    parts = [
        centre + rng.standard_normal((per, dim)) * (scale * box.width)
        for scale in _REFINE_SCALES
        for centre in centres
    ]
    return box.clip(np.vstack(parts))


def believer_batch(
    posterior: Posterior,
    pool: Array,
    scaled_pool: Array,
    cross: Array,
    count: int,
    score: Scorer,
    taken: set[tuple[float, ...]],
) -> Array:
    """Pick up to ``count`` distinct pool points greedily, each believed at its mean.

    If the picks before the last are clustered (``escape_region``), the last one
    is the lowest lower confidence bound outside the cluster's basin.

    Args:
        posterior: The model; ``scaled_pool`` is ``pool`` in its input units.
        pool: Candidates in the bounds' units (returned rows come from here).
        scaled_pool: The same candidates as the model sees them.
        cross: ``posterior.cross(scaled_pool)``, computed once by the caller.
        count: How many to pick.
        score: Lower is better; called with the mean, the standard deviation
            and the best value so far (standardised units).
        taken: Keys (10 digits) already observed; picks equal to one are skipped.
    """
    mean = cross.T @ posterior.alpha
    rows = posterior.whitened(cross)
    left = 1.0 - np.einsum("ij,ij->j", rows, rows)
    best = posterior.best
    believed = np.empty((count, len(pool)))
    available = np.ones(len(pool), dtype=bool)
    chosen: list[int] = []
    taken = set(taken)
    escape: npt.NDArray[np.bool_] | None = None
    # Scores only get worse as picks are believed (std shrinks, the best value falls), so
    # last pick's scores are lower bounds: each pick rescores only the points that could
    # still win (``_lazy_argmin``), not the whole pool. Unavailable points score inf.
    bounds = np.where(available, score(mean, _std(posterior, left), best), np.inf)
    current = np.ones(len(pool), dtype=bool)  # which bounds are this pick's exact scores
    unit_pool = scaled_pool / posterior.lengths  # the pool in length scales, divided once
    unit_norms = (unit_pool * unit_pool).sum(1)
    while len(chosen) < count and available.any():
        index = _lazy_argmin(
            bounds, current, functools.partial(_scores_at, score, mean, left, best, posterior)
        )
        if escape is None and count > 1 and len(chosen) == count - 1:
            escape = escape_region(unit_pool, chosen, index)
        if escape is not None and (escape & available).any():
            std = _std(posterior, left)
            index = int(np.argmin(np.where(escape & available, mean - _ESCAPE_KAPPA * std, np.inf)))
        available[index] = False
        bounds[index] = np.inf
        key = point_key(pool[index])
        if key in taken:
            continue
        taken.add(key)
        # One more row of the whitened cross-covariance: the believed pick's.
        done = len(chosen)
        column = np.concatenate([rows[:, index], believed[:done, index]])
        pivot = math.sqrt(max(posterior.diagonal - float(column @ column), 1e-12))
        at = slice(index, index + 1)
        link = matern52_unit(unit_pool, unit_norms, unit_pool[at], unit_norms[at])[:, 0]
        row = (link - rows[:, index] @ rows - believed[:done, index] @ believed[:done]) / pivot
        believed[done] = row
        left = left - row * row
        best = min(best, float(mean[index]))
        current[:] = False
        chosen.append(index)
    picked: Array = pool[chosen]
    return picked


def _scores_at(
    score: Scorer, mean: Array, left: Array, best: float, posterior: Posterior, at: Indices
) -> Array:
    """Return the scores of the pool points ``at`` (indices)."""
    scores: Array = score(mean[at], _std(posterior, left[at]), best)
    return scores


def _std(posterior: Posterior, left: Array) -> Array:
    """Return the posterior standard deviation from the variance ratio left (clipped)."""
    std: Array = np.sqrt(posterior.variance * np.clip(left, 1e-12, None))
    return std


def _lazy_argmin(
    bounds: Array, current: npt.NDArray[np.bool_], rescore: Callable[[Indices], Array]
) -> int:
    """Return the index of the lowest score, rescoring only points that could be it.

    ``bounds`` holds lower bounds of the scores (exact where ``current``); ``rescore``
    returns the exact scores of the given indices. Both arrays are updated in place.
    Once every point whose bound is at or below the lowest exact score is exact, no other
    point can be lower (or tie at a lower index), so the answer is ``np.argmin`` of the
    exact scores: the same pick as rescoring the whole pool. Points are rescored
    ``_RESCORE_BLOCK`` lowest bounds at a time: one at a time costs more in calls than it
    saves when a pick's neighbours (all near the best) wait in line.
    """
    while True:
        lowest = int(np.argmin(bounds))
        needed = (bounds <= bounds[lowest]) & ~current
        if not needed.any():
            return lowest
        stale = np.flatnonzero(~current)
        if len(stale) > _RESCORE_BLOCK:
            needed[stale[np.argpartition(bounds[stale], _RESCORE_BLOCK)[:_RESCORE_BLOCK]]] = True
            stale = np.flatnonzero(needed)
        bounds[stale] = rescore(stale)
        current[stale] = True


def escape_region(unit_pool: Array, chosen: list[int], next_pick: int) -> npt.NDArray[np.bool_]:
    """Return where the last pick may go: far from the first when the batch is clustered.

    Args:
        unit_pool: The pool in length scales (scaled inputs over the model's lengths).
        chosen: The picks so far (indices into the pool), all but the last.
        next_pick: The pick the acquisition would make next; it stands in for
            a second pick when only one has been made.

    Returns:
        A mask of pool points at least ``_ESCAPE_DISTANCE`` from the first pick
        when every pick lies within ``_CLUSTER_RADIUS`` of it, else all False.
    """
    group = chosen if len(chosen) > 1 else [*chosen, next_pick]
    first = unit_pool[chosen[0]]
    reach = float(np.sqrt(((unit_pool[group] - first) ** 2).sum(axis=1)).max())
    if reach >= _CLUSTER_RADIUS:
        return np.zeros(len(unit_pool), dtype=bool)
    far: npt.NDArray[np.bool_] = np.sqrt(((unit_pool - first) ** 2).sum(axis=1)) >= _ESCAPE_DISTANCE
    return far


def point_key(point: Array) -> tuple[float, ...]:
    """Return the candidate rounded to the digits the ``distinct`` check compares."""
    return tuple(round(float(v), DISTINCT_DIGITS) for v in point)
