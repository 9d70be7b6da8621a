"""Approvals: the form a human fills in (Prefect UI or CLI), and how an answer is judged.

The request, its markdown description and the judgement of an answer live here
and import no Prefect; the form itself (a Prefect ``RunInput``) is in
``flows._approval_form`` and is also reachable as ``flows._approval.Approval``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

SYSTEM_TIMEOUT_APPROVER = "unattended:deadline"


class Answer(Protocol):
    """What ``judge`` reads from an answer (the form's ``Approval``, or a recorded one)."""

    @property
    def decision(self) -> str: ...
    @property
    def approver(self) -> str: ...
    @property
    def comment(self) -> str: ...
    @property
    def batch_size(self) -> int | None: ...


def __getattr__(name: str) -> Any:
    # The form is a Prefect RunInput; importing it lazily keeps the engine Prefect-free.
    if name in {"Approval", "approval_form"}:
        from flows import _approval_form

        return getattr(_approval_form, name)
    raise AttributeError(f"module 'flows._approval' has no attribute {name!r}")


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


def judge(answer: Answer, request: ApprovalRequest, *, now: datetime | None = None) -> Judgement:
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
