"""The campaign-wide counts that policies read, advanced the same way by the engine and the replay.

Kept apart from ``flows._engine._campaign_state`` (which loads the planners and numpy) so
that ``unattended replay`` can use exactly the engine's arithmetic without them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Counters:
    """Budget spent, the current streak of fallback rounds, and every decision so far.

    ``budget_spent`` counts the batches' simulations; ``verifier_hours`` the
    verifier tasks the gate ran on proposals (site ``cost.node_hours_per_verifier``).
    Policies see their sum (:attr:`spent`).

    The saved state leaves ``decisions`` out: they are recorded one by one already,
    and a list saved with every round grew the record with the square of the rounds.
    :meth:`from_state` takes them back from the record (``Checkpoint.decisions``).
    """

    budget_spent: float = 0.0
    verifier_hours: float = 0.0
    consecutive_fallbacks: int = 0
    decisions: list[str] = field(default_factory=list)
    # Tasks of the last batch that did not finish "done", for rules on failures.
    failed_last_batch: int = 0
    # Tasks that finished "done" (with a value the objective reads) in every batch so far;
    # None for a checkpoint written before it was counted (then: unknown, not "none").
    tasks_done: int | None = 0
    # The most frequent failure code of the last batch (None: nothing failed).
    last_failure_code: str | None = None

    def count_results(self, statuses: Iterable[tuple[str, str | None]]) -> None:
        """Count a batch's done tasks and its most frequent failure code.

        ``statuses`` are the results' ``(status, error_code)`` pairs.
        """
        codes: dict[str, int] = {}
        done = 0
        for status, code in statuses:
            if status == "done":
                done += 1
            else:
                key = code or status
                codes[key] = codes.get(key, 0) + 1
        self.last_failure_code = max(sorted(codes), key=codes.__getitem__) if codes else None
        if self.tasks_done is not None:
            self.tasks_done += done

    @property
    def spent(self) -> float:
        """Return every node-hour spent: simulations and verifier tasks."""
        return self.budget_spent + self.verifier_hours

    def fallbacks_with(self, disposition: str) -> int:
        """Return the fallback streak if this round runs a ``disposition`` batch (it included)."""
        return self.consecutive_fallbacks + 1 if disposition == "fallback" else 0

    def after_batch(self, disposition: str, node_hours: float) -> None:
        """Advance the counters once a round's batch ran."""
        self.budget_spent += node_hours
        self.consecutive_fallbacks = self.fallbacks_with(disposition)

    def to_state(self) -> dict[str, Any]:
        """Return the counters as JSON-ready data."""
        return {
            "budget_spent": self.budget_spent,
            "verifier_hours": self.verifier_hours,
            "consecutive_fallbacks": self.consecutive_fallbacks,
            "failed_last_batch": self.failed_last_batch,
            "tasks_done": self.tasks_done,
            "last_failure_code": self.last_failure_code,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any] | None, decisions: Iterable[str] = ()) -> Counters:
        """Rebuild the counters, with the recorded ``decisions``; unknown keys are ignored."""
        # No state: nothing ran yet (0). A state without the count: written before it existed.
        tasks_done = state.get("tasks_done") if state else 0
        state = state or {}
        code = state.get("last_failure_code")
        return cls(
            budget_spent=float(state.get("budget_spent", 0.0)),
            verifier_hours=float(state.get("verifier_hours", 0.0)),
            consecutive_fallbacks=int(state.get("consecutive_fallbacks", 0)),
            decisions=[str(d) for d in decisions],
            failed_last_batch=int(state.get("failed_last_batch", 0)),
            tasks_done=None if tasks_done is None else int(tasks_done),
            last_failure_code=None if code is None else str(code),
        )
