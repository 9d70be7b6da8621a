"""The deterministic batch a round runs when no proposal passes the gate.

``fallback_batch`` is computed (and recorded, with its hash) before the round's
first inference, so a campaign whose fallback cannot be built stops before it
spends anything. It tries the surrogate's batch, degrades to an evenly spaced
lattice over the bounds when that fails the checks, and raises
``policies.FallbackUnavailable`` when even the lattice cannot pass.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from acceptance import Rejected
from policies import FallbackUnavailable
from tasks._proposal import Bounds, Proposal, candidates_hash, planner_checks
from tasks._surrogate import GaussianProcess

# Offsets the lattice's start per seed, so consecutive rounds that fall back do
# not run the same points; a prime keeps the offsets from lining up with counts.
_SEED_STRIDE = 1_000_003


class FallbackBatch(BaseModel):
    """A batch built without a model, valid by construction, with its content hash."""

    model_config = ConfigDict(frozen=True)

    candidates: tuple[tuple[float, ...], ...] = Field(description="The batch, in order.")
    content_hash: str = Field(description="sha256 of the candidates' canonical JSON.")
    source: Literal["surrogate", "grid"] = Field(description="Which builder produced it.")
    degraded_by: str | None = Field(
        default=None,
        description="Why the surrogate's batch was not used (check and reason); None if it was.",
    )

    def to_proposal(self) -> Proposal:
        """Return the batch as a ``Proposal`` for the accept gate's fallback."""
        return Proposal(
            rationale=f"deterministic fallback ({self.source}), sha256 {self.content_hash}",
            candidates=[list(candidate) for candidate in self.candidates],
        )


def fallback_batch(
    surrogate: GaussianProcess,
    bounds: Bounds,
    count: int,
    seed: int,
    *,
    checks: Sequence[Callable[[Any], Any]] | None = None,
) -> FallbackBatch:
    """Build the round's deterministic fallback: the surrogate's batch, else a lattice.

    Args:
        surrogate: Proposes the first choice (a Latin hypercube when it has no data).
        bounds: The box every candidate must lie in.
        count: The batch size.
        seed: The round's seed; the same inputs give the same batch and hash.
        checks: Synchronous checks both batches must pass (``Rejected`` to
            refuse); ``planner_checks(bounds, count)`` when None.

    Raises:
        FallbackUnavailable: ``count`` is below 1, the surrogate's dimension
            differs from the bounds', or no batch passes the checks.
    """
    if count < 1:
        raise FallbackUnavailable(
            f"batch size must be at least 1, got {count}", details={"field": "count"}
        )
    if seed < 0:
        raise FallbackUnavailable("seed must be non-negative", details={"field": "seed"})
    if surrogate.dim is not None and surrogate.dim != bounds.dim:
        raise FallbackUnavailable(
            f"the surrogate has {surrogate.dim} coordinates and the bounds have {bounds.dim}",
            details={"field": "bounds", "surrogate_dim": surrogate.dim, "bounds_dim": bounds.dim},
        )
    checks = planner_checks(bounds, count) if checks is None else checks

    degraded_by: str | None
    try:
        candidates = surrogate.propose(count, bounds, seed)
    except (ValueError, np.linalg.LinAlgError) as exc:
        degraded_by = f"surrogate: {type(exc).__name__}"
    else:
        degraded_by = _first_rejection(candidates, checks)
        if degraded_by is None:
            return _batch(candidates, "surrogate", None)

    lattice = evenly_spaced(bounds, count, seed)
    rejection = _first_rejection(lattice, checks)
    if rejection is not None:
        raise FallbackUnavailable(
            f"no fallback batch of {count} passes the checks; the lattice was rejected by "
            + rejection,
            details={"count": count, "dim": bounds.dim, "surrogate": degraded_by},
        )
    return _batch(lattice, "grid", degraded_by)


def evenly_spaced(bounds: Bounds, count: int, seed: int) -> list[list[float]]:
    """Return ``count`` points of a Kronecker (R_d) lattice scaled into ``bounds``.

    The lattice uses the generalised golden ratio of dimension ``d``, which
    spreads any number of points evenly; ``seed`` picks where it starts.
    """
    dim = bounds.dim
    phi = _generalised_golden_ratio(dim)
    alpha = np.array([phi ** -(j + 1) for j in range(dim)])
    start = (seed % _SEED_STRIDE) * count
    index = np.arange(start + 1, start + count + 1, dtype=np.float64)[:, None]
    unit = np.mod(0.5 + index * alpha, 1.0)
    low = np.asarray(bounds.lower)
    high = np.asarray(bounds.upper)
    points = np.clip(low + unit * (high - low), low, high)
    return [[float(v) for v in row] for row in points]


def _generalised_golden_ratio(dim: int) -> float:
    """Return the positive root of ``x^(d+1) = x + 1`` by fixed-point iteration."""
    x = 2.0
    for _ in range(64):
        x = math.pow(1.0 + x, 1.0 / (dim + 1))
    return x


def _first_rejection(
    candidates: list[list[float]], checks: Sequence[Callable[[Any], Any]]
) -> str | None:
    """Return ``"<check>: <reason>"`` for the first check that rejects, or None."""
    proposal = Proposal.model_construct(rationale="fallback", candidates=candidates)
    for check in checks:
        try:
            result = check(proposal)
        except Rejected as exc:
            name = exc.check or getattr(check, "__name__", type(check).__name__)
            return f"{name}: {exc.reason}"
        if inspect.isawaitable(result):
            close = getattr(result, "close", None)
            if callable(close):
                close()
            raise TypeError("fallback checks must be synchronous")
    return None


def _batch(
    candidates: list[list[float]], source: Literal["surrogate", "grid"], degraded_by: str | None
) -> FallbackBatch:
    return FallbackBatch(
        candidates=tuple(tuple(candidate) for candidate in candidates),
        content_hash=candidates_hash(candidates),
        source=source,
        degraded_by=degraded_by,
    )
