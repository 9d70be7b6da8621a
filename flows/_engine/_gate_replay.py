"""One gate call of a round, replayed from the record before anything is asked again.

A round's gate call is replay-safe: the attempts the provenance holds are replayed
(a settled call returns its recorded outcome, planner answers are skipped), an answer
the journal holds is taken instead of asking the planner again, and only then does the
planner answer afresh. Every attempt is recorded before the next one is asked for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from acceptance import Attempt, Outcome, Rejected, accept
from flows._engine._answers import AnswerJournal
from flows._engine._failpoints import failpoint
from tasks import FallbackBatch, Proposal, planner_checks

if TYPE_CHECKING:
    from flows._engine._round import CampaignEngine

# A gate check after the planner's cheap ones: raises ``Rejected`` to refuse a proposal;
# it may return what it did (the verifier: where its tasks ran), its verdict's details.
ProposalCheck = Callable[[Proposal], Awaitable[Mapping[str, Any] | None] | Mapping[str, Any] | None]
# A soft signal recorded on an accepted attempt, never gating.
ProposalScore = Callable[[Proposal], float | Awaitable[float]]
# The name of the gate check that runs the verifier tasks (its verdicts mark what they cost).
VERIFIER_CHECK = "verifier"


async def call_gate(
    engine: CampaignEngine,
    index: int,
    gate_id: int,
    fallback: FallbackBatch,
    feedback: list[Attempt[Any]],
) -> Outcome[Proposal]:
    """Call the round's gate, replaying the attempts the provenance already holds."""
    spec = engine.loaded.spec
    # An attempt whose check failed (a crashed verifier) is not replayed: its value is
    # checked again (the journal holds it), and what that check says replaces the failure.
    recorded = [
        attempt
        for attempt in map(Attempt[Proposal].model_validate, await engine.store.attempts(gate_id))
        if attempt.failed_by is None
    ]
    producer_for_round = engine.planner.for_round(engine.surrogate, index)
    settled = next((a for a in recorded if a.rejected_by is None), None)
    if settled is not None:
        engine.planner.skip(len(recorded))
        return Outcome[Proposal].model_construct(
            value=settled.value, disposition="accepted", attempts=tuple(recorded)
        )
    if len(recorded) >= spec.attempts:
        engine.planner.skip(len(recorded))
        return Outcome[Proposal].model_construct(
            value=fallback.to_proposal(), disposition="fallback", attempts=tuple(recorded)
        )

    async def producer(previous: tuple[Attempt[Proposal], ...]) -> Proposal:
        if previous:
            await engine.store.record_attempt(gate_id, previous[-1])  # idempotent on its number
            failpoint("after_attempt_recorded")
        done = len(previous)
        if done < len(recorded):
            # Answered before a restart: replay the record, never ask again.
            engine.planner.skip(1)
            replayed = recorded[done]
            raise Rejected(replayed.reason or "rejected", check=replayed.rejected_by)
        journal_key = AnswerJournal.key(gate_id, done + 1)
        journaled = engine.answers.get(journal_key) if engine.answers is not None else None
        if journaled is not None:
            # Answered before a restart that came while its checks ran.
            engine.planner.skip(1)
            if "rejected" in journaled:
                raise Rejected(journaled["reason"], check=journaled["rejected"])
            return Proposal.model_validate_json(journaled["value"])
        history = (*feedback, *recorded, *previous[len(recorded) :])
        try:
            proposal: Proposal = await producer_for_round(history)
        except Rejected as exc:
            engine.planner.sync()
            if engine.answers is not None:
                engine.answers.put(journal_key, {"rejected": exc.check, "reason": exc.reason})
            raise
        engine.planner.sync()
        if engine.answers is not None:
            engine.answers.put(journal_key, {"value": proposal.model_dump_json()})
        failpoint("after_answer")
        return proposal

    async def record_failure(attempt: Attempt[Proposal]) -> None:
        # The failure (the planner's or a check's) propagates next and stops the campaign:
        # the record keeps the attempt, and the call ends failed (a rerun decides it again).
        await engine.store.record_attempt(gate_id, attempt)
        await engine.store.finish_gate_call(gate_id, "failed", attempt.number)

    checks = [*planner_checks(engine.bounds, spec.batch_size), *engine.checks]
    outcome = await accept(
        producer,
        checks=checks,
        scores=engine.scores,
        attempts=spec.attempts,
        fallback=fallback.to_proposal,
        name="planner",
        on_failed_attempt=record_failure,
    )
    engine.hooks.on_event(
        "gate",
        {"round": index, "disposition": outcome.disposition, "attempts": len(outcome.attempts)},
    )
    return outcome


def verifier_hours(outcome: Outcome[Proposal], per_task: float) -> float:
    """Return what the gate's verifier tasks cost: one task per candidate it judged."""
    if not per_task:
        return 0.0
    tasks = 0
    for attempt in outcome.attempts:
        if any(verdict.check == VERIFIER_CHECK for verdict in attempt.verdicts):
            tasks += len(getattr(attempt.value, "candidates", ()) or ())
    return tasks * per_task
