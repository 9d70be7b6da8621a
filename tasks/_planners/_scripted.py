"""``ScriptedPlanner``: replay recorded model answers, one per call.

A transcript is a JSON Lines file; blank lines are skipped. Each line is one
answer, in either form:

* a chat-completions response body, as an endpoint returned it (has ``choices``);
* a short record ``{"answer": ..., "refusal": ..., "finish_reason": ..., "id": ...}``
  where ``answer`` is the model's text (a string) or the JSON object it wrote,
  and every key is optional except that one of ``answer`` / ``refusal`` is
  present. A ``"note"`` key is ignored, for the reader's benefit.

Both forms go through the same ``parse_completion`` as ``LLMPlanner``, so a
recorded refusal, truncation or bad answer is rejected exactly as a live one.
Running out of answers is a failure (``ProviderError``), not a rejection.
``position`` (the number of answers used) is the planner's whole state: save it
with the round's checkpoint and pass it back to resume.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from acceptance import Attempt
from policies import ProviderError, SpecInvalid
from tasks._planners._completion import parse_completion
from tasks._proposal import Proposal

_SHORT_KEYS = frozenset({"answer", "refusal", "finish_reason", "id", "note"})


class ScriptedPlanner:
    """Replay a transcript of model answers; usable as an ``accept`` producer.

    Args:
        path: The JSON Lines transcript.
        position: How many answers were already used (to resume a campaign).

    Raises:
        SpecInvalid: The file cannot be read, or a line is not a valid record
            (the message names the file and the line number).
    """

    def __init__(self, path: str | Path, *, position: int = 0) -> None:
        self.path = Path(path)
        self._answers = _load(self.path)
        if not 0 <= position <= len(self._answers):
            raise ValueError(
                f"position {position} is outside the transcript's {len(self._answers)} answers"
            )
        self.position = position

    def __repr__(self) -> str:
        return f"ScriptedPlanner(path={str(self.path)!r}, position={self.position})"

    def __len__(self) -> int:
        """Return the number of answers in the transcript."""
        return len(self._answers)

    @property
    def remaining(self) -> int:
        """Return how many answers are left."""
        return len(self._answers) - self.position

    async def __call__(self, previous: tuple[Attempt[Any], ...]) -> Proposal:
        """Return (or reject) the next recorded answer, and move past it."""
        if self.position >= len(self._answers):
            raise ProviderError(
                f"transcript {self.path.name} has no answer left after {len(self._answers)}",
                retryable=False,
                details={"path": str(self.path), "position": self.position},
            )
        body = self._answers[self.position]
        self.position += 1
        return parse_completion(body)


def _load(path: Path) -> list[dict[str, Any]]:
    """Read every record of the transcript as a chat-completions response body."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecInvalid(
            f"{path}: cannot read the transcript ({type(exc).__name__})",
            details={"path": str(path)},
        ) from None
    answers = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            raise SpecInvalid(
                f"{path}:{number}: not a JSON object", details={"path": str(path), "line": number}
            ) from None
        answers.append(_as_body(record, path, number))
    return answers


def _as_body(record: Any, path: Path, number: int) -> dict[str, Any]:
    """Turn one record into a chat-completions response body."""
    where = {"path": str(path), "line": number}
    if not isinstance(record, dict):
        raise SpecInvalid(f"{path}:{number}: a record must be a JSON object", details=where)
    if "choices" in record:
        return record
    unknown = sorted(set(record) - _SHORT_KEYS)
    if unknown:
        raise SpecInvalid(f"{path}:{number}: unknown field {unknown[0]!r}", details=where)
    if "answer" not in record and "refusal" not in record:
        raise SpecInvalid(
            f"{path}:{number}: a record needs 'choices', 'answer' or 'refusal'", details=where
        )
    answer = record.get("answer")
    content = answer if answer is None or isinstance(answer, str) else json.dumps(answer)
    body: dict[str, Any] = {
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "refusal": record.get("refusal"),
                },
                "finish_reason": record.get("finish_reason", "stop"),
            }
        ],
    }
    if "id" in record:
        body["id"] = record["id"]
    return body
