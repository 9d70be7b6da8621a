"""A policy: rules with severities, judged together on each round context.

The strongest severity among the rules that fired decides; rules of that
severity combine (``combine``). A policy keeps a little state between rounds
(SOFT_BLOCK counters, BLOCK_AND_WARN pointers, a latched stop), and that state
round-trips through :meth:`Policy.to_state` so a killed campaign resumes with
the same counts. :meth:`Policy.decide_and_count` judges a round and advances that
state; :meth:`Policy.with_state` is a new policy continuing from a saved one.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from policies._context import CandidateView, RoundContext, cel_variables
from policies._decision import Decision, Effect, Firing, render_feedback
from policies._errors import SpecInvalid
from policies._outcomes import Block, Escalate, Outcome, Retry, Suspend, combine
from policies._rules import Rule, Severity, SoftBlockMode, cel_module

_STATE_VERSION = 1


class _Pointer(BaseModel):
    """The proposal a BLOCK_AND_WARN rule last warned about, and when."""

    model_config = ConfigDict(extra="ignore")

    proposal_key: str
    round_index: int
    attempt: int


class _State(BaseModel):
    """The saved form of a policy's state; unknown keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    soft_counts: dict[str, int] = Field(default_factory=dict)
    soft_streaks: dict[str, int] = Field(default_factory=dict)
    refusals: dict[str, int] = Field(default_factory=dict)
    warned: dict[str, _Pointer] = Field(default_factory=dict)
    latched: str | None = None


@dataclass(frozen=True, slots=True)
class _Act:
    """One fired rule's contribution, before the strongest is chosen."""

    firing: Firing
    outcome: Outcome | None
    strength: int
    index: int


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"Policy.{old} is deprecated; use Policy.{new}", DeprecationWarning, stacklevel=3)


def _settings_error(field_name: str, problem: str) -> SpecInvalid:
    return SpecInvalid(
        f"policy field {field_name!r}: {problem}",
        details={"rule": None, "field": field_name, "problem": problem},
    )


class Policy:
    """Judge round contexts against rules; deterministic given the same state.

    Args:
        rules: The rules, in the order they are reported.
        name: Names the policy in decisions and provenance.
        max_soft_attempts: SOFT_BLOCK refusals of one rule that escalate.
        soft_block_mode: ``cumulative``, ``consecutive`` (a round where the rule
            did not fire resets the count) or ``hybrid`` (either threshold).
        max_consecutive_soft_attempts: The consecutive threshold (default: the
            cumulative one).
        escalate_to: What an exhausted SOFT_BLOCK becomes: HARD_STOP or ASK.
        latch_stop: After a HARD_STOP, refuse every round until :meth:`resume`.
        log_only: Shadow mode for every rule.
        top_up_from_fallback: When candidate rules thin a batch, fill it back up
            to its size with the fallback's candidates (those the rules accept).

    Raises:
        SpecInvalid: Duplicate rule names or an invalid setting.
    """

    def __init__(
        self,
        rules: Iterable[Rule],
        *,
        name: str = "policy",
        max_soft_attempts: int = 3,
        soft_block_mode: SoftBlockMode | str = SoftBlockMode.CUMULATIVE,
        max_consecutive_soft_attempts: int | None = None,
        escalate_to: Severity | str = Severity.HARD_STOP,
        latch_stop: bool = False,
        log_only: bool = False,
        top_up_from_fallback: bool = False,
    ) -> None:
        self.rules: tuple[Rule, ...] = tuple(rules)
        self.top_up_from_fallback = top_up_from_fallback
        seen: set[str] = set()
        for rule in self.rules:
            if rule.name in seen:
                raise SpecInvalid(
                    f"rule {rule.name!r}: field 'name': duplicate rule name",
                    details={"rule": rule.name, "field": "name", "problem": "duplicate rule name"},
                )
            seen.add(rule.name)
        if max_soft_attempts < 1:
            raise _settings_error("max_soft_attempts", "must be at least 1")
        if max_consecutive_soft_attempts is not None and max_consecutive_soft_attempts < 1:
            raise _settings_error("max_consecutive_soft_attempts", "must be at least 1")
        try:
            mode = SoftBlockMode(soft_block_mode)
        except ValueError:
            raise _settings_error(
                "soft_block_mode", "must be cumulative, consecutive or hybrid"
            ) from None
        try:
            target = Severity(escalate_to)
        except ValueError:
            target = None
        if target not in (Severity.HARD_STOP, Severity.ASK):
            raise _settings_error("escalate_to", "must be HARD_STOP or ASK")
        self.name = name
        self.max_soft_attempts = max_soft_attempts
        self.soft_block_mode = mode
        self.max_consecutive_soft_attempts = max_consecutive_soft_attempts or max_soft_attempts
        self.escalate_to: Severity = target
        self.latch_stop = latch_stop
        self.log_only = log_only
        self.candidate_rules = tuple(rule for rule in self.rules if rule.scope == "candidate")
        self._round_rules = tuple(rule for rule in self.rules if rule.scope == "round")
        self._has_cel = any(rule.expression is not None for rule in self._round_rules)
        self._with_candidates = any(
            rule.expression is not None and rule.reads_candidates for rule in self._round_rules
        )
        self._state = _State()

    # -- state -----------------------------------------------------------------

    @property
    def latched(self) -> str | None:
        """Return the rule whose HARD_STOP is latched, or ``None``."""
        return self._state.latched

    def resume(self) -> None:
        """Lift a latched stop: the next round is judged normally again."""
        self._state.latched = None

    def reset(self) -> None:
        """Forget everything the policy counted; rules and settings stay."""
        self._state = _State()

    def to_state(self) -> dict[str, Any]:
        """Return the counters, pointers and latch as a JSON-serialisable dict."""
        data = self._state.model_dump(mode="json")
        return {"version": _STATE_VERSION, "policy": self.name, **data}

    def load_state(self, state: Mapping[str, Any] | None) -> None:
        """Continue from a state saved with :meth:`to_state`; unknown keys are ignored.

        Raises:
            SpecInvalid: A known key holds a value of the wrong type.
        """
        try:
            loaded = _State.model_validate(dict(state or {}))
        except ValidationError as exc:
            fields = [".".join(str(p) for p in error["loc"]) for error in exc.errors()]
            raise SpecInvalid(
                f"policy {self.name!r}: invalid saved state at {', '.join(fields)}",
                details={"rule": None, "field": "state." + fields[0], "fields": fields},
            ) from None
        known = {rule.name for rule in self.rules}
        # Counters of rules no longer in the policy mean nothing; drop them.
        loaded.soft_counts = {k: v for k, v in loaded.soft_counts.items() if k in known}
        loaded.soft_streaks = {k: v for k, v in loaded.soft_streaks.items() if k in known}
        loaded.refusals = {k: v for k, v in loaded.refusals.items() if k in known}
        loaded.warned = {k: v for k, v in loaded.warned.items() if k in known}
        self._state = loaded

    def with_state(self, state: Mapping[str, Any] | None) -> Policy:
        """Return a new policy with these rules and settings, continuing from ``state``.

        This policy is left as it is; ``load_state`` restores ``state`` in place.
        """
        policy = Policy(
            self.rules,
            name=self.name,
            max_soft_attempts=self.max_soft_attempts,
            soft_block_mode=self.soft_block_mode,
            max_consecutive_soft_attempts=self.max_consecutive_soft_attempts,
            escalate_to=self.escalate_to,
            latch_stop=self.latch_stop,
            log_only=self.log_only,
            top_up_from_fallback=self.top_up_from_fallback,
        )
        policy.load_state(state)
        return policy

    def from_state(self, state: Mapping[str, Any] | None) -> Policy:
        """Deprecated: use :meth:`with_state` (the same call under a name that says it)."""
        _deprecated("from_state", "with_state")
        return self.with_state(state)

    # -- evaluation --------------------------------------------------------------

    def decide_and_count(self, ctx: RoundContext) -> Decision:
        """Judge one round context, then count it in the policy's state.

        The state advances with the decision: SOFT_BLOCK counts and streaks, refusal
        counts, BLOCK_AND_WARN pointers and a latched stop (saved with
        :meth:`to_state`). Judging the same context twice counts it twice.
        """
        if self._state.latched is not None:
            return self._latched_decision()
        variables = None
        if self._has_cel:
            variables = cel_module().Context(
                cel_variables(ctx, with_candidates=self._with_candidates)
            )
        acts: list[_Act] = []
        for index, rule in enumerate(self.rules):
            if rule.scope == "candidate":
                continue  # judged one candidate at a time (refuse_candidates)
            detail = rule.check(ctx, variables)
            shadow = self.log_only or rule.log_only
            if detail is None:
                if rule.severity is Severity.SOFT_BLOCK and not shadow:
                    self._state.soft_streaks.pop(rule.name, None)
                continue
            if shadow:
                acts.append(self._shadow(rule, detail, ctx, index))
            else:
                acts.append(self._act(rule, detail, ctx, index))
        return self._decide(acts)

    def evaluate(self, ctx: RoundContext) -> Decision:
        """Deprecated: use :meth:`decide_and_count` (the same call; it advances the state)."""
        _deprecated("evaluate", "decide_and_count")
        return self.decide_and_count(ctx)

    def refuse_candidates(
        self, ctx: RoundContext, candidates: Iterable[CandidateView]
    ) -> dict[int, tuple[str, str]]:
        """Judge each candidate by the candidate-scoped rules; keep no state.

        Returns:
            For each refused candidate's index, the first rule (in policy order)
            that refused it and why. Shadow-mode rules refuse nothing.
        """
        rules = [rule for rule in self.candidate_rules if not (self.log_only or rule.log_only)]
        if not rules:
            return {}
        variables = cel_variables(ctx, with_candidates=False)
        refused: dict[int, tuple[str, str]] = {}
        for candidate in candidates:
            for rule in rules:
                detail = rule.check_candidate(candidate, variables)
                if detail is not None:
                    refused[candidate.index] = (rule.name, f"rule '{rule.name}': {detail}")
                    break
        return refused

    def _firing(self, rule: Rule, detail: str, effect: Effect, **extra: Any) -> Firing:
        return Firing(
            rule=rule.name,
            severity=rule.severity,
            detail=detail,
            advice=rule.advice,
            log_only=effect == "shadow",
            effect=effect,
            description=rule.description,
            **extra,
        )

    def _ask(self, rule: Rule, reason: str, ctx: RoundContext) -> tuple[Outcome, Effect, Severity]:
        """Return what an ASK does: suspend, escalate if the run can't pause, or retry.

        The rule's own approvers decide; a rule naming none is answered by the
        campaign's (``ctx.default_approvers``); with neither, nobody may answer and the
        proposal is refused instead.
        """
        approvers = rule.approvers or ctx.default_approvers
        if not approvers:
            return Retry(reason), "retry", Severity.PERSISTENT_BLOCK
        if not ctx.can_suspend:
            return Escalate(reason, approvers), "escalate", Severity.ASK
        return Suspend(reason, approvers, rule.require_proof), "suspend", Severity.ASK

    def _act(self, rule: Rule, detail: str, ctx: RoundContext, index: int) -> _Act:
        """Apply a fired rule's severity, updating counters, pointers and the latch."""
        state = self._state
        reason = f"rule '{rule.name}' ({rule.severity.value}): {detail}"
        severity = rule.severity
        escalated = False
        attempts = 0
        if severity is Severity.SOFT_BLOCK:
            count = state.soft_counts.get(rule.name, 0) + 1
            streak = state.soft_streaks.get(rule.name, 0) + 1
            state.soft_counts[rule.name], state.soft_streaks[rule.name] = count, streak
            by_count = count >= self.max_soft_attempts
            by_streak = streak >= self.max_consecutive_soft_attempts
            mode = self.soft_block_mode
            attempts = streak if mode is SoftBlockMode.CONSECUTIVE else count
            escalated = (
                by_count
                if mode is SoftBlockMode.CUMULATIVE
                else by_streak
                if mode is SoftBlockMode.CONSECUTIVE
                else by_count or by_streak
            )
            if escalated:
                severity = self.escalate_to
                if severity is Severity.ASK:
                    # A human answers now; the rule gets a fresh set of attempts.
                    state.soft_counts.pop(rule.name, None)
                    state.soft_streaks.pop(rule.name, None)
        if severity is Severity.HARD_STOP:
            if self.latch_stop:
                state.latched = rule.name
            outcome: Outcome = Block(reason, "policy_denied")
            firing = self._firing(rule, detail, "block", escalated=escalated, attempts=attempts)
            return _Act(firing, outcome, Severity.HARD_STOP.strength, index)
        if severity is Severity.ASK:
            outcome, effect, acting = self._ask(rule, reason, ctx)
            if effect == "retry":
                state.refusals[rule.name] = state.refusals.get(rule.name, 0) + 1
                attempts = attempts or state.refusals[rule.name]
            firing = self._firing(rule, detail, effect, escalated=escalated, attempts=attempts)
            return _Act(firing, outcome, acting.strength, index)
        if severity is Severity.TOLERATE:
            return _Act(self._firing(rule, detail, "tolerate"), None, 0, index)
        if severity is Severity.BLOCK_AND_WARN:
            pointer = state.warned.get(rule.name)
            if (
                pointer is not None
                and pointer.proposal_key == ctx.proposal_key
                and (pointer.round_index, pointer.attempt) != (ctx.round_index, ctx.attempt)
            ):
                # The agent insisted: the same proposal in a later gate call. The
                # insistence is used up; a later repeat is warned afresh.
                del state.warned[rule.name]
                return _Act(self._firing(rule, detail, "override"), None, 0, index)
            state.warned[rule.name] = _Pointer(
                proposal_key=ctx.proposal_key, round_index=ctx.round_index, attempt=ctx.attempt
            )
        state.refusals[rule.name] = state.refusals.get(rule.name, 0) + 1
        attempts = attempts or state.refusals[rule.name]
        firing = self._firing(rule, detail, "retry", attempts=attempts)
        return _Act(firing, Retry(reason), severity.strength, index)

    def _shadow(self, rule: Rule, detail: str, ctx: RoundContext, index: int) -> _Act:
        """Describe what a log-only rule would do on a first violation; change nothing."""
        severity = rule.severity
        if severity is Severity.HARD_STOP:
            would = "block the round (policy_denied)"
        elif severity is Severity.ASK:
            _, effect, _ = self._ask(rule, "", ctx)
            would = {
                "suspend": "suspend for approval",
                "escalate": "escalate the run",
                "retry": "refuse the proposal",
            }[effect]
        elif severity is Severity.TOLERATE:
            would = "note the violation"
        else:
            would = "refuse the proposal"
        note = f"rule '{rule.name}' ({severity.value}) would {would}: {detail}"
        firing = self._firing(rule, note, "shadow")
        return _Act(firing, None, -1, index)

    def _decide(self, acts: list[_Act]) -> Decision:
        refusing = [act for act in acts if act.outcome is not None]
        top = max((act.strength for act in refusing), default=None)
        deciding = [act for act in refusing if act.strength == top]

        def order(act: _Act) -> tuple[int, int, int]:
            group = 0 if act in deciding else 1 if act.outcome is not None else 2
            return group, -act.strength, act.index

        fired = tuple(act.firing for act in sorted(acts, key=order))
        outcome = combine(*(act.outcome for act in deciding if act.outcome is not None))
        overrides = [act.firing.rule for act in acts if act.firing.effect == "override"]
        override = overrides[0] if overrides else None
        first = deciding[0].firing if deciding else None
        decision_attempts = first.attempts if first and isinstance(outcome, Retry) else 0
        return Decision(
            outcome=outcome,
            fired=fired,
            notes=tuple(
                f"rule '{a.firing.rule}': {a.firing.detail}"
                for a in acts
                if a.firing.effect == "tolerate"
            ),
            shadow=tuple(a.firing.detail for a in acts if a.firing.effect == "shadow"),
            escalated=any(act.firing.escalated for act in deciding),
            override=override,
            attempts=decision_attempts,
            feedback=render_feedback(
                outcome, fired, soft_limit=self._soft_limit(), override=override
            ),
            policy=self.name,
        )

    def _soft_limit(self) -> str:
        if self.soft_block_mode is SoftBlockMode.CONSECUTIVE:
            return f"{self.max_consecutive_soft_attempts} in a row"
        if self.soft_block_mode is SoftBlockMode.HYBRID:
            return f"{self.max_soft_attempts} (or {self.max_consecutive_soft_attempts} in a row)"
        return str(self.max_soft_attempts)

    def _latched_decision(self) -> Decision:
        rule = self._state.latched
        reason = f"stopped by rule '{rule}' (HARD_STOP); nothing runs until the policy is resumed"
        return Decision(
            outcome=Block(reason, "policy_denied"),
            latched=True,
            feedback=f"The campaign is stopped: {reason}.",
            policy=self.name,
        )

    def __repr__(self) -> str:
        return f"Policy(name={self.name!r}, rules={len(self.rules)})"
