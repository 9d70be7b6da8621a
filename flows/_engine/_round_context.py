"""What the policy judges a gate call on, built one way for the live round and for ``replay``.

A gate call's batch meets the policy in two steps: the candidate rules judge
each candidate (refusing some, topping the batch up from the fallback if the
policy says so), then the round's rules judge the batch that is left. Both read
a :class:`policies.RoundContext` built by :func:`round_context` from the campaign's
counters and the batch. :func:`judge_call` is those two steps: the engine
(``flows._engine._round``) calls it on the gate's outcome, and ``flows._replay`` on
the recorded gate call, so a replay judges candidate rules, thinning, top-ups and
``failed_last_batch`` exactly as the live run did.

Nothing here touches the store or the allocation; it imports neither numpy nor the
planners (``unattended replay`` runs without them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from flows._engine._candidates import CandidateLedger, oversee
from flows._engine._counters import Counters
from flows._spec import CampaignSpec
from policies import BatchSummary, Decision, Policy, RoundContext, proposal_key


@dataclass
class PlannedBatch:
    """The batch a gate call plans to launch, as the policy and an approver shape it."""

    candidates: list[list[float]]
    disposition: str
    node_hours: float
    struck_by: str | None = None  # the approver who kept only part of the batch
    rationale: str = ""  # the planner's, shown on an approval form
    predictions: list[float | None] = field(default_factory=list)  # per candidate, verifier's


@dataclass(frozen=True)
class RoundFacts:
    """What a round context says besides its batch: who, where in the campaign, what is left.

    Args:
        campaign: The campaign's name.
        spec: Its spec (budget, default approvers).
        counters: The campaign's counters as they stand before this call's batch runs.
        node_hours_per_simulation: The site's cost of one simulation.
        walltime_remaining: Seconds left in the allocation, if known (replay: unknown).
        can_suspend: Whether the run can pause durably for an approval.
    """

    campaign: str
    spec: CampaignSpec
    counters: Counters
    node_hours_per_simulation: float
    walltime_remaining: float | None
    can_suspend: bool


def round_context(
    facts: RoundFacts,
    round_index: int,
    call_index: int,
    candidates: Sequence[Sequence[float]],
    disposition: str,
) -> RoundContext:
    """Return the context the policy judges ``candidates`` of gate call ``call_index`` in."""
    rows = [[float(x) for x in c] for c in candidates]
    counters = facts.counters
    return RoundContext(
        campaign=facts.campaign,
        round_index=round_index,
        attempt=call_index,
        batch=BatchSummary(
            size=len(rows),
            candidates=rows,
            node_hours=len(rows) * facts.node_hours_per_simulation,
        ),
        proposal_key=proposal_key(rows),
        disposition=disposition,  # type: ignore[arg-type]  # "accepted" | "fallback"
        consecutive_fallbacks=counters.fallbacks_with(disposition),
        budget_spent=counters.spent,
        budget_remaining=facts.spec.budget_node_hours - counters.spent,
        walltime_remaining=facts.walltime_remaining,
        earlier_decisions=tuple(counters.decisions),
        can_suspend=facts.can_suspend,
        failed_last_batch=counters.failed_last_batch,
        default_approvers=tuple(facts.spec.approvals.approvers),
    )


@dataclass(frozen=True)
class CallJudgement:
    """How the policy judged one gate call's batch.

    ``ledger`` names every candidate considered (refused ones too); ``candidates``
    is the batch left to run, ``predictions`` the verifier's per candidate of it
    (None for a fallback candidate). ``decision`` is None when the candidate rules
    refused every candidate: the round is blocked and no round rule was asked.
    """

    ledger: CandidateLedger
    candidates: list[list[float]]
    predictions: list[float | None]
    decision: Decision | None


def judge_call(
    policy: Policy,
    context_for: Callable[[Sequence[Sequence[float]]], RoundContext],
    proposed: Sequence[Sequence[float]],
    predictions: Sequence[float | None],
    fallback: Sequence[Sequence[float]],
) -> CallJudgement:
    """Judge a gate call's batch: its candidates one by one, then the batch left.

    Args:
        policy: The policy (its state advances with the decision, as in the live run).
        context_for: The round context of a batch of this call (:func:`round_context`
            with everything but the candidates bound).
        proposed: The batch the gate returned (accepted, or the fallback).
        predictions: The verifier's prediction per proposed candidate (None: unknown).
        fallback: The call's fallback batch (top-ups come from it).
    """
    ledger = oversee(policy, context_for(proposed), proposed, predictions, fallback)
    planned = ledger.planned()
    kept = [
        predictions[i] if source == "proposal" else None for source, i in ledger.planned_origins()
    ]
    if not planned:
        return CallJudgement(ledger, [], [], None)
    return CallJudgement(ledger, planned, kept, policy.decide_and_count(context_for(planned)))
