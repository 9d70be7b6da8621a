"""One campaign, round after round, without Prefect: the gate, the policy, approvals, the batch.

``CampaignEngine`` is replay-safe: it can be started again from the top at any
point (after a suspend, a crash, a restart) and reads the provenance database to
skip what is done. Inference and batch launches are never repeated: recorded
attempts are replayed from the database, and a batch's idempotency key returns
its recorded results. The Prefect flow (``flows._campaign``) drives it with hooks
that turn steps into Prefect tasks and approvals into ``suspend_flow_run``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from opentelemetry import trace

from acceptance import Attempt, Outcome, Rejected, accept
from flows._answers import AnswerJournal
from flows._approval import Answer, ApprovalRequest, Judgement, Verdict, judge
from flows._campaign_state import (
    PlannerSlot,
    allocation_end,
    allocation_note,
    approval_deadline,
    build_policy,
    build_surrogate,
    derive_seed,
    walltime_remaining,
)
from flows._counters import Counters
from flows._failpoints import failpoint, failpoint_in_commit
from flows._spec import LoadedSpec
from policies import (
    BatchSummary,
    Continue,
    Decision,
    RoundContext,
    UnattendedError,
    classify,
    proposal_key,
)
from tasks import Bounds, FallbackBatch, Proposal, fallback_batch, planner_checks

log = logging.getLogger("unattended.campaign")
tracer = trace.get_tracer("unattended.flows")
T = TypeVar("T")

Step = Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]]
Suspender = Callable[[ApprovalRequest, int], Awaitable[Answer]]
TERMINAL = frozenset({"completed", "blocked", "escalated", "failed"})


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

    status: str
    error_code: str | None = None
    rounds_completed: int = 0
    message: str = ""


@dataclass
class RoundStop(Exception):  # noqa: N818  # control flow: the round ends the campaign
    """The round ends the campaign with a status and a stable code."""

    status: str
    code: str | None
    message: str


@dataclass
class _Launch:
    candidates: list[list[float]]
    disposition: str
    node_hours: float


@dataclass
class CampaignEngine:
    """Run a campaign's rounds against its store, executor and planner.

    Args:
        loaded: The validated spec.
        store: The provenance store (also the checkpoint and the batch store).
        run_batch: ``async (round_index, candidates, on_result) -> results``: launches
            one batch idempotently (``tasks.launch_batch`` bound to an executor).
        checks: The gate's checks after the planner's cheap ones (e.g. a verifier).
        node_hours_per_simulation: The site's cost model.
        hooks: Steps, approvals and progress.
        env: Environment for secrets and the allocation's end time.
    """

    loaded: LoadedSpec
    store: Any
    run_batch: Callable[[int, list[list[float]], Callable[[Any], None] | None], Awaitable[Any]]
    node_hours_per_simulation: float
    checks: list[Callable[[Any], Any]] = field(default_factory=list)
    hooks: Hooks = field(default_factory=Hooks)
    env: Mapping[str, str] = field(default_factory=dict)
    answers: AnswerJournal | None = None
    now: Callable[[], datetime] = lambda: datetime.now(UTC)

    def __post_init__(self) -> None:
        spec = self.loaded.spec
        self.name = spec.name
        self.bounds = Bounds(lower=tuple(spec.objective.lower), upper=tuple(spec.objective.upper))
        checkpoint = self.store.load_checkpoint(self.name)
        self.checkpoint = checkpoint
        policy_state = checkpoint.policy_state or {}
        self.policy = build_policy(self.loaded, policy_state.get("policy"))
        self.counters = Counters.from_state(policy_state.get("campaign"))
        self.surrogate = build_surrogate(checkpoint.surrogate_state)
        self.planner = PlannerSlot(self.loaded, self.bounds, checkpoint.planner_state, self.env)
        first = checkpoint.last_completed_round
        self.next_round = 0 if first is None else first + 1

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
            except RoundStop as stop:
                self.store.set_campaign_status(self.name, stop.status, stop.code)
                self.hooks.on_event(
                    "stopped", {"round": index, "status": stop.status, "code": stop.code}
                )
                return CampaignResult(stop.status, stop.code, index, stop.message)
            except UnattendedError as exc:
                self.store.set_campaign_status(self.name, "failed", exc.code)
                self.hooks.on_event("failed", {"round": index, "code": exc.code})
                return CampaignResult("failed", exc.code, index, exc.message)
            except Exception as exc:
                # Unexpected: record the stable code, then let the orchestrator see the crash.
                # (Prefect's suspend signal is a BaseException and passes through untouched.)
                self.store.set_campaign_status(self.name, "failed", classify(exc).code)
                raise
        self.store.set_campaign_status(self.name, "completed", None)
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
        self.store.start_round(self.name, index)
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
            gate_id = self.store.record_gate_call(
                self.name,
                index,
                call_index,
                gate="planner",
                budget=spec.attempts,
                fallback_hash=fallback.content_hash,
                fallback_value=[list(c) for c in fallback.candidates],
            )
            failpoint("after_fallback_recorded")
            outcome = await self.hooks.step(
                f"gate round {index} call {call_index}",
                functools.partial(self._gate, index, gate_id, fallback, feedback),
            )
            failpoint("after_gate")
            launch = self._launch_of(outcome)
            decision = self._decide(index, call_index, launch)
            seq += 1
            self.store.record_decision(self.name, index, seq, decision_record(decision))
            failpoint("after_decision_recorded")
            self.counters.decisions.append(decision.outcome.kind)
            self.hooks.on_event("decision", {"round": index, "outcome": decision.outcome.kind})
            kind = decision.outcome.kind
            if kind == "retry":
                if call_index > spec.policy_retries:
                    raise RoundStop(
                        "blocked", "policy_denied", f"round {index}: policy retries exhausted"
                    )
                feedback.append(self._policy_feedback(outcome.value, decision, len(feedback) + 1))
                call_index += 1
                continue
            if kind == "block":
                code = getattr(decision.outcome, "code", None) or "policy_denied"
                raise RoundStop("blocked", code, f"round {index}: blocked by policy")
            if kind == "escalate":
                raise RoundStop(
                    "escalated", "policy_denied", f"round {index}: escalated to a human queue"
                )
            if kind == "suspend":
                launch = await self._approval(index, call_index, decision, launch, fallback)
            elif isinstance(decision.outcome, Continue) and decision.outcome.modified:
                launch.candidates = [list(c) for c in decision.outcome.modified]
            break
        await self._run_batch(index, launch)

    async def _gate(
        self, index: int, gate_id: int, fallback: FallbackBatch, feedback: list[Attempt[Any]]
    ) -> Outcome[Proposal]:
        """Call the gate, replaying the attempts the provenance already holds."""
        spec = self.loaded.spec
        recorded = [Attempt[Proposal].model_validate(row) for row in self.store.attempts(gate_id)]
        producer_for_round = self.planner.for_round(self.surrogate, index)
        settled = next((a for a in recorded if a.rejected_by is None), None)
        if settled is not None:
            self.planner.skip(len(recorded))
            outcome = Outcome[Proposal].model_construct(
                value=settled.value, disposition="accepted", attempts=tuple(recorded)
            )
            self.store.finish_gate_call(gate_id, "accepted", len(recorded))
            return outcome
        if len(recorded) >= spec.attempts:
            self.planner.skip(len(recorded))
            self.store.finish_gate_call(gate_id, "fallback", len(recorded))
            return Outcome[Proposal].model_construct(
                value=fallback.to_proposal(), disposition="fallback", attempts=tuple(recorded)
            )

        async def producer(previous: tuple[Attempt[Proposal], ...]) -> Proposal:
            if previous:
                self.store.record_attempt(gate_id, previous[-1])  # idempotent on its number
                failpoint("after_attempt_recorded")
            done = len(previous)
            if done < len(recorded):
                # Answered before a restart: replay the record, never ask again.
                self.planner.skip(1)
                replayed = recorded[done]
                raise Rejected(replayed.reason or "rejected", check=replayed.rejected_by)
            journal_key = AnswerJournal.key(gate_id, done + 1)
            journaled = self.answers.get(journal_key) if self.answers is not None else None
            if journaled is not None:
                # Answered before a restart that came while its checks ran.
                self.planner.skip(1)
                if "rejected" in journaled:
                    raise Rejected(journaled["reason"], check=journaled["rejected"])
                return Proposal.model_validate_json(journaled["value"])
            history = (*feedback, *recorded, *previous[len(recorded) :])
            try:
                proposal: Proposal = await producer_for_round(history)
            except Rejected as exc:
                self.planner.sync()
                if self.answers is not None:
                    self.answers.put(journal_key, {"rejected": exc.check, "reason": exc.reason})
                raise
            self.planner.sync()
            if self.answers is not None:
                self.answers.put(journal_key, {"value": proposal.model_dump_json()})
            failpoint("after_answer")
            return proposal

        checks = [*planner_checks(self.bounds, spec.batch_size), *self.checks]
        outcome = await accept(
            producer,
            checks=checks,
            attempts=spec.attempts,
            fallback=fallback.to_proposal,
            name="planner",
        )
        self.store.record_attempts(gate_id, outcome.attempts)
        self.store.finish_gate_call(gate_id, outcome.disposition, len(outcome.attempts))
        self.hooks.on_event(
            "gate",
            {"round": index, "disposition": outcome.disposition, "attempts": len(outcome.attempts)},
        )
        return outcome

    def _launch_of(self, outcome: Outcome[Proposal]) -> _Launch:
        candidates = [list(map(float, c)) for c in outcome.value.candidates]
        hours = len(candidates) * self.node_hours_per_simulation
        return _Launch(candidates, outcome.disposition, hours)

    def _decide(self, index: int, call_index: int, launch: _Launch) -> Decision:
        spec = self.loaded.spec
        fallbacks = self.counters.fallbacks_with(launch.disposition)
        context = RoundContext(
            campaign=self.name,
            round_index=index,
            attempt=call_index,
            batch=BatchSummary(
                size=len(launch.candidates),
                candidates=launch.candidates,
                node_hours=launch.node_hours,
            ),
            proposal_key=proposal_key(launch.candidates),
            disposition=launch.disposition,  # type: ignore[arg-type]  # "accepted" | "fallback"
            consecutive_fallbacks=fallbacks,
            budget_spent=self.counters.budget_spent,
            budget_remaining=spec.budget_node_hours - self.counters.budget_spent,
            walltime_remaining=walltime_remaining(self.env),
            earlier_decisions=tuple(self.counters.decisions),
            can_suspend=self.hooks.suspend is not None,
            failed_last_batch=self.counters.failed_last_batch,
        )
        return self.policy.evaluate(context)

    def _policy_feedback(self, value: Proposal, decision: Decision, number: int) -> Attempt[Any]:
        rule = decision.fired[0].rule if decision.fired else "policy"
        return Attempt[Any].model_construct(
            number=number,
            value=value,
            rejected_by=f"policy:{rule}",
            reason=decision.feedback,
            scores={},
            verdicts=(),
            duration=0.0,
            trace_id=None,
            span_id=None,
        )

    async def _approval(
        self,
        index: int,
        call_index: int,
        decision: Decision,
        launch: _Launch,
        fallback: FallbackBatch,
    ) -> _Launch:
        """Ask a human; return what to launch, or stop the round as the answer says."""
        spec = self.loaded.spec
        suspend = self.hooks.suspend
        if suspend is None:  # the policy turns ASK into Escalate when it cannot suspend
            raise RoundStop("escalated", "policy_denied", f"round {index}: no way to ask a human")
        firing = decision.fired[0] if decision.fired else None
        approvers = tuple(getattr(decision.outcome, "approvers", ()) or spec.approvals.approvers)
        key = f"{self.name}-r{index}-c{call_index}"
        row = self.store.find_approval(key)
        if row is None:
            self.store.record_approval_request(
                self.name,
                index,
                key=key,
                rule=firing.rule if firing else None,
                approvers=approvers,
                # The allocation's end as this process sees it, recorded once: replays
                # (maybe in another process, even off the allocation) and the watchdog
                # read the deadline back from the row instead of recomputing it.
                description=allocation_note(allocation_end(self.env)),
                flow_run_id=self.hooks.flow_run_id,
            )
            row = self.store.find_approval(key)
        request = ApprovalRequest(
            campaign=self.name,
            round_index=index,
            call_index=call_index,
            rule=firing.rule if firing else "policy",
            reason=decision.feedback or "policy asked",
            advice=firing.advice if firing else "",
            approvers=approvers,
            proposed=launch.candidates,
            fallback=[list(c) for c in fallback.candidates],
            node_hours=launch.node_hours,
            budget_remaining=spec.budget_node_hours - self.counters.budget_spent,
            disposition=launch.disposition,
            deadline=approval_deadline(row.requested_at, row.description, spec.approvals),
        )
        judgement = await self._await_answer(request, row, suspend)
        self.store.set_campaign_status(self.name, "running")
        self.hooks.on_event(
            "approval", {"round": index, "verdict": judgement.verdict, "by": judgement.approver}
        )
        if judgement.verdict == "rejected":
            raise RoundStop("blocked", "approval_rejected", f"round {index}: approval rejected")
        if judgement.verdict == "timeout":
            if spec.approvals.on_timeout == "stop":
                raise RoundStop("blocked", "approval_timeout", f"round {index}: approval timed out")
            candidates = [list(c) for c in fallback.candidates]
            return _Launch(candidates, "fallback", len(candidates) * self.node_hours_per_simulation)
        if judgement.batch_size and spec.approvals.max_batch_override:
            launch.candidates = launch.candidates[: judgement.batch_size]
            launch.node_hours = len(launch.candidates) * self.node_hours_per_simulation
        return launch

    async def _await_answer(
        self, request: ApprovalRequest, row: Any, suspend: Suspender
    ) -> Judgement:
        """Replay recorded answers, then suspend until an allowed answer (or the deadline)."""
        events = list(row.events) if row is not None else []
        refused = 0
        while True:
            if refused < len(events):
                event = events[refused]
                if event.allowed:
                    size = (
                        (event.overrides or {}).get("batch_size")
                        if isinstance(event.overrides, dict)
                        else None
                    )
                    return Judgement(
                        cast(Verdict, event.decision),
                        event.decided_by or "",
                        event.comment or "",
                        size,
                    )
                refused += 1
                continue
            self.store.set_campaign_status(self.name, "awaiting_approval")
            self.hooks.on_event(
                "suspend", {"round": request.round_index, "key": request.pause_key(refused)}
            )
            failpoint("before_suspend")
            answer = await suspend(request, refused)
            judgement = judge(answer, request, now=self.now())
            self.store.record_approval_event(
                request.key,
                decided_by=judgement.approver,
                decision=judgement.verdict,
                comment=judgement.comment,
                overrides={"batch_size": judgement.batch_size} if judgement.batch_size else None,
                allowed=judgement.verdict != "not_allowed",
                event_key=request.pause_key(refused),
            )
            failpoint("after_approval_recorded")
            if judgement.verdict != "not_allowed":
                return judgement
            refused += 1

    async def _run_batch(self, index: int, launch: _Launch) -> None:
        """Launch (or reuse) the round's batch, learn from it, and checkpoint the round."""
        spec = self.loaded.spec
        remaining = spec.budget_node_hours - self.counters.budget_spent
        if launch.node_hours > remaining + 1e-9:
            raise RoundStop(
                "blocked", "budget_exceeded", f"round {index}: batch exceeds the budget"
            )

        def progress(result: Any) -> None:
            self.hooks.on_event("task", {"round": index, "status": getattr(result, "status", None)})
            failpoint("mid_batch")

        batch = await self.hooks.step(
            f"launch round {index}", lambda: self.run_batch(index, launch.candidates, progress)
        )
        failpoint("after_batch")
        await self.hooks.step(
            f"assimilate round {index}", lambda: self._assimilate(index, launch, batch)
        )

    async def _assimilate(self, index: int, launch: _Launch, batch: Any) -> None:
        results = list(getattr(batch, "results", batch))
        points, values = [], []
        for result in results:
            value = result.value.get("value") if isinstance(result.value, dict) else result.value
            if result.status == "done" and isinstance(value, int | float):
                points.append(launch.candidates[result.index])
                values.append(float(value))
        if points:
            self.surrogate.assimilate(points, values)
        self.counters.after_batch(launch.disposition, launch.node_hours)
        failed = sum(1 for r in results if r.status != "done")
        self.counters.failed_last_batch = failed
        with failpoint_in_commit(self.store, "checkpoint_commit"):
            self.store.checkpoint_round(
                self.name,
                index,
                surrogate_state=self.surrogate.to_state(),
                policy_state={
                    "policy": self.policy.to_state(),
                    "campaign": self.counters.to_state(),
                },
                planner_state=self.planner.to_state(),
                status="completed",
            )
        failpoint("after_checkpoint")
        self.hooks.on_event(
            "batch", {"round": index, "done": len(results) - failed, "failed": failed}
        )
