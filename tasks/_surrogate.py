"""A small Gaussian-process surrogate for minimisation, in numpy only.

The model is a zero-mean GP on standardised values with an isotropic RBF kernel
and a noise jitter, solved by Cholesky. The length scale is either fixed or
picked from a fixed grid by the log marginal likelihood, so fitting is
deterministic. ``propose`` minimises a lower confidence bound over a seeded
random pool, one candidate at a time, treating each pick as observed at its
predicted mean (the "kriging believer") so a batch spreads out.

Everything is deterministic for a seed: the same state, bounds, count and seed
give bit-identical candidates on the same machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tasks._proposal import DISTINCT_DIGITS, Bounds

Array = npt.NDArray[np.float64]
Seed = int | Sequence[int]

_STATE_KIND = "gaussian_process"
_STATE_VERSION = 1
# Multiples of the data's mean spread tried when the length scale is fitted.
_LENGTH_GRID = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.5)


class GaussianProcess:
    """Model an objective from evaluated candidates and propose where to look next.

    Args:
        length_scale: The RBF length scale in input units; ``None`` fits it.
        noise: Jitter added to the kernel's diagonal (standardised units).
        kappa: Weight of the standard deviation in the lower confidence bound.
        pool_size: Random points scored per proposal.

    Non-finite values passed to ``assimilate`` (a failed simulation) are skipped
    and counted in ``skipped``; non-finite coordinates raise ``ValueError``.
    """

    def __init__(
        self,
        *,
        length_scale: float | None = None,
        noise: float = 1e-6,
        kappa: float = 2.0,
        pool_size: int = 2048,
    ) -> None:
        if length_scale is not None and not (math.isfinite(length_scale) and length_scale > 0):
            raise ValueError("length_scale must be a positive finite number or None")
        if not (math.isfinite(noise) and noise > 0):
            raise ValueError("noise must be a positive finite number")
        if not (math.isfinite(kappa) and kappa >= 0):
            raise ValueError("kappa must be a non-negative finite number")
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        self.length_scale = length_scale
        self.noise = float(noise)
        self.kappa = float(kappa)
        self.pool_size = int(pool_size)
        self.skipped = 0
        self._points: Array = np.empty((0, 0))
        self._values: Array = np.empty(0)
        self._cached: _Fit | None = None

    def __repr__(self) -> str:
        return (
            f"GaussianProcess(observations={len(self._values)}, dim={self.dim}, "
            f"length_scale={self.length_scale!r}, noise={self.noise!r}, kappa={self.kappa!r})"
        )

    @property
    def dim(self) -> int | None:
        """Return the candidates' dimension, or None before any observation."""
        return int(self._points.shape[1]) if len(self._values) else None

    @property
    def observations(self) -> int:
        """Return the number of assimilated (finite) observations."""
        return len(self._values)

    def assimilate(self, points: Sequence[Sequence[float]], values: Sequence[float]) -> int:
        """Add evaluated candidates; return how many were skipped for a non-finite value.

        Raises:
            ValueError: Lengths differ, a point has the wrong dimension, or a
                coordinate is not finite (the message names the index).
        """
        if len(points) != len(values):
            raise ValueError(f"{len(points)} points but {len(values)} values")
        if not len(points):
            return 0
        x = np.asarray(points, dtype=np.float64)
        y = np.asarray(values, dtype=np.float64)
        if x.ndim != 2 or y.ndim != 1:
            raise ValueError("points must be a list of equal-length coordinate lists")
        if self.dim is not None and x.shape[1] != self.dim:
            raise ValueError(f"points have {x.shape[1]} coordinates; the surrogate has {self.dim}")
        bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
        if bad.size:
            raise ValueError(f"point {int(bad[0])} has a non-finite coordinate")
        keep = np.isfinite(y)
        self._cached = None
        skipped = int((~keep).sum())
        self.skipped += skipped
        if self.dim is None:
            self._points = x[keep]
            self._values = y[keep]
        else:
            self._points = np.vstack([self._points, x[keep]])
            self._values = np.concatenate([self._values, y[keep]])
        return skipped

    def predict(self, points: Sequence[Sequence[float]] | Array) -> tuple[Array, Array]:
        """Return the posterior mean and standard deviation at ``points``."""
        x = np.asarray(points, dtype=np.float64)
        if x.ndim != 2:
            raise ValueError("points must be a list of coordinate lists")
        if not len(self._values):
            return np.zeros(len(x)), np.ones(len(x))
        if x.shape[1] != self.dim:
            raise ValueError(f"points have {x.shape[1]} coordinates; the surrogate has {self.dim}")
        fit = self._fit()
        mean = fit.mean(x)
        rows = fit.whitened(x)
        std = np.sqrt(np.clip(1.0 - np.einsum("ij,ij->j", rows, rows), 1e-12, None))
        scale, offset = self._scale()
        return mean * scale + offset, std * scale

    def propose(self, count: int, bounds: Bounds, seed: Seed) -> list[list[float]]:
        """Return ``count`` distinct candidates in ``bounds`` minimising the lower confidence bound.

        With no observations the batch is a seeded Latin hypercube. Candidates
        equal (at 10 digits) to an observation or to each other are skipped, so
        bounds too narrow for ``count`` distinct points give a shorter batch.

        Raises:
            ValueError: ``count`` is below 1 or ``bounds`` has the wrong dimension.
        """
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        if self.dim is not None and bounds.dim != self.dim:
            raise ValueError(f"bounds have {bounds.dim} coordinates; the surrogate has {self.dim}")
        rng = np.random.default_rng(_entropy(seed))
        low = np.asarray(bounds.lower)
        high = np.asarray(bounds.upper)
        if not len(self._values):
            unit = _latin_hypercube(rng, count, bounds.dim)
            return _to_lists(low + unit * (high - low))
        pool = low + rng.random((max(self.pool_size, count), bounds.dim)) * (high - low)
        return self._believer_batch(pool, count)

    def _believer_batch(self, pool: Array, count: int) -> list[list[float]]:
        """Pick ``count`` distinct pool points by LCB, each believed at its mean.

        Observing a pick at its posterior mean leaves the mean unchanged
        everywhere and only shrinks the variance, so each pick adds one row to
        the whitened cross-covariance (a one-row Cholesky extension) instead of
        refitting the model.
        """
        fit = self._fit()
        mean = fit.mean(pool)
        rows = fit.whitened(pool)
        variance = 1.0 - np.einsum("ij,ij->j", rows, rows)
        taken: set[tuple[float, ...]] = {_key(row) for row in self._points}
        available = np.ones(len(pool), dtype=bool)
        chosen: list[Array] = []
        while len(chosen) < count and available.any():
            std = np.sqrt(np.clip(variance, 1e-12, None))
            score = np.where(available, mean - self.kappa * std, np.inf)
            index = int(np.argmin(score))
            available[index] = False
            point = pool[index]
            key = _key(point)
            if key in taken:
                continue
            taken.add(key)
            chosen.append(point)
            column = rows[:, index]
            pivot = math.sqrt(max(1.0 + fit.jitter - float(column @ column), 1e-12))
            row = (_rbf(pool, point[None, :], fit.length)[:, 0] - column @ rows) / pivot
            rows = np.vstack([rows, row])
            variance = variance - row * row
        return _to_lists(np.asarray(chosen))

    def _scale(self) -> tuple[float, float]:
        """Return the standard deviation and mean used to standardise values."""
        std = float(self._values.std())
        return (std if std > 0 else 1.0), float(self._values.mean())

    def _standardised(self) -> Array:
        scale, offset = self._scale()
        return (self._values - offset) / scale

    def _fit(self) -> _Fit:
        """Return the fit at the fixed length scale, or the grid's most likely one (cached)."""
        if self._cached is not None:
            return self._cached
        y = self._standardised()
        if self.length_scale is not None:
            self._cached = _Fit(self._points, y, self.length_scale, self.noise)
            return self._cached
        spread = float(np.ptp(self._points, axis=0).mean()) if len(self._values) > 1 else 0.0
        spread = spread if spread > 0 else 1.0
        best: _Fit | None = None
        best_score = -np.inf
        for factor in _LENGTH_GRID:
            fit = _Fit(self._points, y, spread * factor, self.noise)
            score = fit.log_marginal_likelihood()
            if best is None or score > best_score:
                best, best_score = fit, score
        assert best is not None  # the grid is not empty
        self._cached = best
        return best

    @property
    def fitted_length_scale(self) -> float | None:
        """Return the length scale in use, or None before any observation."""
        return self._fit().length if len(self._values) else None

    def to_state(self) -> dict[str, Any]:
        """Return the settings and observations as JSON-ready plain lists of floats."""
        return {
            "kind": _STATE_KIND,
            "version": _STATE_VERSION,
            "settings": {
                "length_scale": self.length_scale,
                "noise": self.noise,
                "kappa": self.kappa,
                "pool_size": self.pool_size,
            },
            "points": self._points.tolist() if len(self._values) else [],
            "values": self._values.tolist(),
            "skipped": self.skipped,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> GaussianProcess:
        """Rebuild a surrogate from ``to_state()`` output.

        Raises:
            ValueError: The state is of another kind or version, or is malformed
                (the message names the field).
        """
        if state.get("kind") != _STATE_KIND or state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"state.kind/version: expected {_STATE_KIND!r} version {_STATE_VERSION}"
            )
        settings = state.get("settings")
        if not isinstance(settings, dict):
            raise ValueError("state.settings: expected an object")
        try:
            model = cls(
                length_scale=settings.get("length_scale"),
                noise=settings["noise"],
                kappa=settings["kappa"],
                pool_size=settings["pool_size"],
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"state.settings: missing or invalid {exc.args[0]!s}") from None
        points, values = state.get("points"), state.get("values")
        if not isinstance(points, list) or not isinstance(values, list):
            raise ValueError("state.points/values: expected lists")
        try:
            model.assimilate(points, values)
        except ValueError as exc:
            raise ValueError(f"state.points/values: {exc}") from None
        if len(values) != model.observations:
            raise ValueError("state.values: a stored value is not finite")
        skipped = state.get("skipped", 0)
        if not isinstance(skipped, int) or skipped < 0:
            raise ValueError("state.skipped: expected a non-negative integer")
        model.skipped = skipped
        return model


class _Fit:
    """The Cholesky factor of one kernel matrix and what follows from it."""

    def __init__(self, x: Array, y: Array, length: float, noise: float) -> None:
        self.x, self.y, self.length = x, y, length
        kernel = _rbf(x, x, length)
        jitter = noise
        # Exact duplicates make the kernel singular up to the jitter; grow it
        # rather than fail, since a campaign may re-run a candidate.
        for _ in range(8):
            try:
                self.factor = np.asarray(
                    np.linalg.cholesky(kernel + jitter * np.eye(len(x))), dtype=np.float64
                )
                break
            except np.linalg.LinAlgError:
                jitter *= 10.0
        else:
            raise np.linalg.LinAlgError("kernel matrix is not positive definite")
        self.jitter = jitter
        self.alpha = _solve(self.factor, y)

    def mean(self, points: Array) -> Array:
        """Return the posterior mean (standardised units) at ``points``."""
        mean: Array = _rbf(points, self.x, self.length) @ self.alpha
        return mean

    def whitened(self, points: Array) -> Array:
        """Return ``L^-1 K(X, points)``; the posterior variance is ``1 - sum(rows^2)``."""
        return np.asarray(
            np.linalg.solve(self.factor, _rbf(self.x, points, self.length)), dtype=np.float64
        )

    def log_marginal_likelihood(self) -> float:
        return float(
            -0.5 * self.y @ self.alpha
            - np.log(np.diag(self.factor)).sum()
            - 0.5 * len(self.y) * math.log(2 * math.pi)
        )


def _rbf(a: Array, b: Array, length: float) -> Array:
    """Return the RBF kernel matrix between the rows of ``a`` and ``b``."""
    squared = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    kernel: Array = np.exp(-0.5 * np.clip(squared, 0.0, None) / (length * length))
    return kernel


def _solve(factor: Array, y: Array) -> Array:
    """Solve ``(L L^T) a = y`` for ``a`` given the lower Cholesky factor ``L``."""
    solution: Array = np.linalg.solve(factor.T, np.linalg.solve(factor, y))
    return solution


def _latin_hypercube(rng: np.random.Generator, count: int, dim: int) -> Array:
    """Return ``count`` points in the unit cube, one per stratum along every axis."""
    strata = np.stack([rng.permutation(count) for _ in range(dim)], axis=1)
    unit: Array = (strata + rng.random((count, dim))) / count
    return unit


def _entropy(seed: Seed) -> int | list[int]:
    """Return seed material for ``default_rng``, refusing negative numbers early."""
    values = [seed] if isinstance(seed, int) else list(seed)
    if any(not isinstance(v, int) or v < 0 for v in values):
        raise ValueError("seed must be a non-negative integer or a sequence of them")
    return values[0] if isinstance(seed, int) else values


def _key(point: Array) -> tuple[float, ...]:
    return tuple(round(float(v), DISTINCT_DIGITS) for v in point)


def _to_lists(points: Array) -> list[list[float]]:
    return [[float(v) for v in row] for row in points]
