"""Work on the allocation: executor, simulation batches, verifiers, surrogate, planners."""

from __future__ import annotations

from typing import TYPE_CHECKING

import lazy_loader

if TYPE_CHECKING:
    from tasks._allocations import AllocationRecord, BudgetUsed
    from tasks._batch import (
        BatchOutcome,
        BatchStore,
        MemoryBatchStore,
        Simulation,
        batch_key,
        launch_batch,
        objective_value,
    )
    from tasks._executor import AllocationExecutor
    from tasks._fallback import FallbackBatch, evenly_spaced, fallback_batch
    from tasks._left_open import retire_left_open
    from tasks._planners import (
        LLMPlanner,
        ScriptedPlanner,
        SurrogatePlanner,
        parse_completion,
        reask_messages,
    )
    from tasks._proposal import Bounds, Proposal, candidates_hash, planner_checks
    from tasks._results import (
        BAD_OUTPUT,
        ExecutableTask,
        FunctionTask,
        RetryRecord,
        TaskResult,
        TaskSpec,
        stdout_value,
    )
    from tasks._site import SiteConfig, load_site
    from tasks._site_notify import NotifyConfig
    from tasks._site_slurm import slurm_site_problems
    from tasks._surrogate import GaussianProcess
    from tasks._verifier import verifier

# Loaded on first use: the demo objective runs as ``python -m tasks.demo.objective``
# once per evaluation and must not import numpy, pydantic and httpx every time.
__getattr__, __dir__, _ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_allocations": ["AllocationRecord", "BudgetUsed"],
        "_batch": [
            "BatchOutcome",
            "BatchStore",
            "MemoryBatchStore",
            "Simulation",
            "batch_key",
            "launch_batch",
            "objective_value",
        ],
        "_executor": ["AllocationExecutor"],
        "_fallback": ["FallbackBatch", "evenly_spaced", "fallback_batch"],
        "_left_open": ["retire_left_open"],
        "_planners": [
            "LLMPlanner",
            "ScriptedPlanner",
            "SurrogatePlanner",
            "parse_completion",
            "reask_messages",
        ],
        "_proposal": ["Bounds", "Proposal", "candidates_hash", "planner_checks"],
        "_results": [
            "BAD_OUTPUT",
            "ExecutableTask",
            "FunctionTask",
            "RetryRecord",
            "TaskResult",
            "TaskSpec",
            "stdout_value",
        ],
        "_site": ["SiteConfig", "load_site"],
        "_site_notify": ["NotifyConfig"],
        "_site_slurm": ["slurm_site_problems"],
        "_surrogate": ["GaussianProcess"],
        "_verifier": ["verifier"],
    },
)


__all__: list[str] = [
    "BAD_OUTPUT",
    "AllocationExecutor",
    "AllocationRecord",
    "BatchOutcome",
    "BatchStore",
    "Bounds",
    "BudgetUsed",
    "ExecutableTask",
    "FallbackBatch",
    "FunctionTask",
    "GaussianProcess",
    "LLMPlanner",
    "MemoryBatchStore",
    "NotifyConfig",
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
    "objective_value",
    "parse_completion",
    "planner_checks",
    "reask_messages",
    "retire_left_open",
    "slurm_site_problems",
    "stdout_value",
    "verifier",
]
