"""Approvals: the form a human fills in (Prefect UI or CLI), and how an answer is judged.

The request, its markdown description, the judgement of an answer and the
request's deadline (:func:`approval_deadline`) live here and import no Prefect,
no pydantic and no planners (``status <id>`` computes the deadline too); the form
itself (a Prefect ``RunInput``) is in ``flows._prefect._approval_form``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from flows._spec import ApprovalsSpec

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
    @property
    def code(self) -> str: ...


@dataclass(frozen=True)
class UnreadableAnswer:
    """An answer whose input the form could not read: judged like any other, and refused."""

    reason: str
    decision: str = "invalid"
    approver: str = "(unreadable answer)"
    batch_size: int | None = None
    code: str = ""

    @property
    def comment(self) -> str:
        """Say why the answer was refused (kept in the provenance)."""
        return f"the answer could not be read ({self.reason})"


# ``(approver, code, now) -> proof``: "totp ok", or why the code does not prove them.
ProofCheck = Callable[[str, str, datetime], str]


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
    require_proof: bool = False
    on_timeout: str = "stop"  # the campaign's [approvals] on_timeout: "stop" or "fallback"
    allow_override: bool = True  # whether approving may run only the first N candidates
    # Where each row of ``proposed`` came from, ``(source, index)`` as ``inspect`` and the
    # candidate fates name it; differs from the row's # once candidate rules thinned it.
    origins: Sequence[tuple[str, int]] = ()

    @property
    def key(self) -> str:
        """Return the stable key of this request (the same on every replay)."""
        return f"{self.campaign}-r{self.round_index}-c{self.call_index}"

    def pause_key(self, refused: int) -> str:
        """Return the Prefect pause key after ``refused`` refused answers."""
        return f"{self.key}-n{refused}"


def _table(
    candidates: Sequence[Sequence[float]],
    limit: int | None = 12,
    origins: Sequence[tuple[str, int]] = (),
) -> str:
    limit = len(candidates) if limit is None else limit
    # A third column only when the # differs from the gate's numbering (candidate rules
    # refused some, or the fallback topped the batch up): inspect names candidates by it.
    renumbered = bool(origins) and any(o != ("proposal", i) for i, o in enumerate(origins))
    rows = [
        f"| {i} | "
        + ", ".join(f"{x:.4g}" for x in c)
        + (f" | {origins[i][0]} {origins[i][1]}" if renumbered else "")
        + " |"
        for i, c in enumerate(candidates[:limit])
    ]
    more = len(candidates) - limit
    if more > 0:
        rows.append(f"| … | {more} more |" + (" |" if renumbered else ""))
    head = ["| # | candidate |", "| --- | --- |"]
    if renumbered:
        head = ["| # | candidate | in `inspect` |", "| --- | --- | --- |"]
    return "\n".join([*head, *rows])


def _collapsed(
    title: str,
    candidates: Sequence[Sequence[float]],
    limit: int | None = 12,
    origins: Sequence[tuple[str, int]] = (),
) -> list[str]:
    # The UI renders raw HTML through a sanitiser that keeps <details>: the long
    # tables stay folded, so the form's fields are one scroll away, not 16 rows.
    table = _table(candidates, limit, origins)
    return ["<details>", f"<summary>{title}</summary>", "", table, "", "</details>"]


def describe(request: ApprovalRequest) -> str:
    """Return the form's markdown: what each answer does, why the rule asked, the batches.

    Written for a tired approver: the consequences of approve, reject and silence
    first, each said once; the rule and its reason; the tables folded at the end.
    """
    approvers = ", ".join(request.approvers) or "(none configured)"
    size = len(request.proposed)
    fell_back = request.disposition == "fallback"
    what = "the gate's fallback batch" if fell_back else "the proposed batch"
    approve = f"{what} runs: {size} candidates, {request.node_hours:.3g} node-hours"
    if request.allow_override:
        approve += " (a batch size runs only the first N; picked Candidates run only those #)"
    deadline = request.deadline.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    silence = (
        "the deterministic fallback batch runs instead"
        if request.on_timeout == "fallback"
        else "the campaign stops (`approval_timeout`)"
    )
    proof = (
        [
            "",
            "**This rule requires proof:** enter your current 6-digit one-time code in "
            "*Code*; a wrong or reused code is refused and the request waits again.",
        ]
        if request.require_proof
        else []
    )
    note = [f"**The rule's note:** {request.advice}  "] if request.advice else []
    return "\n".join(
        [
            f"## Campaign `{request.campaign}`, round {request.round_index}: approve or reject",
            "",
            "| if you choose | what happens |",
            "| --- | --- |",
            f"| **approve** | {approve}; the campaign goes on |",
            "| **reject** | the campaign stops (`approval_rejected`); nothing more runs |",
            f"| no answer by {deadline} UTC | {silence} |",
            *proof,
            "",
            f"**Rule:** `{request.rule}`  ",
            f"**Why it asks:** {request.reason}  ",
            *note,
            f"**Allowed approvers:** {approvers} (give your name exactly as listed)  ",
            f"**Budget:** {request.budget_remaining:.3g} node-hours left before this batch.",
            "",
            # Every row, however long: its # is what the form's Candidates picks from.
            *_collapsed(
                f"Proposed batch ({size} candidates; # is what Candidates picks)",
                request.proposed,
                limit=None,
                origins=request.origins,
            ),
            *_collapsed(
                "Deterministic fallback (for comparison; "
                + (
                    "it runs only if nobody answers in time)"
                    if request.on_timeout == "fallback"
                    else "it does not run, whatever you answer)"
                ),
                request.fallback,
            ),
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
    proof: str | None = None  # "totp ok", "totp failed", ... when the rule asked for proof
    candidates: tuple[int, ...] | None = None  # the subset approved, by index in the batch
    # Why a not_allowed answer was refused when it was not for who sent it.
    refusal: str | None = None


def judge(
    answer: Answer,
    request: ApprovalRequest,
    *,
    now: datetime | None = None,
    verify: ProofCheck | None = None,
) -> Judgement:
    """Decide what an answer means: after the deadline it is a timeout, whoever sent it.

    An approver not among ``request.approvers`` is ``not_allowed`` whatever they
    chose: the check is here, in the flow, so no route to the resume API (UI,
    CLI, a hand-crafted request) can skip it. When the rule requires proof, an
    allowed approver whose code ``verify`` does not accept is ``not_allowed`` too
    (no ``verify`` at all fails closed); the proof is recorded, never the code.
    """
    moment = now or datetime.now(UTC)
    approver = answer.approver.strip()
    if moment >= request.deadline:
        return Judgement("timeout", approver, answer.comment, None)
    if isinstance(answer, UnreadableAnswer):
        return Judgement("not_allowed", approver, answer.comment, None, refusal="unreadable")
    if approver not in request.approvers:
        return Judgement("not_allowed", approver, answer.comment, None)
    proof = None
    if request.require_proof:
        code = getattr(answer, "code", "") or ""
        try:
            proof = verify(approver, code, moment) if verify is not None else "totp not enrolled"
        except (ValueError, TypeError, UnicodeError):  # a code no authenticator makes
            proof = "totp failed"
        if proof != "totp ok":
            return Judgement("not_allowed", approver, answer.comment, None, proof)
    if answer.decision == "reject":
        return Judgement("rejected", approver, answer.comment, None, proof)
    subset = getattr(answer, "candidates", None) or None
    size = answer.batch_size
    refusal = _override_refusal(request, subset, size)
    if refusal is not None:
        return Judgement("not_allowed", approver, answer.comment, None, proof, refusal=refusal)
    if subset:
        return Judgement(
            "approved", approver, answer.comment, None, proof, tuple(int(i) for i in subset)
        )
    return Judgement("approved", approver, answer.comment, size, proof)


def _override_refusal(
    request: ApprovalRequest, subset: Sequence[int] | None, size: int | None
) -> str | None:
    """Say why an approval's override cannot be honoured, or None when it can (or is none)."""
    if subset is None and size is None:
        return None
    if not request.allow_override:
        # The form offers no override then; an answer that brings one anyway approves
        # nothing rather than more (or other) than it says.
        return "override_not_allowed"
    if subset is not None and size is not None:
        return "override_ambiguous"  # a batch size and a subset: which one was meant?
    batch = len(request.proposed)
    if subset is not None:
        chosen = [int(i) for i in subset]
        if len(set(chosen)) != len(chosen) or any(not 0 <= i < batch for i in chosen):
            return "override_out_of_range"
    elif size is not None and not 1 <= size <= batch:
        return "override_out_of_range"
    return None


def approval_deadline(
    requested_at: datetime,
    allocation_end: datetime | None,
    approvals: ApprovalsSpec,
) -> datetime:
    """Return when an approval request times out: the earlier of its timeout and the allocation.

    Computed from the approval row only (its ``requested_at`` and ``allocation_end``
    columns), so every replay of the flow and the watchdog on the login node agree
    on the same instant. The allocation bound is
    its end minus ``approvals.allocation_margin_minutes``, so the campaign falls
    back or stops cleanly before the batch system kills it; never before the request.
    """
    requested = requested_at if requested_at.tzinfo else requested_at.replace(tzinfo=UTC)
    deadline = requested + timedelta(minutes=approvals.timeout_minutes)
    end = allocation_end
    if end is not None:
        end = end if end.tzinfo else end.replace(tzinfo=UTC)
        bound = end - timedelta(minutes=approvals.allocation_margin_minutes)
        deadline = min(deadline, max(requested, bound))
    return deadline
