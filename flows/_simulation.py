"""How a campaign's objective becomes work on the allocation: simulations and the verifier.

The spec's ``objective.simulation`` is either ``"demo"`` (the built-in synthetic
objective, run as a real executable) or an argv that reads one candidate as JSON
on stdin and prints ``{"value": ...}``. The verifier runs the low-fidelity demo
objective on every candidate of a proposal and rejects it, naming the position
and the value, when one is predicted above the spec's limit.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from flows._failpoints import after_call
from flows._spec import LoadedSpec
from tasks._batch import Simulation, launch_batch
from tasks._executor import AllocationExecutor
from tasks._results import ExecutableTask, TaskResult
from tasks._verifier import verifier


def simulation_argv(loaded: LoadedSpec, *, fidelity: str = "high") -> list[str]:
    """Return the argv of one simulation (the demo objective unless the spec names one)."""
    objective = loaded.spec.objective
    if objective.simulation == "demo":
        argv = [sys.executable, "-m", "tasks.demo.objective", "--fidelity", fidelity]
        if objective.simulation_cost and fidelity == "high":
            argv += ["--cost", str(objective.simulation_cost)]
        return argv
    return list(objective.simulation)


def build_run_batch(
    executor: AllocationExecutor, store: Any, loaded: LoadedSpec
) -> Callable[[int, list[list[float]], Callable[[Any], None] | None], Any]:
    """Return the engine's batch launcher: idempotent by (campaign, round, batch content)."""
    objective = loaded.spec.objective
    simulation_id = "demo-objective" if objective.simulation == "demo" else None
    simulation = Simulation.executable(simulation_argv(loaded), id=simulation_id)
    # A crash test kills the process between the launch record and the first task.
    launch_store = after_call(store, "record_batch_launched", "after_batch_launch_recorded")

    async def run_batch(
        round_index: int, candidates: list[list[float]], on_result: Callable[[Any], None] | None
    ) -> Any:
        return await launch_batch(
            executor,
            launch_store,
            campaign=loaded.spec.name,
            round_index=round_index,
            candidates=candidates,
            simulation=simulation,
            on_result=on_result,
        )

    return run_batch


def build_checks(executor: AllocationExecutor, loaded: LoadedSpec) -> list[Callable[[Any], Any]]:
    """Return the gate's checks that run on the allocation (after the cheap ones)."""
    limit = loaded.spec.objective.verifier_limit
    if limit is None:
        return []
    argv = simulation_argv(loaded, fidelity="low")

    def task_for(proposal: Any) -> list[ExecutableTask]:
        return [
            ExecutableTask(argv=argv, stdin=json.dumps({"x": list(c)}).encode())
            for c in proposal.candidates
        ]

    def judge(proposal: Any, results: Sequence[TaskResult]) -> str | None:
        for result in results:
            value = result.value.get("value") if isinstance(result.value, dict) else None
            if isinstance(value, int | float) and value > limit:
                where = ", ".join(f"{x:.3g}" for x in proposal.candidates[result.index])
                return (
                    f"low-fidelity verifier predicts {value:.3g} above the limit {limit:g} "
                    f"for candidate {result.index} at ({where})"
                )
        return None

    return [verifier(executor, task_for=task_for, judge=judge, name="verifier")]
