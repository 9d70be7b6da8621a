"""Work on the allocation: executor, simulation batches, verifiers, surrogate, planners."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks._batch import (
        BatchOutcome,
        BatchStore,
        MemoryBatchStore,
        Simulation,
        batch_key,
        launch_batch,
    )
    from tasks._executor import AllocationExecutor
    from tasks._fallback import FallbackBatch, evenly_spaced, fallback_batch
    from tasks._planners import (
        LLMPlanner,
        ScriptedPlanner,
        SurrogatePlanner,
        parse_completion,
        reask_messages,
    )
    from tasks._proposal import Bounds, Proposal, candidates_hash, planner_checks
    from tasks._results import ExecutableTask, FunctionTask, RetryRecord, TaskResult, TaskSpec
    from tasks._site import SiteConfig, load_site
    from tasks._surrogate import GaussianProcess
    from tasks._verifier import verifier

# Loaded on first use: the demo objective runs as ``python -m tasks.demo.objective``
# once per evaluation and must not import numpy, pydantic and httpx every time.
_LAZY: dict[str, str] = {
    "AllocationExecutor": "tasks._executor",
    "BatchOutcome": "tasks._batch",
    "BatchStore": "tasks._batch",
    "Bounds": "tasks._proposal",
    "ExecutableTask": "tasks._results",
    "FallbackBatch": "tasks._fallback",
    "FunctionTask": "tasks._results",
    "GaussianProcess": "tasks._surrogate",
    "LLMPlanner": "tasks._planners",
    "MemoryBatchStore": "tasks._batch",
    "Proposal": "tasks._proposal",
    "RetryRecord": "tasks._results",
    "ScriptedPlanner": "tasks._planners",
    "Simulation": "tasks._batch",
    "SiteConfig": "tasks._site",
    "SurrogatePlanner": "tasks._planners",
    "TaskResult": "tasks._results",
    "TaskSpec": "tasks._results",
    "batch_key": "tasks._batch",
    "candidates_hash": "tasks._proposal",
    "evenly_spaced": "tasks._fallback",
    "fallback_batch": "tasks._fallback",
    "launch_batch": "tasks._batch",
    "load_site": "tasks._site",
    "parse_completion": "tasks._planners",
    "planner_checks": "tasks._proposal",
    "reask_messages": "tasks._planners",
    "verifier": "tasks._verifier",
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
    "AllocationExecutor",
    "BatchOutcome",
    "BatchStore",
    "Bounds",
    "ExecutableTask",
    "FallbackBatch",
    "FunctionTask",
    "GaussianProcess",
    "LLMPlanner",
    "MemoryBatchStore",
    "Proposal",
    "RetryRecord",
    "ScriptedPlanner",
    "Simulation",
    "SiteConfig",
    "SurrogatePlanner",
    "TaskResult",
    "TaskSpec",
    "batch_key",
    "candidates_hash",
    "evenly_spaced",
    "fallback_batch",
    "launch_batch",
    "load_site",
    "parse_completion",
    "planner_checks",
    "reask_messages",
    "verifier",
]
