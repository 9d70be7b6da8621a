"""How a campaign's objective becomes work on the allocation: simulations and the verifier.

The spec's ``objective.simulation`` is either ``"demo"`` (the built-in synthetic
objective, run as a real executable) or an argv that reads one candidate as JSON
on stdin and prints ``{"value": ...}``. The verifier runs the low-fidelity demo
objective on every candidate of a proposal and rejects it, naming the position
and the value, when one is predicted above the spec's limit.

Launches are walltime-aware: before the verifier, the site's cost model must fit
the verifier *and* the batch after it into what is left of the allocation, and
before the batch, the batch; otherwise the executor asks for the next allocation
first (``AllocationExecutor.ensure_time``). Tasks interrupted by an allocation's
end are relaunched there (``launch_batch``, the verifier's ``run_until_done``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from flows._engine._failpoints import after_call, failpoint
from flows._engine._gate_replay import VERIFIER_CHECK, ProposalCheck, ProposalScore
from flows._engine._round import OnResult, RunBatch
from flows._engine._store import AsyncCampaignStore, SimulationResult
from flows._paths import python_argv
from flows._provenance._rows import PREDICTION_SCORE
from flows._spec import LoadedSpec
from tasks import (
    AllocationExecutor,
    ExecutableTask,
    Proposal,
    Simulation,
    SiteConfig,
    TaskResult,
    launch_batch,
    objective_value,
    verifier,
)

if TYPE_CHECKING:
    from tasks import BatchStore


def simulation_argv(loaded: LoadedSpec, *, fidelity: str = "high") -> list[str]:
    """Return the argv of one simulation (the demo objective unless the spec names one)."""
    objective = loaded.spec.objective
    if objective.simulation == "demo":
        argv = python_argv("-m", "tasks.demo.objective", "--fidelity", fidelity)
        if objective.simulation_cost and fidelity == "high":
            argv += ["--cost", str(objective.simulation_cost)]
        return argv
    argv = list(objective.simulation)
    if argv and "/" in argv[0]:
        # ./sim.py is the spec's folder's, wherever the runner runs; symlinks are kept
        # (a venv's python is one).
        program = Path(argv[0]).expanduser()
        argv[0] = os.path.normpath(program if program.is_absolute() else loaded.directory / program)
    return argv


def campaign_simulation(loaded: LoadedSpec) -> Simulation:
    """Return the campaign's simulation: its argv, its id in batch keys, what it must write.

    A result with no objective in it (``tasks.objective_value``) is a failed task,
    ``bad_output``, not a success. ``check`` runs this very simulation once.
    """
    simulation_id = "demo-objective" if loaded.spec.objective.simulation == "demo" else None
    return Simulation.executable(simulation_argv(loaded), id=simulation_id, reads=objective_value)


def build_run_batch(
    executor: AllocationExecutor,
    store: AsyncCampaignStore,
    loaded: LoadedSpec,
    site: SiteConfig | None = None,
) -> RunBatch:
    """Return the engine's batch launcher: idempotent by (campaign, round, batch content).

    With ``site``, a batch the site's cost model says cannot finish before the
    allocation ends is launched in the next allocation instead.

    ``tasks.launch_batch`` calls its ``BatchStore`` synchronously: it gets the
    store's blocking face (the same worker thread, in turn), which it calls before
    the batch's first task and after its last, never while a task waits to start.
    """
    simulation = campaign_simulation(loaded)
    # A crash test kills the process between the launch record and the first task.
    launch_store = after_call(
        store.blocking, "record_batch_launched", "after_batch_launch_recorded"
    )

    async def run_batch(
        round_index: int, candidates: list[list[float]], on_result: OnResult | None
    ) -> Sequence[SimulationResult]:
        outcome = await launch_batch(
            executor,
            # A reused batch comes back as the store's ``TaskResultRecord`` rows, which
            # carry every ``TaskResult`` attribute the engine reads (``SimulationResult``).
            cast("BatchStore", launch_store),
            campaign=loaded.spec.name,
            round_index=round_index,
            candidates=candidates,
            simulation=simulation,
            on_result=on_result,
            seconds_for=site.batch_seconds if site is not None else None,
        )
        return outcome.results

    return run_batch


def build_gate(
    executor: AllocationExecutor, loaded: LoadedSpec, site: SiteConfig | None = None
) -> tuple[list[ProposalCheck], list[ProposalScore]]:
    """Return the gate's checks that run on the allocation, and the scores they feed.

    The verifier's highest predicted value over a proposal's candidates is its
    score ``verifier_prediction``: read from the verifier's own run, not run again.
    With ``site``, the verifier first makes sure the allocation has time for the
    verifier tasks and the batch that follows them.
    """
    limit = loaded.spec.objective.verifier_limit
    if limit is None:
        return [], []
    argv = simulation_argv(loaded, fidelity="low")
    # The gate scores the very value it has just checked, one attempt at a time.
    last: dict[int, float] = {}
    each: dict[int, dict[int, float]] = {}

    def task_for(proposal: Proposal) -> list[ExecutableTask]:
        return [
            ExecutableTask(argv=argv, stdin=json.dumps({"x": list(c)}).encode())
            for c in proposal.candidates
        ]

    def judge(proposal: Proposal, results: Sequence[TaskResult]) -> str | None:
        failpoint("mid_verifier")  # its tasks ran; nothing of its verdict is recorded
        predicted = [
            float(value)
            for value in (
                r.value.get("value") if isinstance(r.value, dict) else None for r in results
            )
            if isinstance(value, int | float)
        ]
        last.clear()
        each.clear()
        if predicted:
            last[id(proposal)] = max(predicted)
        each[id(proposal)] = {
            result.index: float(result.value["value"])
            for result in results
            if isinstance(result.value, dict) and isinstance(result.value.get("value"), int | float)
        }
        for result in results:
            value = result.value.get("value") if isinstance(result.value, dict) else None
            if isinstance(value, int | float) and value > limit:
                where = ", ".join(f"{x:.3g}" for x in proposal.candidates[result.index])
                return (
                    f"low-fidelity verifier predicts {value:.3g} above the limit {limit:g} "
                    f"for candidate {result.index} at ({where})"
                )
        return None

    def prediction(proposal: Proposal) -> float:
        return last.get(id(proposal), math.nan)

    prediction.__name__ = PREDICTION_SCORE

    def candidate_prediction(position: int) -> ProposalScore:
        # Recorded with the attempt, so candidate rules judge a replay as they judged the run.
        def score(proposal: Proposal) -> float:
            return each.get(id(proposal), {}).get(position, math.nan)

        score.__name__ = f"{PREDICTION_SCORE}.{position}"
        return score

    per_candidate = [candidate_prediction(i) for i in range(loaded.spec.batch_size)]
    check = verifier(executor, task_for=task_for, judge=judge, name=VERIFIER_CHECK)
    scores = [prediction, *per_candidate]
    if site is None:
        return [check], scores

    async def verifier_in_time(proposal: Proposal) -> dict[str, Any]:
        size = len(proposal.candidates)
        # One verifier wave must finish where it is launched (the unit of this work).
        unit = site.batch_seconds(0, verifiers=1)
        await executor.ensure_time(site.batch_seconds(size, verifiers=size), unit=unit)
        return await check(proposal)  # where its tasks ran: the verdict's details

    verifier_in_time.__name__ = verifier_in_time.__qualname__ = VERIFIER_CHECK
    return [verifier_in_time], scores
