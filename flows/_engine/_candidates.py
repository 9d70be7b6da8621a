"""Per-candidate oversight: which candidates of a gate call run, and what became of the rest.

A policy's candidate-scoped rules judge each candidate of the batch the gate
returned (with the verifier's prediction for it, read back from the recorded
attempt, so a replay judges exactly as the first run did). Refused candidates
leave the batch; if the policy says so, the fallback's candidates top it back up.
The :class:`CandidateLedger` then follows the batch through the round and names
each candidate's fate: launched, refused by a rule, struck by an approver, or
skipped because the batch never ran. Everything here is a pure function of the
gate's recorded outcome, the fallback and the answers, so a replayed round
derives the same fates (the store keeps the first one recorded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flows._provenance import CandidateFateRecord
from flows._provenance._rows import PREDICTION_SCORE
from policies import CandidateView, Policy, RoundContext


def candidate_predictions(attempts: Sequence[Any], size: int) -> list[float | None]:
    """Return the verifier's prediction per candidate of the accepted attempt (None: unknown)."""
    accepted = next((a for a in attempts if a.rejected_by is None), None)
    scores = dict(getattr(accepted, "scores", None) or {})
    predictions: list[float | None] = []
    for position in range(size):
        value = scores.get(f"{PREDICTION_SCORE}.{position}")
        number = float(value) if isinstance(value, int | float | str) else math.nan
        predictions.append(None if math.isnan(number) else number)
    return predictions


@dataclass
class _Entry:
    source: str
    index: int
    candidate: list[float]
    fate: str | None = None  # None: still planned to run
    rule: str | None = None
    actor: str | None = None
    reason: str | None = None


@dataclass
class CandidateLedger:
    """The candidates of one gate call and their fates, in the order they were considered."""

    entries: list[_Entry] = field(default_factory=list)

    def planned(self) -> list[list[float]]:
        """Return the candidates still planned to run, in order (the batch to launch)."""
        return [list(e.candidate) for e in self.entries if e.fate is None]

    def planned_origins(self) -> list[tuple[str, int]]:
        """Return where each planned candidate came from: ``(source, index)``, in batch order."""
        return [(e.source, e.index) for e in self.entries if e.fate is None]

    def refused(self) -> list[CandidateFateRecord]:
        """Return the fates of the candidates a rule refused."""
        return [self._record(e) for e in self.entries if e.fate == "refused"]

    def skip(self, reason: str) -> list[CandidateFateRecord]:
        """Mark every planned candidate skipped (the batch did not run); return all fates."""
        for entry in self.entries:
            if entry.fate is None:
                entry.fate, entry.reason = "skipped", reason
        return [self._record(e) for e in self.entries]

    def settle(
        self,
        launched: Sequence[Sequence[float]],
        fallback: Sequence[Sequence[float]],
        *,
        struck_by: str | None,
        reason: str,
    ) -> list[CandidateFateRecord]:
        """Mark what ``launched`` holds as launched, the other planned ones struck or skipped.

        Args:
            launched: The batch that runs.
            fallback: The fallback's candidates (a launched candidate not in the
                ledger is found there, e.g. after a timed-out approval ran it).
            struck_by: The approver who kept only part of the batch, if one did.
            reason: Why a planned candidate that does not run was left out.
        """
        remaining = [list(map(float, c)) for c in launched]
        for entry in self.entries:
            if entry.fate is not None:
                continue
            if entry.candidate in remaining:
                remaining.remove(entry.candidate)
                entry.fate = "launched"
            elif struck_by is not None:
                entry.fate, entry.actor, entry.reason = "struck", struck_by, reason
            else:
                entry.fate, entry.reason = "skipped", reason
        rows = [list(map(float, c)) for c in fallback]
        taken = {e.index for e in self.entries if e.source == "fallback"}
        for candidate in remaining:
            position = next(
                (j for j, row in enumerate(rows) if row == candidate and j not in taken), None
            )
            if position is not None:  # a candidate the policy itself wrote is not ours to record
                taken.add(position)
                self.entries.append(_Entry("fallback", position, candidate, "launched"))
        return [self._record(e) for e in self.entries]

    @staticmethod
    def _record(entry: _Entry) -> CandidateFateRecord:
        return CandidateFateRecord(
            source=entry.source,
            index=entry.index,
            candidate=list(entry.candidate),
            fate=entry.fate or "skipped",
            rule=entry.rule,
            actor=entry.actor,
            reason=entry.reason,
        )


def oversee(
    policy: Policy,
    context: RoundContext,
    proposed: Sequence[Sequence[float]],
    predictions: Sequence[float | None],
    fallback: Sequence[Sequence[float]],
) -> CandidateLedger:
    """Judge each proposed candidate by the policy's candidate rules; top up if it says so."""
    ledger = CandidateLedger(
        [_Entry("proposal", i, list(map(float, c))) for i, c in enumerate(proposed)]
    )
    if not policy.candidate_rules:
        return ledger
    views = [
        CandidateView(index=e.index, x=e.candidate, prediction=predictions[e.index])
        for e in ledger.entries
    ]
    _refuse(ledger.entries, policy.refuse_candidates(context, views))
    missing = len(proposed) - len(ledger.planned())
    if missing and policy.top_up_from_fallback:
        known = [e.candidate for e in ledger.entries]
        spare = [
            _Entry("fallback", j, list(map(float, c)))
            for j, c in enumerate(fallback)
            if list(map(float, c)) not in known
        ]
        refused = policy.refuse_candidates(
            context, [CandidateView(index=e.index, x=e.candidate) for e in spare]
        )
        _refuse(spare, refused)
        considered = []
        for entry in spare:
            if missing == 0:
                break
            considered.append(entry)
            if entry.fate is None:
                missing -= 1
        ledger.entries.extend(considered)
    return ledger


def _refuse(entries: Sequence[_Entry], refused: dict[int, tuple[str, str]]) -> None:
    for entry in entries:
        if entry.index in refused:
            entry.fate = "refused"
            entry.rule, entry.reason = refused[entry.index]
