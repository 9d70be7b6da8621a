"""The campaign's surrogate: a Gaussian process that proposes where to look next.

``GaussianProcess`` keeps the evaluated candidates and, when asked, builds a
model from them (``tasks._gp``: Matérn 5/2 with one length scale per
dimension, fitted by maximum a posteriori marginal likelihood) and proposes a
batch (``tasks._acquisition``: expected improvement over a pool of global and
local candidates, one believed pick at a time).

The cost of a proposal is bounded whatever the campaign's length
(``tasks._surrogate_model``): past ``max_points`` observations the model is
built from the points nearest the best one plus an even spread of the rest,
and the hyperparameters are fitted on at most 48 points, on a schedule.

Everything is deterministic for a seed: the model is a function of the
observations alone (no state beyond them), and the same state, bounds, count
and seed give bit-identical candidates on the same machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, get_args

import numpy as np
import numpy.typing as npt

from tasks._acquisition import Acquisition, Box, Scorer, acquire, point_key
from tasks._blas import one_blas_thread
from tasks._gp import Hyperparameters
from tasks._proposal import Bounds
from tasks._surrogate_model import SurrogateModel, fit_basis, fit_on

Array = npt.NDArray[np.float64]
Seed = int | Sequence[int]

_STATE_KIND = "gaussian_process"
_STATE_VERSION = 2
# Version 1 (the isotropic RBF model) stored the same observations and a subset
# of the settings; it loads with the new defaults for the rest.
_OLDER_VERSIONS = (1,)


class GaussianProcess:
    """Model an objective from evaluated candidates and propose where to look next.

    Args:
        length_scale: One length scale (input units) for every dimension, with
            the noise fixed at ``noise``; ``None`` (the default) fits one
            length scale per dimension and the noise.
        noise: The smallest noise (a ratio to the signal variance) on the
            kernel's diagonal; it keeps the fit stable when points repeat.
        kappa: Weight of the standard deviation when ``acquisition="lcb"``.
        pool_size: Candidates scored per proposal (global, local and refined).
        acquisition: ``"ei"`` (expected improvement, the default) or ``"lcb"``
            (the lower confidence bound ``mean - kappa * std``).
        max_points: The most observations the model is built from; past it
            the model is local to the best observation.

    Non-finite values passed to ``assimilate`` (a failed simulation) are skipped
    and counted in ``skipped``; non-finite coordinates raise ``ValueError``.
    """

    def __init__(
        self,
        *,
        length_scale: float | None = None,
        noise: float = 1e-6,
        kappa: float = 2.0,
        pool_size: int = 1024,
        acquisition: Acquisition = "ei",
        max_points: int = 128,
    ) -> None:
        if length_scale is not None and not (math.isfinite(length_scale) and length_scale > 0):
            raise ValueError("length_scale must be a positive finite number or None")
        if not (math.isfinite(noise) and 0 < noise < 1):
            raise ValueError("noise must be a finite number in (0, 1)")
        if not (math.isfinite(kappa) and kappa >= 0):
            raise ValueError("kappa must be a non-negative finite number")
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        if acquisition not in get_args(Acquisition):
            raise ValueError("acquisition must be 'ei' or 'lcb'")
        if max_points < 8:
            raise ValueError("max_points must be at least 8")
        self.length_scale = length_scale
        self.noise = float(noise)
        self.kappa = float(kappa)
        self.pool_size = int(pool_size)
        self.acquisition: Acquisition = acquisition
        self.max_points = int(max_points)
        self.skipped = 0
        self._points: Array = np.empty((0, 0))
        self._values: Array = np.empty(0)
        self._cached: SurrogateModel | None = None
        self._fitted: tuple[int, Hyperparameters] | None = None
        self._taken: set[tuple[float, ...]] = set()

    def __repr__(self) -> str:
        return (
            f"GaussianProcess(observations={len(self._values)}, dim={self.dim}, "
            f"acquisition={self.acquisition!r}, length_scale={self.length_scale!r}, "
            f"noise={self.noise!r})"
        )

    @property
    def dim(self) -> int | None:
        """Return the candidates' dimension, or None before any observation."""
        return int(self._points.shape[1]) if len(self._values) else None

    @property
    def observations(self) -> int:
        """Return the number of assimilated (finite) observations."""
        return len(self._values)

    @property
    def best_value(self) -> float | None:
        """Return the lowest value assimilated so far (None before any)."""
        return float(self._values.min()) if len(self._values) else None

    @property
    def fitted_length_scales(self) -> tuple[float, ...] | None:
        """Return the length scale of each dimension in input units, or None without data."""
        if not len(self._values):
            return None
        with one_blas_thread():
            model = self._model()
        return tuple(float(v) for v in model.hyper.lengths * model.span)

    @property
    def fitted_length_scale(self) -> float | None:
        """Return the geometric mean of ``fitted_length_scales``, or None without data."""
        scales = self.fitted_length_scales
        return None if scales is None else math.exp(sum(map(math.log, scales)) / len(scales))

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
        self._taken.update(point_key(point) for point in x[keep])
        return skipped

    def predict(self, points: Sequence[Sequence[float]] | Array) -> tuple[Array, Array]:
        """Return the posterior mean and standard deviation at ``points``.

        Past ``max_points`` observations the model describes the neighbourhood
        of the best observation; far from it the answer is closer to the prior.
        """
        x = np.asarray(points, dtype=np.float64)
        if x.ndim != 2:
            raise ValueError("points must be a list of coordinate lists")
        if not len(self._values):
            return np.zeros(len(x)), np.ones(len(x))
        if x.shape[1] != self.dim:
            raise ValueError(f"points have {x.shape[1]} coordinates; the surrogate has {self.dim}")
        with one_blas_thread():
            model = self._model()
            mean, std = model.posterior.mean_and_std(model.scaled(x))
        return mean * model.value_scale + model.value_offset, std * model.value_scale

    def propose(self, count: int, bounds: Bounds, seed: Seed) -> list[list[float]]:
        """Return ``count`` distinct candidates in ``bounds`` chosen by the acquisition.

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
        low = np.asarray(bounds.lower, dtype=np.float64)
        box = Box(low, np.asarray(bounds.upper, dtype=np.float64) - low)
        if not len(self._values):
            return _to_lists(box.low + _latin_hypercube(rng, count, bounds.dim) * box.width)
        score = Scorer(self.acquisition, self.kappa)
        with one_blas_thread():
            batch = acquire(self._model(), rng, box, count, self.pool_size, score, self._taken)
        return _to_lists(batch)

    def _model(self) -> SurrogateModel:
        """Return the model of the current observations (built once per new data)."""
        if self._cached is None:
            self._cached = SurrogateModel.build(
                self._points, self._values, self._hyperparameters(), self.noise, self.max_points
            )
        return self._cached

    def _hyperparameters(self) -> Hyperparameters:
        """Return the hyperparameters in input units, refitted on the fit schedule.

        They are fitted on the first ``fit_basis(n)`` observations, so they
        are a function of the observations alone, and kept in memory until the
        basis moves: a proposal between two refits only rebuilds the posterior.
        """
        assert self.dim is not None  # callers have data
        if self.length_scale is not None:
            return Hyperparameters(np.full(self.dim, self.length_scale), 0.0)
        basis = fit_basis(len(self._values))
        if self._fitted is None or self._fitted[0] != basis:
            hyper = fit_on(self._points[:basis], self._values[:basis], self.noise)
            self._fitted = (basis, hyper)
        return self._fitted[1]

    def to_state(self, since: int = 0) -> dict[str, Any]:
        """Return the settings and observations as JSON-ready plain lists of floats.

        With ``since`` > 0 only the observations from that number on are in it, and
        ``"since"`` says so: an increment, which :meth:`from_states` appends to the
        states before it. A campaign saves one per round, so what it writes per round
        does not grow with the observations.
        """
        if not 0 <= since <= self.observations:
            raise ValueError(f"since: {since} is not within 0..{self.observations}")
        state: dict[str, Any] = {
            "kind": _STATE_KIND,
            "version": _STATE_VERSION,
            "settings": {
                "length_scale": self.length_scale,
                "noise": self.noise,
                "kappa": self.kappa,
                "pool_size": self.pool_size,
                "acquisition": self.acquisition,
                "max_points": self.max_points,
            },
            "points": self._points[since:].tolist() if len(self._values) else [],
            "values": self._values[since:].tolist(),
            "skipped": self.skipped,
        }
        if since:
            state["since"] = since
        return state

    @classmethod
    def from_states(cls, states: Sequence[dict[str, Any]]) -> GaussianProcess:
        """Rebuild a surrogate from saved states in order: a whole one, then increments.

        The newest whole state (no ``"since"``) is the start; each increment after
        it must continue from exactly the observations before it.

        Raises:
            ValueError: No whole state, an increment that does not continue the
                ones before it, or a malformed state (the message names it).
        """
        whole = [i for i, state in enumerate(states) if not state.get("since")]
        if not whole:
            raise ValueError("state: every saved state continues another; the first is missing")
        model = cls.from_state(dict(states[whole[-1]]))
        for position in range(whole[-1] + 1, len(states)):
            since = states[position].get("since")
            if since != model.observations:
                raise ValueError(
                    f"state {position}.since: {since!r}, but {model.observations} "
                    "observations come before it"
                )
            increment = cls.from_state({**states[position], "since": 0})
            if increment.observations:
                model.assimilate(increment._points.tolist(), increment._values.tolist())
            model.skipped = increment.skipped
        return model

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> GaussianProcess:
        """Rebuild a surrogate from ``to_state()`` output (version 2, or version 1).

        A version-1 state (the earlier isotropic model) keeps its observations,
        skip count and settings; the settings it did not have take their
        defaults, so it proposes with the current method.

        Raises:
            ValueError: The state is of another kind or version, or is malformed
                (the message names the field).
        """
        if state.get("since"):
            raise ValueError("state.since: an increment of another state (load with from_states)")
        version = state.get("version")
        if state.get("kind") != _STATE_KIND or (
            version != _STATE_VERSION and version not in _OLDER_VERSIONS
        ):
            raise ValueError(
                f"state.kind/version: expected {_STATE_KIND!r} version {_STATE_VERSION} "
                f"(or {', '.join(map(str, _OLDER_VERSIONS))}), "
                f"got {state.get('kind')!r} version {version!r}"
            )
        settings = state.get("settings")
        if not isinstance(settings, dict):
            raise ValueError("state.settings: expected an object")
        try:
            newer = (
                {
                    "acquisition": settings["acquisition"],
                    "max_points": settings["max_points"],
                }
                if version == _STATE_VERSION
                else {}
            )
            model = cls(
                length_scale=settings.get("length_scale"),
                noise=settings["noise"],
                kappa=settings["kappa"],
                pool_size=settings["pool_size"],
                **newer,
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"state.settings: missing or invalid {exc.args[0]!s}") from None
        except ValueError as exc:
            raise ValueError(f"state.settings: {exc}") from None
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


def _to_lists(points: Array) -> list[list[float]]:
    return [[float(v) for v in row] for row in points]
