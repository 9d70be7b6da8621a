"""Approvals: the form a human fills in (Prefect UI or CLI), and how an answer is judged.

The form is a Prefect ``RunInput``. The UI renders it from the JSON schema the
flow stores when it suspends, with the request's description as markdown above.
Measured UI behaviour shapes the fields: a switch left untouched is *omitted*
from the input, so the decision is an explicit choice with a default, and the
batch-size override is bounded per request so the server itself refuses an
out-of-range value (the run then stays suspended).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from prefect.input import RunInput
from pydantic import Field, create_model

SYSTEM_TIMEOUT_APPROVER = "unattended:deadline"


class Approval(RunInput):
    """An approver's answer to a request."""

    decision: Literal["approve", "reject"] = Field(
        default="approve", description="Approve the batch as proposed, or reject it."
    )
    approver: str = Field(
        min_length=1, max_length=100, description="Your name, as listed among the approvers."
    )
    comment: str = Field(default="", max_length=2000, description="Why (kept in the provenance).")
    batch_size: int | None = Field(
        default=None, ge=1, description="Optional: run only the first N candidates."
    )


def approval_form(*, batch_size: int, description: str, allow_override: bool) -> type[Approval]:
    """Return the form for one request, its override bounded by the proposed batch."""
    upper = batch_size if allow_override else 0
    fields: dict[str, Any] = {
        "batch_size": (
            int | None,
            Field(
                default=None,
                ge=1,
                le=max(upper, 1),
                description=(
                    f"Optional: run only the first N of the {batch_size} candidates."
                    if allow_override
                    else "Overrides are switched off for this campaign; leave empty."
                ),
            ),
        )
    }
    form = create_model("Approval", __base__=Approval, **fields)
    form._description = description  # type: ignore[attr-defined]  # read by RunInput.save
    return form


@dataclass(frozen=True)
class ApprovalRequest:
    """What a policy asked a human, as shown on the form."""

    campaign: str
    round_index: int
    call_index: int
    rule: str
    reason: str
    advice: str
    approvers: tuple[str, ...]
    proposed: Sequence[Sequence[float]]
    fallback: Sequence[Sequence[float]]
    node_hours: float
    budget_remaining: float
    disposition: str
    deadline: datetime

    @property
    def key(self) -> str:
        """Return the stable key of this request (the same on every replay)."""
        return f"{self.campaign}-r{self.round_index}-c{self.call_index}"

    def pause_key(self, refused: int) -> str:
        """Return the Prefect pause key after ``refused`` refused answers."""
        return f"{self.key}-n{refused}"


def _table(candidates: Sequence[Sequence[float]], limit: int = 12) -> str:
    rows = [
        f"| {i} | " + ", ".join(f"{x:.4g}" for x in c) + " |"
        for i, c in enumerate(candidates[:limit])
    ]
    more = len(candidates) - limit
    if more > 0:
        rows.append(f"| … | {more} more |")
    return "\n".join(["| # | candidate |", "| --- | --- |", *rows])


def describe(request: ApprovalRequest) -> str:
    """Return the form's markdown: rule, why, how to comply, batch against fallback, cost."""
    approvers = ", ".join(request.approvers) or "(none configured)"
    return "\n".join(
        [
            f"## Approval needed: campaign `{request.campaign}`, round {request.round_index}",
            "",
            f"**Rule:** `{request.rule}`  ",
            f"**Why:** {request.reason}  ",
            f"**How to comply:** {request.advice or 'n/a'}  ",
            f"**Allowed approvers:** {approvers}  ",
            f"**Answer by:** {request.deadline.isoformat(timespec='seconds')} (UTC); "
            "after that the campaign follows its timeout policy.",
            "",
            f"**Cost:** {request.node_hours:.3g} node-hours for "
            f"{len(request.proposed)} candidates; "
            f"{request.budget_remaining:.3g} node-hours left in the budget. "
            f"The gate's disposition: {request.disposition}.",
            "",
            "### Proposed batch",
            _table(request.proposed),
            "",
            "### Deterministic fallback (runs if you reject and the policy falls back)",
            _table(request.fallback),
            "",
            "Choose **approve** or **reject**, give your name as listed above, and optionally a "
            "comment or a smaller batch size.",
        ]
    )


Verdict = Literal["approved", "rejected", "timeout", "not_allowed"]


@dataclass(frozen=True)
class Judgement:
    """How the campaign reads an answer."""

    verdict: Verdict
    approver: str
    comment: str
    batch_size: int | None


def judge(answer: Approval, request: ApprovalRequest, *, now: datetime | None = None) -> Judgement:
    """Decide what an answer means: after the deadline it is a timeout, whoever sent it.

    An approver not among ``request.approvers`` is ``not_allowed`` whatever they
    chose: the check is here, in the flow, so no route to the resume API (UI,
    CLI, a hand-crafted request) can skip it.
    """
    moment = now or datetime.now(UTC)
    approver = answer.approver.strip()
    if moment >= request.deadline:
        return Judgement("timeout", approver, answer.comment, None)
    if approver not in request.approvers:
        return Judgement("not_allowed", approver, answer.comment, None)
    if answer.decision == "reject":
        return Judgement("rejected", approver, answer.comment, None)
    return Judgement("approved", approver, answer.comment, answer.batch_size)
