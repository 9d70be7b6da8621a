"""One campaign, round after round, without Prefect: the gate, the policy, approvals, the batch.

``CampaignEngine`` is replay-safe: it can be started again from the top at any
point (after a suspend, a crash, a restart) and reads the provenance database to
skip what is done. Inference and batch launches are never repeated: recorded
attempts are replayed from the database, and a batch's idempotency key returns
its recorded results. The Prefect flow (``flows._prefect._campaign``) drives it with hooks
that turn steps into Prefect tasks and approvals into ``suspend_flow_run``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeAlias, TypeVar, assert_never

from opentelemetry import trace

from acceptance import Attempt, Outcome
from flows._engine._answers import AnswerJournal
from flows._engine._approval import (
    Answer,
    ApprovalRequest,
)
from flows._engine._asking import ask_approval
from flows._engine._campaign_state import (
    PlannerSlot,
    build_policy,
    build_surrogate,
    derive_seed,
)
from flows._engine._candidates import CandidateLedger, candidate_predictions
from flows._engine._counters import Counters
from flows._engine._failpoints import failpoint, failpoint_in_commit
from flows._engine._gate_replay import ProposalCheck, ProposalScore, call_gate, verifier_hours
from flows._engine._moves import (
    AwaitApproval,
    Launch,
    Reask,
    Stop,
    next_move,
    policy_feedback,
)
from flows._engine._proof import ApproverCodes
from flows._engine._round_context import PlannedBatch, RoundFacts, judge_call, round_context
from flows._engine._store import AsyncCampaignStore, SimulationResult
from flows._provenance import (
    CampaignStatus,
    DecisionMismatch,
    GateCallEnd,
)
from flows._settings import Settings
from flows._spec import LoadedSpec
from policies import (
    CODES,
    BudgetExceeded,
    Decision,
    PolicyDenied,
    RoundContext,
    UnattendedError,
    classify,
)
from tasks import (
    Bounds,
    FallbackBatch,
    Proposal,
    fallback_batch,
    objective_value,
)

log = logging.getLogger("unattended.campaign")
tracer = trace.get_tracer("unattended.flows")
T = TypeVar("T")


class Step(Protocol):
    """How the orchestrator runs one step of a round (a plain await, or a Prefect task)."""

    def __call__(self, name: str, fn: Callable[[], Awaitable[T]], /) -> Awaitable[T]:
        """Run ``fn`` as the step called ``name``; return its result."""
        ...


Suspender = Callable[[ApprovalRequest, int], Awaitable[Answer]]
OnResult = Callable[[SimulationResult], None]
# ``async (round_index, candidates, on_result) -> results``: one batch, launched idempotently.
RunBatch = Callable[
    [int, list[list[float]], OnResult | None], Awaitable[Sequence[SimulationResult]]
]
# How a stopped campaign ends; the error that stopped it carries the stable code.
StopStatus: TypeAlias = Literal["blocked", "escalated", "failed"]
TERMINAL: frozenset[CampaignStatus] = frozenset({"completed", "blocked", "escalated", "failed"})


def decision_record(decision: Decision) -> dict[str, Any]:
    """Return the policy decision as a provenance row (its kind is the ``outcome`` column)."""
    record = decision.to_record()
    return {"outcome": record.pop("kind"), **record}


async def run_directly(name: str, fn: Callable[[], Awaitable[T]]) -> T:
    """Run a step as a plain coroutine (no Prefect task)."""
    return await fn()


@dataclass
class Hooks:
    """How the engine meets its orchestrator."""

    step: Step = run_directly
    suspend: Suspender | None = None
    flow_run_id: str | None = None
    on_event: Callable[[str, Mapping[str, Any]], None] = lambda kind, data: None


@dataclass(frozen=True)
class CampaignResult:
    """How a campaign ended (or paused)."""

    status: CampaignStatus
    error_code: str | None = None
    rounds_completed: int = 0
    message: str = ""


def stop_status(error: UnattendedError) -> StopStatus:
    """Return how a campaign stopped by ``error`` ends (its ``run_status``, else failed)."""
    match error.run_status:
        case "blocked" | "escalated" as status:
            return status
        case "awaiting_approval" | None:  # a pause is not a way to stop: the run failed
            return "failed"
        case _:
            assert_never(error.run_status)


@dataclass
class CampaignEngine:
    """Run a campaign's rounds against its store, executor and planner.

    Args:
        loaded: The validated spec.
        store: The provenance store (also the checkpoint and the batch store), awaited:
            ``StoreThread`` runs a ``ProvenanceStore``'s calls off the event loop, in order.
        run_batch: ``async (round_index, candidates, on_result) -> results``: launches
            one batch idempotently (``tasks.launch_batch`` bound to an executor).
        checks: The gate's checks after the planner's cheap ones (e.g. a verifier).
        scores: Soft signals recorded on an accepted attempt (e.g. the verifier's prediction).
        node_hours_per_simulation: The site's cost model.
        hooks: Steps, approvals and progress.
        env: Environment for secrets and the allocation's window (``flows._settings``).
        walltime_seconds: The site's ``scheduler.walltime``: with the allocation's
            start it gives the end when the environment names no end.
        node_hours_per_verifier: The site's cost of one verifier task; every
            candidate the gate's verifier judged counts in the budget policies see.
        allocation_end: When the allocation running the tasks ends (epoch seconds), if
            known: the executor's view of the site's own batch jobs. The policies'
            walltime comes from it first, else from the environment's window.
    """

    loaded: LoadedSpec
    store: AsyncCampaignStore
    run_batch: RunBatch
    node_hours_per_simulation: float
    checks: list[ProposalCheck] = field(default_factory=list)
    scores: list[ProposalScore] = field(default_factory=list)
    hooks: Hooks = field(default_factory=Hooks)
    env: Mapping[str, str] = field(default_factory=dict)
    answers: AnswerJournal | None = None
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    walltime_seconds: float | None = None
    node_hours_per_verifier: float = 0.0
    approver_codes: ApproverCodes | None = None  # for rules that require proof
    allocation_end: Callable[[], float | None] | None = None

    def __post_init__(self) -> None:
        spec = self.loaded.spec
        # Read once: a bad variable stops the campaign before anything is recorded.
        self.allocation = Settings.from_env(self.env).allocation_window(self.walltime_seconds)
        self.name = spec.name
        self.bounds = Bounds(lower=tuple(spec.objective.lower), upper=tuple(spec.objective.upper))
        # Read before anything of the engine runs (a constructor cannot await).
        checkpoint = self.store.blocking.load_checkpoint(self.name)
        self.checkpoint = checkpoint
        policy_state = checkpoint.policy_state or {}
        self.policy = build_policy(self.loaded, policy_state.get("policy"))
        self.counters = Counters.from_state(policy_state.get("campaign"), checkpoint.decisions)
        self.surrogate = build_surrogate(checkpoint.surrogate_states)
        # Observations already in the record: a round's checkpoint saves those after.
        self.saved_observations = self.surrogate.observations
        self.planner = PlannerSlot(self.loaded, self.bounds, checkpoint.planner_state, self.env)
        first = checkpoint.last_completed_round
        self.next_round = 0 if first is None else first + 1
        # Rounds run in order and each is checkpointed before the next starts, so the
        # only round that can hold decisions this engine did not make is its first.
        self.replayed_round = self.next_round

    async def run(self) -> CampaignResult:
        """Run every remaining round; return how the campaign ended."""
        # One span per (re)start of the campaign: the gate's spans nest under it.
        with tracer.start_as_current_span(
            f"campaign {self.name}",
            attributes={
                "unattended.campaign": self.name,
                "unattended.first_round": self.next_round,
            },
        ):
            return await self._run_rounds()

    async def _run_rounds(self) -> CampaignResult:
        spec = self.loaded.spec
        for index in range(self.next_round, spec.rounds):
            try:
                await self.run_round(index)
            except UnattendedError as exc:
                # The one way a round stops the campaign: an error of the taxonomy.
                status = stop_status(exc)
                await self.store.set_campaign_status(self.name, status, exc.code, round_index=index)
                event = "failed" if status == "failed" else "stopped"
                self.hooks.on_event(event, {"round": index, "status": status, "code": exc.code})
                return CampaignResult(status, exc.code, index, exc.message)
            except Exception as exc:
                # Unexpected: record the stable code, then let the orchestrator see the crash.
                # (Prefect's suspend signal is a BaseException and passes through untouched.)
                await self.store.set_campaign_status(self.name, "failed", classify(exc).code)
                self.hooks.on_event("failed", {"round": index, "code": classify(exc).code})
                raise
        if self.counters.tasks_done == 0 and spec.rounds > 0:
            # Every round ran and no simulation gave a value: that is no success.
            code = self.counters.last_failure_code or "task_failed"
            code = code if code in CODES else "task_failed"
            await self.store.set_campaign_status(
                self.name, "failed", code, round_index=spec.rounds - 1
            )
            self.hooks.on_event("failed", {"round": spec.rounds - 1, "code": code})
            return CampaignResult(
                "failed",
                code,
                spec.rounds,
                f"all {spec.rounds} round(s) ran but no simulation produced a value the "
                f"objective reads; the last batch's tasks failed with {code}",
            )
        await self.store.set_campaign_status(self.name, "completed", None)
        self.hooks.on_event("completed", {"rounds": spec.rounds})
        return CampaignResult("completed", None, spec.rounds, "all rounds completed")

    async def run_round(self, index: int) -> None:
        """Run one round: fallback first, gate, policy, approval, batch, checkpoint."""
        with tracer.start_as_current_span(
            f"round {index}",
            attributes={"unattended.campaign": self.name, "unattended.round": index},
        ):
            await self._run_round(index)

    async def _run_round(self, index: int) -> None:
        spec = self.loaded.spec
        # The round's record starts with its first gate call's (one commit, not two).
        started_at = datetime.now(UTC)
        self.hooks.on_event("round", {"round": index, "of": spec.rounds})
        feedback: list[Attempt[Any]] = []
        seq = 0
        call_index = 1
        while True:
            fallback = fallback_batch(
                self.surrogate,
                self.bounds,
                spec.batch_size,
                derive_seed(spec.seed, index, call_index),
            )
            gate_id = await self.store.record_gate_call(
                self.name,
                index,
                call_index,
                gate="planner",
                budget=spec.attempts,
                fallback_hash=fallback.content_hash,
                fallback_value=[list(c) for c in fallback.candidates],
                round_started_at=started_at,
            )
            failpoint("after_fallback_recorded")
            outcome = await self.hooks.step(
                f"gate round {index} call {call_index}",
                functools.partial(call_gate, self, index, gate_id, fallback, feedback),
            )
            failpoint("after_gate")
            # The call's end lands with the decision taken on it, in one commit: a kill
            # before it replays the call from the answer journal, asking nothing again.
            end = GateCallEnd(gate_id, outcome.disposition, len(outcome.attempts), outcome.attempts)
            try:
                # Replayed attempts count the same as fresh ones: the record says what was
                # verified.
                hours = verifier_hours(outcome, self.node_hours_per_verifier)
                self.counters.verifier_hours += hours
                launch = self._launch_of(outcome)
                ledger, decision = await self._judge(index, call_index, outcome, launch, fallback)
                seq += 1
                await self._check_recorded(index, seq, decision)
                move = next_move(
                    decision,
                    ledger,
                    launch,
                    fallback,
                    index=index,
                    call_index=call_index,
                    policy_retries=spec.policy_retries,
                )
                await self.store.record_decision(
                    self.name,
                    index,
                    seq,
                    decision_record(decision),
                    gate_call=end,
                    call_index=call_index,
                    fates=move.fates,
                )
            except Exception:
                await self._end_call(end)  # no decision to record it with: the campaign stops
                raise
            failpoint("after_decision_recorded")
            self.counters.decisions.append(decision.outcome.kind)
            self.hooks.on_event("decision", {"round": index, "outcome": decision.outcome.kind})
            # The one dispatch on the decision: exhaustive over the moves.
            match move:
                case Stop(error=error):
                    raise error
                case Reask():
                    feedback.append(policy_feedback(outcome.value, decision, len(feedback) + 1))
                    call_index += 1
                    continue
                case AwaitApproval(ask=ask):
                    launch = await ask_approval(
                        self, index, call_index, decision, ask, launch, fallback, ledger
                    )
                case Launch():
                    pass
                case _:
                    assert_never(move)
            break
        await self._run_batch(index, launch)

    def _launch_of(self, outcome: Outcome[Proposal]) -> PlannedBatch:
        candidates = [list(map(float, c)) for c in outcome.value.candidates]
        hours = len(candidates) * self.node_hours_per_simulation
        rationale = getattr(outcome.value, "rationale", "") or ""
        return PlannedBatch(candidates, outcome.disposition, hours, rationale=str(rationale))

    async def _judge(
        self,
        index: int,
        call_index: int,
        outcome: Outcome[Proposal],
        launch: PlannedBatch,
        fallback: FallbackBatch,
    ) -> tuple[CandidateLedger, Decision]:
        """Judge the call's batch (candidate rules, then the round's rules); thin ``launch``.

        The one judgement ``replay`` makes too (``judge_call``). Refusals are recorded with
        the decision, or here if the candidate rules left nothing to decide on.
        """
        predictions = candidate_predictions(outcome.attempts, len(launch.candidates))
        if launch.disposition != "accepted":
            predictions = [None] * len(launch.candidates)  # the fallback was never verified
        facts = RoundFacts(
            campaign=self.name,
            spec=self.loaded.spec,
            counters=self.counters,
            node_hours_per_simulation=self.node_hours_per_simulation,
            walltime_remaining=self._walltime_remaining(),
            can_suspend=self.hooks.suspend is not None,
        )
        disposition = launch.disposition

        def context_for(candidates: Sequence[Sequence[float]]) -> RoundContext:
            return round_context(facts, index, call_index, candidates, disposition)

        judged = judge_call(
            self.policy, context_for, launch.candidates, predictions, fallback.candidates
        )
        launch.candidates = judged.candidates
        launch.predictions = judged.predictions
        launch.node_hours = len(launch.candidates) * self.node_hours_per_simulation
        if judged.decision is None:
            fates = judged.ledger.refused()
            await self.store.record_candidate_fates(self.name, index, call_index, fates)
            raise PolicyDenied(
                f"round {index}: the policy refused every candidate",
                details={"round": index, "call_index": call_index},
            )
        return judged.ledger, judged.decision

    async def _end_call(self, end: GateCallEnd) -> None:
        """Record a gate call's end without a decision; a store that fails logs, not masks."""
        try:
            await self.store.finish_gate_call(
                end.gate_call_id, end.disposition, end.attempts_used, attempts=end.attempts
            )
        except Exception:
            log.warning("could not record the end of gate call %s", end.gate_call_id, exc_info=True)

    def _walltime_remaining(self) -> float | None:
        """Return seconds left in the allocation: the executor's jobs, else the environment's."""
        end = self.allocation_end() if self.allocation_end is not None else None
        if end is None:
            return self.allocation.remaining(self.now())
        return max(0.0, end - self.now().timestamp())

    async def _check_recorded(self, index: int, seq: int, decision: Decision) -> None:
        """A recorded decision is authoritative: a replay that derives another one stops."""
        if index != self.replayed_round:
            return  # a round this engine started: every decision of it is its own
        recorded = next(
            (d for d in await self.store.decisions(self.name, index) if d["seq"] == seq), None
        )
        if recorded is None or recorded["outcome"] == decision.outcome.kind:
            return
        details = {"round": index, "seq": seq, "recorded": recorded["outcome"]}
        details["derived"] = decision.outcome.kind
        await self.store.record_event(self.name, "decision_mismatch", details=details)
        raise DecisionMismatch(
            f"round {index}: the recorded decision is {recorded['outcome']!r} but the current "
            f"inputs derive {decision.outcome.kind!r}; the campaign stops instead of acting on "
            "either (restore the inputs it was decided under)",
            details=details,
        )

    async def _run_batch(self, index: int, launch: PlannedBatch) -> None:
        """Launch (or reuse) the round's batch, learn from it, and checkpoint the round."""
        spec = self.loaded.spec
        remaining = spec.budget_node_hours - self.counters.spent
        if launch.node_hours > remaining + 1e-9:
            raise BudgetExceeded(
                f"round {index}: batch exceeds the budget",
                details={"round": index, "node_hours": launch.node_hours, "remaining": remaining},
            )

        def progress(result: SimulationResult) -> None:
            self.hooks.on_event(
                "task", {"round": index, "status": result.status, "of": len(launch.candidates)}
            )
            failpoint("mid_batch")

        results = await self.hooks.step(
            f"launch round {index}", lambda: self.run_batch(index, launch.candidates, progress)
        )
        failpoint("after_batch")
        await self.hooks.step(
            f"assimilate round {index}", lambda: self._assimilate(index, launch, results)
        )

    async def _assimilate(
        self, index: int, launch: PlannedBatch, results: Sequence[SimulationResult]
    ) -> None:
        points: list[list[float]] = []
        values: list[float] = []
        for result in results:
            value = objective_value(result.value)
            if result.status == "done" and value is not None:
                points.append(launch.candidates[result.index])
                values.append(value)
        if points:
            self.surrogate.assimilate(points, values)
        self.counters.count_results((r.status, getattr(r, "error_code", None)) for r in results)
        self.counters.after_batch(launch.disposition, launch.node_hours)
        failed = sum(1 for r in results if r.status != "done")
        self.counters.failed_last_batch = failed
        # Every task interrupted (no allocation finished one): the round produced no
        # result, and is recorded so; the campaign goes on from its states all the same.
        produced = not results or any(r.status != "interrupted" for r in results)
        with failpoint_in_commit(self.store, "checkpoint_commit"):
            await self.store.checkpoint_round(
                self.name,
                index,
                surrogate_state=self.surrogate.to_state(since=self.saved_observations),
                policy_state={
                    "policy": self.policy.to_state(),
                    "campaign": self.counters.to_state(),
                },
                planner_state=self.planner.to_state(),
                status="completed" if produced else "failed",
            )
        self.saved_observations = self.surrogate.observations
        failpoint("after_checkpoint")
        self.hooks.on_event(
            "batch", {"round": index, "done": len(results) - failed, "failed": failed}
        )
