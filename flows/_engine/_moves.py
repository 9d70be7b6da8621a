"""What a round does after the policy's decision on a gate call: one typed move.

:func:`next_move` turns a decision into exactly one of :class:`Reask`,
:class:`AwaitApproval`, :class:`Launch` or :class:`Stop`, each carrying the candidate
fates recorded with the decision; the round matches on the move once
(``CampaignEngine._run_round``), exhaustively, so a new kind of move fails type
checking there and here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias, assert_never

from acceptance import Attempt
from flows._engine._candidates import CandidateLedger
from flows._engine._round_context import PlannedBatch
from flows._provenance import CandidateFateRecord
from policies import Block, Continue, Decision, Escalate, PolicyDenied, Retry, Suspend
from tasks import FallbackBatch, Proposal


@dataclass(frozen=True)
class Reask:
    """The policy refused the batch: the planner is asked again in the round's next gate call."""

    fates: list[CandidateFateRecord]


@dataclass(frozen=True)
class AwaitApproval:
    """The policy asks a human; the batch's fates wait for the answer (refused ones do not)."""

    fates: list[CandidateFateRecord]
    ask: Suspend


@dataclass(frozen=True)
class Launch:
    """The batch runs as planned (a ``Continue(modified=...)`` batch as the policy wrote it)."""

    fates: list[CandidateFateRecord]


@dataclass(frozen=True)
class Stop:
    """The campaign stops here with ``error`` (blocked, escalated, or out of policy retries)."""

    fates: list[CandidateFateRecord]
    error: PolicyDenied


Move: TypeAlias = Reask | AwaitApproval | Launch | Stop


def next_move(
    decision: Decision,
    ledger: CandidateLedger,
    launch: PlannedBatch,
    fallback: FallbackBatch,
    *,
    index: int,
    call_index: int,
    policy_retries: int,
) -> Move:
    """Return what the round does after ``decision`` (``launch`` takes a modified batch)."""
    where = {"round": index, "call_index": call_index}
    # Exhaustive over policies.Outcome: a new kind fails type checking here.
    match decision.outcome:
        case Retry():
            fates = ledger.skip("the policy refused the batch")
            if call_index > policy_retries:
                return Stop(
                    fates, PolicyDenied(f"round {index}: policy retries exhausted", details=where)
                )
            return Reask(fates)
        case Block(code=code):
            fates = ledger.skip("the policy blocked the batch")
            return Stop(
                fates, PolicyDenied(f"round {index}: blocked by policy", code=code, details=where)
            )
        case Escalate() as escalate:
            fates = ledger.skip("the policy escalated the batch")
            error = PolicyDenied(
                f"round {index}: escalated to a human queue",
                details={**where, "to": list(escalate.to)},
                run_status=escalate.run_status,
            )
            return Stop(fates, error)
        case Suspend() as ask:
            return AwaitApproval(ledger.refused(), ask)
        case Continue(modified=modified):
            if modified:
                launch.candidates = [list(c) for c in modified]
            return Launch(fates_once_launched(ledger, launch, fallback))
        case _:
            assert_never(decision.outcome)


def fates_once_launched(
    ledger: CandidateLedger, launch: PlannedBatch, fallback: FallbackBatch
) -> list[CandidateFateRecord]:
    """Return every candidate's fate once ``launch`` is the batch that runs."""
    return ledger.settle(
        launch.candidates,
        fallback.candidates,
        struck_by=launch.struck_by,
        reason=f"struck by approver {launch.struck_by}"
        if launch.struck_by
        else "not in the batch that ran",
    )


def policy_feedback(value: Proposal, decision: Decision, number: int) -> Attempt[Any]:
    """Return the policy's refusal as an attempt the planner sees when it is asked again."""
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
