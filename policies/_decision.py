"""A policy's answer for one round: the outcome, the rules behind it, and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from policies._outcomes import Block, Continue, Escalate, Outcome, Retry, Suspend
from policies._rules import Severity

# What one fired rule did to the round.
Effect: TypeAlias = Literal[
    "block", "suspend", "escalate", "retry", "override", "tolerate", "shadow"
]


@dataclass(frozen=True, slots=True)
class Firing:
    """One rule that fired on the round, and what it did.

    ``severity`` is the rule's declared severity; ``effect`` is what it did
    after escalation and fallbacks (an ASK without approvers retries, say).
    """

    rule: str
    severity: Severity
    detail: str
    advice: str = ""
    log_only: bool = False
    effect: Effect = "retry"
    escalated: bool = False
    attempts: int = 0
    description: str = ""

    def to_record(self) -> dict[str, Any]:
        """Return the firing as JSON-ready data."""
        return {
            "rule": self.rule,
            "severity": self.severity.value,
            "effect": self.effect,
            "detail": self.detail,
            "log_only": self.log_only,
            "escalated": self.escalated,
            "attempts": self.attempts,
        }


@dataclass(frozen=True, slots=True)
class Decision:
    """What the policy decided for one round context.

    Attributes:
        outcome: What the round does next.
        fired: Every rule that fired, the deciding one(s) first.
        notes: Violations of TOLERATE rules (the round goes on).
        shadow: What log-only rules would have done (never acted on).
        escalated: A SOFT_BLOCK rule ran out of attempts and escalated.
        override: The BLOCK_AND_WARN rule an identical, repeated proposal got past.
        latched: Refused because an earlier HARD_STOP is still in force.
        attempts: For a retry, how often the deciding rule has refused.
        feedback: Short text for the agent's re-ask and the approval form.
        policy: The policy's name.
    """

    outcome: Outcome
    fired: tuple[Firing, ...] = ()
    notes: tuple[str, ...] = ()
    shadow: tuple[str, ...] = ()
    escalated: bool = False
    override: str | None = None
    latched: bool = False
    attempts: int = 0
    feedback: str = ""
    policy: str = "policy"

    @property
    def deciding(self) -> Firing | None:
        """Return the deciding firing, if a rule refused the round."""
        if self.fired and self.fired[0].effect not in ("override", "tolerate", "shadow"):
            return self.fired[0]
        return None

    def to_record(self) -> dict[str, Any]:
        """Return the decision as JSON-ready provenance (no proposal content)."""
        outcome = self.outcome
        record: dict[str, Any] = {
            "policy": self.policy,
            "kind": outcome.kind,
            "run_status": outcome.run_status,
            "reason": outcome.reason,
            "code": outcome.code if isinstance(outcome, Block) else None,
            "approvers": list(outcome.approvers) if isinstance(outcome, Suspend) else [],
            "require_proof": isinstance(outcome, Suspend) and outcome.require_proof,
            "escalate_to": list(outcome.to) if isinstance(outcome, Escalate) else [],
            "modified": isinstance(outcome, Continue) and outcome.modified is not None,
            "rules_fired": [firing.rule for firing in self.fired],
            "severities": {firing.rule: firing.severity.value for firing in self.fired},
            "fired": [firing.to_record() for firing in self.fired],
            "notes": list(self.notes),
            "shadow": list(self.shadow),
            "escalated": self.escalated,
            "override": self.override,
            "latched": self.latched,
            "attempts": self.attempts,
            "explanation": self.feedback,
        }
        return record


def _line(firing: Firing, soft_limit: str) -> str:
    text = f"Rule '{firing.rule}' ({firing.severity.value})"
    if firing.description:
        text += f" – {firing.description.rstrip('.')}."
    else:
        text += "."
    text += f" What broke it: {firing.detail.rstrip('.')}."
    if firing.advice:
        text += f" How to comply: {firing.advice.rstrip('.')}."
    if firing.severity is Severity.SOFT_BLOCK and not firing.escalated and soft_limit:
        text += f" Attempt {firing.attempts} of {soft_limit}."
    if firing.escalated:
        text += " It ran out of attempts and escalated."
    return text


def render_feedback(
    outcome: Outcome, fired: tuple[Firing, ...], *, soft_limit: str, override: str | None
) -> str:
    """Build the short text for the agent and the approval form.

    It names each refusing rule, what broke it and how to comply; it quotes
    numbers from the context (node-hours, rounds), never the candidates.
    """
    refusing = [f for f in fired if f.effect not in ("override", "tolerate", "shadow")]
    lines: list[str] = []
    if isinstance(outcome, Block):
        lines.append(f"The round is blocked (code {outcome.code}).")
    elif isinstance(outcome, Suspend):
        lines.append(f"The round needs approval from: {', '.join(outcome.approvers)}.")
    elif isinstance(outcome, Escalate):
        who = ", ".join(outcome.to) or "an operator"
        lines.append(f"The round is escalated to {who}: it cannot pause for approval here.")
    elif isinstance(outcome, Retry):
        lines.append("This proposal may not run; propose a different batch.")
    lines.extend(_line(firing, soft_limit) for firing in refusing)
    if override is not None:
        lines.append(
            f"Rule '{override}' warned about this proposal before; it was repeated "
            "unchanged, so the warning is overridden."
        )
    lines.extend(
        f"Noted (tolerated): rule '{f.rule}': {f.detail}" for f in fired if f.effect == "tolerate"
    )
    return "\n".join(lines)
