"""A synthetic objective on ``[0, 1]^d`` for demo campaigns, runnable as an executable."""

from tasks.demo._objective import FIDELITIES, main, minimiser, objective

__all__ = ["FIDELITIES", "main", "minimiser", "objective"]
