"""What a policy tells the round to do, and how several answers combine.

Five outcomes, most severe first::

    Block > Suspend > Escalate > Retry > Continue(modified) > Continue

:func:`combine` keeps the most severe one; outcomes of the same kind merge
(reasons joined, approvers and escalation targets united) so no reason is lost.
Each outcome names the run status it leads to (``run_status``): ``blocked``,
``awaiting_approval``, ``escalated``, or ``None`` while the run goes on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias

RunStatus: TypeAlias = Literal["blocked", "awaiting_approval", "escalated"]
OutcomeKind: TypeAlias = Literal["continue", "retry", "escalate", "suspend", "block"]


def _union(*groups: Iterable[str]) -> tuple[str, ...]:
    """Unite names in first-seen order (approvers, escalation targets, reasons)."""
    seen: dict[str, None] = {}
    for group in groups:
        for name in group:
            if name:
                seen.setdefault(name, None)
    return tuple(seen)


def _join(*reasons: str) -> str:
    return "; ".join(_union(reasons))


@dataclass(frozen=True, slots=True)
class Continue:
    """Let the round go on, with the batch unchanged or replaced by ``modified``."""

    modified: Any = None

    kind: ClassVar[OutcomeKind] = "continue"

    @property
    def rank(self) -> int:
        """Return the severity rank (higher wins in :func:`combine`)."""
        return 0 if self.modified is None else 1

    @property
    def run_status(self) -> RunStatus | None:
        """Return ``None``: the run goes on."""
        return None

    @property
    def reason(self) -> str:
        """Return an empty reason: nothing was refused."""
        return ""


@dataclass(frozen=True, slots=True)
class Retry:
    """Refuse this proposal; the agent must propose again (the gate's re-ask)."""

    reason: str

    kind: ClassVar[OutcomeKind] = "retry"
    rank: ClassVar[int] = 2

    @property
    def run_status(self) -> RunStatus | None:
        """Return ``None``: the run goes on with a new proposal."""
        return None


@dataclass(frozen=True, slots=True)
class Escalate:
    """Stop the automated path and hand the run to the people in ``to``."""

    reason: str
    to: tuple[str, ...] = ()

    kind: ClassVar[OutcomeKind] = "escalate"
    rank: ClassVar[int] = 3

    @property
    def run_status(self) -> RunStatus | None:
        """Return ``escalated``."""
        return "escalated"


@dataclass(frozen=True, slots=True)
class Suspend:
    """Pause the run durably until one of ``approvers`` answers."""

    reason: str
    approvers: tuple[str, ...] = ()
    require_proof: bool = False  # an answer counts only with the approver's one-time code

    kind: ClassVar[OutcomeKind] = "suspend"
    rank: ClassVar[int] = 4

    @property
    def run_status(self) -> RunStatus | None:
        """Return ``awaiting_approval``."""
        return "awaiting_approval"


@dataclass(frozen=True, slots=True)
class Block:
    """Refuse the round: the batch never runs and the run ends ``blocked``."""

    reason: str
    code: str = "policy_denied"

    kind: ClassVar[OutcomeKind] = "block"
    rank: ClassVar[int] = 5

    @property
    def run_status(self) -> RunStatus | None:
        """Return ``blocked``."""
        return "blocked"


Outcome: TypeAlias = Continue | Retry | Escalate | Suspend | Block


def combine(*outcomes: Outcome) -> Outcome:
    """Return the most severe outcome; equally severe ones merge.

    Ties keep every reason (joined with ``"; "`` in order, duplicates dropped),
    unite approvers and escalation targets (proof is required if any asks it), and
    keep the first block's code.
    Two ``Continue(modified=...)`` cannot be merged safely, so the first one's
    change wins. No outcomes at all means ``Continue()``.
    """
    if not outcomes:
        return Continue()
    top = max(outcome.rank for outcome in outcomes)
    tied = [outcome for outcome in outcomes if outcome.rank == top]
    first = tied[0]
    if len(tied) == 1 or isinstance(first, Continue):
        return first
    reason = _join(*(outcome.reason for outcome in tied))
    if isinstance(first, Retry):
        return Retry(reason)
    if isinstance(first, Escalate):
        return Escalate(reason, _union(*(o.to for o in tied if isinstance(o, Escalate))))
    if isinstance(first, Suspend):
        suspends = [o for o in tied if isinstance(o, Suspend)]
        approvers = _union(*(o.approvers for o in suspends))
        return Suspend(reason, approvers, any(o.require_proof for o in suspends))
    return Block(reason, first.code)


def run_status(outcome: Outcome) -> RunStatus | None:
    """Return the run status ``outcome`` leads to, or ``None`` if the run goes on."""
    return outcome.run_status
