"""Fixtures for the policy tests: a factory of round contexts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from policies import BatchSummary, RoundContext, proposal_key

MakeContext = Callable[..., RoundContext]


def build_context(
    *,
    candidates: list[list[float]] | None = None,
    node_hours: float = 1.0,
    **fields: Any,
) -> RoundContext:
    """Return a round context; ``fields`` override the defaults."""
    rows = [[0.1, 0.2], [0.3, 0.4]] if candidates is None else candidates
    values: dict[str, Any] = {
        "campaign": "demo",
        "round_index": 0,
        "attempt": 1,
        "batch": BatchSummary(size=len(rows), candidates=rows, node_hours=node_hours),
        "proposal_key": proposal_key(rows),
        "disposition": "accepted",
        "consecutive_fallbacks": 0,
        "budget_spent": 0.0,
        "budget_remaining": 100.0,
    }
    values.update(fields)
    return RoundContext(**values)


@pytest.fixture
def make_ctx() -> MakeContext:
    """Return the round-context factory."""
    return build_context
