"""Work on the allocation: executor, simulation batches, verifiers, surrogate, planners."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks._fallback import FallbackBatch, evenly_spaced, fallback_batch
    from tasks._planners import (
        LLMPlanner,
        ScriptedPlanner,
        SurrogatePlanner,
        parse_completion,
        reask_messages,
    )
    from tasks._proposal import Bounds, Proposal, candidates_hash, planner_checks
    from tasks._surrogate import GaussianProcess

# Loaded on first use: the demo objective runs as ``python -m tasks.demo.objective``
# once per evaluation and must not import numpy, pydantic and httpx every time.
_LAZY: dict[str, str] = {
    "Bounds": "tasks._proposal",
    "FallbackBatch": "tasks._fallback",
    "GaussianProcess": "tasks._surrogate",
    "LLMPlanner": "tasks._planners",
    "Proposal": "tasks._proposal",
    "ScriptedPlanner": "tasks._planners",
    "SurrogatePlanner": "tasks._planners",
    "candidates_hash": "tasks._proposal",
    "evenly_spaced": "tasks._fallback",
    "fallback_batch": "tasks._fallback",
    "parse_completion": "tasks._planners",
    "planner_checks": "tasks._proposal",
    "reask_messages": "tasks._planners",
}


def __getattr__(name: str) -> Any:
    """Import a lazily exported name on first access."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tasks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__: list[str] = [
    "Bounds",
    "FallbackBatch",
    "GaussianProcess",
    "LLMPlanner",
    "Proposal",
    "ScriptedPlanner",
    "SurrogatePlanner",
    "candidates_hash",
    "evenly_spaced",
    "fallback_batch",
    "parse_completion",
    "planner_checks",
    "reask_messages",
]
