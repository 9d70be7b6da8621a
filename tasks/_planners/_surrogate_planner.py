"""``SurrogatePlanner``: propose the surrogate's acquisition batch as a producer."""

from __future__ import annotations

from typing import Any

from acceptance import Attempt
from tasks._proposal import Bounds, Proposal
from tasks._surrogate import GaussianProcess


class SurrogatePlanner:
    """Propose the surrogate's acquisition batch (expected improvement by default).

    A re-ask (``previous`` not empty) draws a fresh random pool from the seed
    material ``[seed, len(previous)]``, so it does not repeat a rejected batch.
    """

    def __init__(self, surrogate: GaussianProcess, bounds: Bounds, count: int, seed: int) -> None:
        if count < 1:
            raise ValueError("count must be at least 1")
        if seed < 0:
            raise ValueError("seed must be non-negative")
        self.surrogate = surrogate
        self.bounds = bounds
        self.count = count
        self.seed = seed

    def __repr__(self) -> str:
        return f"SurrogatePlanner(count={self.count}, dim={self.bounds.dim}, seed={self.seed})"

    async def __call__(self, previous: tuple[Attempt[Any], ...]) -> Proposal:
        """Return the surrogate's batch for this attempt."""
        offset = len(previous)
        seed = self.seed if offset == 0 else [self.seed, offset]
        candidates = self.surrogate.propose(self.count, self.bounds, seed)
        if self.surrogate.observations:
            acquisition = (
                f"lower confidence bound (kappa={self.surrogate.kappa:g})"
                if self.surrogate.acquisition == "lcb"
                else "expected improvement"
            )
            how = (
                f"{acquisition} over {self.surrogate.pool_size} candidates "
                f"(global and around the best points), "
                f"{self.surrogate.observations} observations"
            )
        else:
            how = "Latin hypercube (no observations yet)"
        rationale = f"{how}; seed {self.seed}, re-ask {offset}"
        return Proposal(rationale=rationale, candidates=candidates)
