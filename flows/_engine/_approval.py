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


# The server's stamp of an approver's login (flows._prefect._identity_resume), and what an
# allowed answer's proof says of it when the rule asks no one-time code: "login" (the
# approver logged in as themselves) or "owner" (the owner's credential answered on the
# approver's behalf: `unattended approve --as NAME`).
APPROVER_STAMP = "approver:"
LOGIN_PROOF = {"approver": "login", "owner": "owner"}

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
    # The rule's condition as it held (its expression and the values it read), shown
    # beside ``reason`` (the rule's description, in words) when the rule has both.
    condition: str = ""
    rationale: str = ""  # the planner's, as it proposed the batch (untrusted text)
    predictions: Sequence[float | None] = ()  # the verifier's, per row of ``proposed``
    best_so_far: float | None = None  # the best objective any finished task reached
    fallback_node_hours: float | None = None  # what the fallback batch would cost

    @property
    def key(self) -> str:
        """Return the stable key of this request (the same on every replay)."""
        return f"{self.campaign}-r{self.round_index}-c{self.call_index}"

    def pause_key(self, refused: int) -> str:
        """Return the Prefect pause key after ``refused`` refused answers."""
        return f"{self.key}-n{refused}"


def _point(candidate: Sequence[float]) -> str:
    return ", ".join(f"{x:.4g}" for x in candidate)


def candidate_labels(request: ApprovalRequest) -> list[str]:
    """Return one label per proposed row, as the form's Candidates select offers it.

    ``#3: (0.6, 0.5), predicted 1.23``: the row's # (what ``judge`` and the
    provenance call it), its coordinates and the verifier's prediction when one was
    made. The same request gives the same labels on every replay, so an answer
    stored as labels reads back as the same rows.
    """
    labels = []
    for i, candidate in enumerate(request.proposed):
        label = f"#{i}: ({_point(candidate)})"
        predicted = request.predictions[i] if i < len(request.predictions) else None
        if predicted is not None:
            label += f", predicted {predicted:.4g}"
        labels.append(label)
    return labels


def _table(
    candidates: Sequence[Sequence[float]],
    limit: int | None = 12,
    origins: Sequence[tuple[str, int]] = (),
    predictions: Sequence[float | None] = (),
) -> str:
    limit = len(candidates) if limit is None else limit
    # A column for where a row came from only when the # differs from the gate's
    # numbering (candidate rules refused some, or the fallback topped the batch up).
    renumbered = bool(origins) and any(o != ("proposal", i) for i, o in enumerate(origins))
    predicted = any(p is not None for p in predictions)
    head = ["#", "candidate"]
    if predicted:
        head.append("verifier predicts")
    if renumbered:
        head.append("in `inspect`")
    rows = []
    for i, c in enumerate(candidates[:limit]):
        cells = [str(i), _point(c)]
        if predicted:
            value = predictions[i] if i < len(predictions) else None
            cells.append("–" if value is None else f"{value:.4g}")
        if renumbered:
            cells.append(f"{origins[i][0]} {origins[i][1]}")
        rows.append("| " + " | ".join(cells) + " |")
    more = len(candidates) - limit
    if more > 0:
        rows.append("| … | " + " | ".join([f"{more} more"] + [""] * (len(head) - 2)) + " |")
    return "\n".join(["| " + " | ".join(head) + " |", "|" + " --- |" * len(head), *rows])


def _when(deadline: datetime) -> str:
    """Return the deadline in UTC, and in the login node's zone when that differs.

    The UI renders this markdown as it is (no script runs in it), so it cannot be
    put in each approver's own zone; Prefect's header shows the run's times in the
    browser's zone.
    """
    utc = deadline.astimezone(UTC)
    text = utc.strftime("%Y-%m-%d %H:%M UTC")
    local = deadline.astimezone()
    if local.utcoffset() != timedelta(0):
        text += f" ({local.strftime('%H:%M')} {local.tzname()} on the login node)"
    return text


def _untrusted(text: str, limit: int = 600) -> str:
    """Return an agent's text as one inert code span (no links, no markup), shortened."""
    flat = " ".join(text.replace("`", "'").split())
    return f"`{flat[:limit]}{'…' if len(flat) > limit else ''}`" if flat else "(none given)"


def describe(request: ApprovalRequest) -> str:
    """Return the form's markdown: what each answer does and why the rule asked, then details.

    Written for a tired approver: the few lines above the fields say once what
    approve, reject and silence do, and why the rule asked (its description in
    words, its condition once); everything else (rationale, predictions, best so
    far, costs, both batches) is folded below, so the fields show without scrolling.
    """
    size = len(request.proposed)
    fell_back = request.disposition == "fallback"
    what = "the gate's fallback batch" if fell_back else "the proposed batch"
    silence = (
        "the deterministic fallback batch runs instead"
        if request.on_timeout == "fallback"
        else "the campaign stops (`approval_timeout`)"
    )
    why = request.reason
    if request.condition:
        why += f" Condition: {request.condition}."
    proof = (
        ["**This rule requires proof:** your current 6-digit one-time code in *Code*.  "]
        if request.require_proof
        else []
    )
    return "\n".join(
        [
            f"**Approve** runs {what}: {size} candidates, {request.node_hours:.3g} node-hours. "
            "**Reject** stops the campaign (`approval_rejected`). "
            f"**No answer by {_when(request.deadline)}:** {silence}.  ",
            f"**Why it asks** (rule `{request.rule}`): {why}  ",
            *proof,
            "",
            *_details(request),
        ]
    )


def _details(request: ApprovalRequest) -> list[str]:
    """Return the folded part of the description (the UI's sanitiser keeps <details>)."""
    size = len(request.proposed)
    fallback_cost = (
        f"; the fallback batch {request.fallback_node_hours:.3g}"
        if request.fallback_node_hours is not None
        else ""
    )
    best = "none yet" if request.best_so_far is None else f"{request.best_so_far:.4g}"
    fallback_note = (
        "it runs only if nobody answers in time"
        if request.on_timeout == "fallback"
        else "it does not run, whatever you answer"
    )
    note = [f"**The rule's note:** {request.advice}  "] if request.advice else []
    return [
        "<details>",
        "<summary>Details: rationale, predictions, best so far, costs, both batches</summary>",
        "",
        f"**Campaign** `{request.campaign}`, round {request.round_index}; "
        f"**allowed approvers:** {', '.join(request.approvers) or '(none configured)'}.  ",
        *note,
        f"**Planner's rationale:** {_untrusted(request.rationale)}  ",
        f"**Best result so far:** {best} (the lowest objective of any finished task).  ",
        f"**Cost:** this batch {request.node_hours:.3g} node-hours{fallback_cost}; "
        f"{request.budget_remaining:.3g} left in the budget before this batch.",
        "",
        f"Proposed batch ({size} candidates; *Candidates* picks rows by #):",
        "",
        _table(request.proposed, None, request.origins, request.predictions),
        "",
        f"Deterministic fallback ({fallback_note}):",
        "",
        _table(request.fallback),
        "",
        "</details>",
    ]


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
    # Who the server authenticated ("approver:NAME", "owner"; "" on a server without logins).
    stamp = str(getattr(answer, "authenticated_as", "") or "")
    if stamp.startswith(APPROVER_STAMP) and stamp.removeprefix(APPROVER_STAMP) != approver:
        # The server refuses this already; an answer stored past it is refused here too.
        return Judgement("not_allowed", approver, answer.comment, None, refusal="not_who_logged_in")
    if approver not in request.approvers:
        return Judgement("not_allowed", approver, answer.comment, None)
    proof = LOGIN_PROOF.get(stamp.partition(":")[0])
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
