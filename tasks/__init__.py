"""Work on the allocation: executor, simulation batches, verifiers, surrogate, planners."""

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
