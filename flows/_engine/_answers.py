"""The answer journal: each model answer written down the moment it arrives.

An attempt reaches the provenance database once its checks have run. A process
killed while they run (a verifier task on the allocation takes a while) would
ask the model again on restart; the journal prevents that. It keeps, per gate
call and attempt number, the planner's value or its own rejection, appended and
fsynced to ``answers.jsonl`` in the campaign directory before any check runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from flows._paths import append_private


class AnswerJournal:
    """Append-only, fsynced record of planner answers keyed by gate call and attempt."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: dict[str, dict[str, Any]] = {}
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a kill: that answer was never used
                self._entries[entry["key"]] = entry

    @staticmethod
    def key(gate_call_id: int, number: int) -> str:
        """Return the key of attempt ``number`` of a gate call."""
        return f"{gate_call_id}/{number}"

    def get(self, key: str) -> dict[str, Any] | None:
        """Return the recorded answer (``value`` or ``rejected``/``reason``), if any."""
        return self._entries.get(key)

    def put(self, key: str, entry: dict[str, Any]) -> None:
        """Record an answer durably before anything else happens to it."""
        record = {"key": key, **entry}
        descriptor = append_private(self.path)
        try:
            os.write(descriptor, (json.dumps(record) + "\n").encode("utf-8"))
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        self._entries[key] = record
