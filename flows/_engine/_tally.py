"""How far the running batch is: a small file ``run``'s follower reads between records.

A batch's results reach the provenance when it ends (one transaction), so during a
long batch the database says nothing of the tasks that already ended. The engine's
``task`` events are counted here, per round, into ``tally.json`` in the campaign
directory (written atomically, at most every ``every_seconds``): ``{"round": 3,
"ended": 40, "failed": 2, "interrupted": 0}``; a round's first task is written at
once. It is a display aid, never read back
by the campaign: the provenance stays the record.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

TALLY_FILE = "tally.json"


class TaskTally:
    """Count the current round's ended tasks into ``path`` (``on_event`` is the hook)."""

    def __init__(
        self,
        path: Path,
        *,
        every_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.every_seconds = every_seconds
        self.clock = clock
        self.round: int | None = None
        self.statuses: Counter[str] = Counter()
        self._written = -float("inf")

    def on_event(self, kind: str, data: Mapping[str, Any]) -> None:
        """Count a ``task`` event (the round's status); other events are not this one's."""
        if kind != "task":
            return
        index = int(data["round"])
        new_round = index != self.round
        if new_round:
            self.round, self.statuses = index, Counter()
        self.statuses[str(data["status"])] += 1
        if new_round or self.clock() - self._written >= self.every_seconds:
            self.write()

    def write(self) -> None:
        """Write the tally now (best effort: a full disk must not stop the batch)."""
        self._written = self.clock()
        interrupted = self.statuses["interrupted"]
        ended = sum(self.statuses.values()) - interrupted
        document = {
            "round": self.round,
            "ended": ended,
            "failed": ended - self.statuses["done"],
            "interrupted": interrupted,
        }
        partial = self.path.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            partial.write_text(json.dumps(document))
            os.replace(partial, self.path)


def read_tally(path: Path) -> dict[str, int] | None:
    """Return the tally ``TaskTally`` wrote, or None (none yet, or unreadable)."""
    try:
        document = json.loads(path.read_text())
        return {k: int(document[k]) for k in ("round", "ended", "failed", "interrupted")}
    except (OSError, ValueError, KeyError, TypeError):
        return None
