"""A round's approval: ask a human, wait durably for an allowed answer, and apply it.

The request is recorded once (with the allocation's window, so a replay in another
process reads the deadline back); answers already recorded are replayed in order, a
refused approver's answer makes the round suspend again under a fresh pause key, and
the allowed answer decides what runs: the batch, the approver's subset or smaller
batch, the fallback after a timeout, or nothing (rejected, or a timeout that stops).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from flows._engine._approval import (
    ApprovalRequest,
    Judgement,
    Verdict,
    approval_deadline,
    judge,
)
from flows._engine._candidates import CandidateLedger
from flows._engine._failpoints import failpoint
from flows._engine._moves import fates_once_launched
from flows._engine._round_context import PlannedBatch
from flows._provenance import ApprovalRow
from policies import (
    ApprovalRejected,
    ApprovalTimeout,
    Decision,
    InternalError,
    PolicyDenied,
    Suspend,
    UnattendedError,
)
from tasks import FallbackBatch

if TYPE_CHECKING:
    from flows._engine._round import CampaignEngine, Suspender


def rule_reason(firing: Any) -> str:
    """Return why a rule asked, in the rule's words (its condition and advice shown apart)."""
    return str(firing.description or firing.detail or "its condition held")


def answer_overrides(judgement: Judgement) -> dict[str, Any] | None:
    """Return what an answer changed of the batch, as recorded on its approval event."""
    if judgement.candidates:
        return {"candidates": list(judgement.candidates)}
    return {"batch_size": judgement.batch_size} if judgement.batch_size else None


async def ask_approval(
    engine: CampaignEngine,
    index: int,
    call_index: int,
    decision: Decision,
    ask: Suspend,
    launch: PlannedBatch,
    fallback: FallbackBatch,
    ledger: CandidateLedger,
) -> PlannedBatch:
    """Ask a human; return what runs, its candidates' fates recorded, or stop as the answer says.

    When the answer stops the round (rejected, a timeout that stops, no way to ask),
    every planned candidate is recorded skipped before the error propagates.
    """

    async def answered() -> PlannedBatch:
        spec = engine.loaded.spec
        suspend = engine.hooks.suspend
        if suspend is None:  # the policy turns ASK into Escalate when it cannot suspend
            raise PolicyDenied(
                f"round {index}: no way to ask a human",
                details={"round": index, "call_index": call_index},
                run_status="escalated",
            )
        firing = decision.fired[0] if decision.fired else None
        approvers = ask.approvers or tuple(spec.approvals.approvers)
        require_proof = isinstance(decision.outcome, Suspend) and decision.outcome.require_proof
        allow_override = spec.approvals.max_batch_override
        key = f"{engine.name}-r{index}-c{call_index}"
        row = await engine.store.find_approval(key)
        if row is None:
            await engine.store.record_approval_request(
                engine.name,
                index,
                key=key,
                rule=firing.rule if firing else None,
                approvers=approvers,
                description=None,
                flow_run_id=engine.hooks.flow_run_id,
                # The allocation's window as this process sees it, recorded once: replays
                # (maybe in another process, even off the allocation) and the watchdog
                # read the deadline back from the row instead of recomputing it.
                allocation_start=engine.allocation.start,
                allocation_end=engine.allocation.end,
                require_proof=require_proof,
                allow_override=allow_override,
            )
            row = await engine.store.find_approval(key)
            if row is None:
                raise InternalError(
                    f"approval request {key!r} was recorded but cannot be read back",
                    details={"key": key},
                )
        # A waiting request keeps the rules it was made under: inputs accepted since
        # (``submit --accept-changes``: new approvers, no proof) apply from the next one.
        approvers = tuple(row.approvers_allowed) or approvers
        if row.require_proof is not None:
            require_proof = row.require_proof
        if row.allow_override is not None:
            allow_override = row.allow_override
        request = ApprovalRequest(
            campaign=engine.name,
            round_index=index,
            call_index=call_index,
            rule=firing.rule if firing else "policy",
            reason=rule_reason(firing) if firing else (decision.feedback or "policy asked"),
            condition=firing.detail if firing and firing.description else "",
            advice=firing.advice if firing else "",
            approvers=approvers,
            proposed=launch.candidates,
            fallback=[list(c) for c in fallback.candidates],
            node_hours=launch.node_hours,
            budget_remaining=spec.budget_node_hours - engine.counters.spent,
            disposition=launch.disposition,
            deadline=approval_deadline(row.requested_at, row.allocation_end, spec.approvals),
            require_proof=require_proof,
            on_timeout=spec.approvals.on_timeout,
            allow_override=allow_override,
            origins=tuple(ledger.planned_origins()),
            rationale=launch.rationale,
            predictions=tuple(launch.predictions),
            best_so_far=engine.surrogate.best_value,
            fallback_node_hours=len(fallback.candidates) * engine.node_hours_per_simulation,
        )
        judgement = await await_answer(engine, request, row, suspend)
        await engine.store.set_campaign_status(engine.name, "running", round_index=index)
        engine.hooks.on_event(
            "approval", {"round": index, "verdict": judgement.verdict, "by": judgement.approver}
        )
        if judgement.verdict == "rejected":
            raise ApprovalRejected(
                f"round {index}: approval rejected by {judgement.approver}",
                details={"round": index, "key": request.key},
            )
        if judgement.verdict == "timeout":
            if spec.approvals.on_timeout == "stop":
                raise ApprovalTimeout(
                    f"round {index}: approval timed out",
                    details={"round": index, "key": request.key},
                )
            candidates = [list(c) for c in fallback.candidates]
            return PlannedBatch(
                candidates, "fallback", len(candidates) * engine.node_hours_per_simulation
            )
        if judgement.candidates and request.allow_override:
            launch.candidates = [launch.candidates[i] for i in sorted(judgement.candidates)]
            launch.node_hours = len(launch.candidates) * engine.node_hours_per_simulation
            launch.struck_by = judgement.approver
        elif judgement.batch_size and request.allow_override:
            launch.candidates = launch.candidates[: judgement.batch_size]
            launch.node_hours = len(launch.candidates) * engine.node_hours_per_simulation
            launch.struck_by = judgement.approver
        return launch

    try:
        launch = await answered()
    except UnattendedError as ended:
        skipped = ledger.skip(f"the approval ended: {ended.code}")
        await engine.store.record_candidate_fates(engine.name, index, call_index, skipped)
        raise
    fates = fates_once_launched(ledger, launch, fallback)
    await engine.store.record_candidate_fates(engine.name, index, call_index, fates)
    return launch


async def await_answer(
    engine: CampaignEngine, request: ApprovalRequest, row: ApprovalRow | None, suspend: Suspender
) -> Judgement:
    """Replay recorded answers, then suspend until an allowed answer (or the deadline)."""
    events = list(row.events) if row is not None else []
    refused = 0
    while True:
        if refused < len(events):
            event = events[refused]
            if event.allowed:
                overrides = event.overrides if isinstance(event.overrides, dict) else {}
                subset = overrides.get("candidates")
                return Judgement(
                    cast(Verdict, event.decision),
                    event.decided_by or "",
                    event.comment or "",
                    overrides.get("batch_size"),
                    candidates=tuple(subset) if subset else None,
                )
            refused += 1
            continue
        await engine.store.set_campaign_status(
            engine.name, "awaiting_approval", round_index=request.round_index
        )
        engine.hooks.on_event(
            "suspend",
            {
                "round": request.round_index,
                "key": request.pause_key(refused),
                "rule": request.rule,
                "approvers": list(request.approvers),
                "deadline": request.deadline.isoformat(timespec="seconds"),
                "request": request,  # the whole request, for the UI's evidence
            },
        )
        failpoint("before_suspend")
        answer = await suspend(request, refused)
        codes = engine.approver_codes
        judgement = judge(answer, request, now=engine.now(), verify=codes.verify if codes else None)
        await engine.store.record_approval_event(
            request.key,
            decided_by=judgement.approver,
            decision=judgement.verdict,
            comment=judgement.comment,
            overrides=answer_overrides(judgement),
            allowed=judgement.verdict != "not_allowed",
            event_key=request.pause_key(refused),
            proof=judgement.proof,
            refusal=judgement.refusal,
        )
        failpoint("after_approval_recorded")
        if judgement.verdict != "not_allowed":
            return judgement
        refused += 1
