"""Read an OpenAI-compatible chat-completions response into a ``Proposal``.

``LLMPlanner`` and ``ScriptedPlanner`` share this code path, so a recorded
refusal, truncation or bad answer is treated exactly as a live one would be:

* a malformed envelope (no ``choices[0].message``) is a provider FAILURE
  (``policies.ProviderError``), never a rejection;
* a ``refusal`` rejects with ``check="refusal"``;
* ``finish_reason == "length"`` rejects with ``check="truncation"``;
* an answer that is not valid ``Proposal`` JSON rejects with ``check="schema"``,
  the reason built from field paths and messages, never from the answer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from acceptance import Attempt, Rejected
from policies import ProviderError
from tasks._proposal import Proposal

#: Answers longer than this are rejected unread (a hostile or runaway model).
MAX_ANSWER_CHARS = 1_000_000


def parse_completion(body: Any, *, max_tokens: int | None = None) -> Proposal:
    """Return the ``Proposal`` in a chat-completions response body.

    Raises:
        acceptance.Rejected: The model refused, was truncated, or its answer
            does not follow the schema.
        policies.ProviderError: The body is not a chat-completions response.
    """
    message, finish_reason = _message_of(body)
    if message.get("refusal"):
        raise Rejected(
            "the model refused to answer; propose candidates for the stated objective",
            check="refusal",
        )
    if finish_reason == "length":
        limit = f" at max_tokens={max_tokens}" if max_tokens is not None else ""
        raise Rejected(
            f"the answer was cut off{limit}; keep the rationale short", check="truncation"
        )
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ProviderError(
            "malformed chat-completions response: message.content is not a string",
            details={"field": "choices[0].message.content"},
        )
    if content is not None and len(content) > MAX_ANSWER_CHARS:
        raise Rejected(
            f"the answer has {len(content)} characters; the limit is {MAX_ANSWER_CHARS}",
            check="schema",
        )
    if content is None or not content.strip():
        raise Rejected("the answer was empty; reply with the JSON object", check="schema")
    try:
        proposal = Proposal.model_validate_json(_unfenced(content))
    except ValidationError as exc:
        raise Rejected(validation_reason(exc), check="schema") from None
    response_id = body.get("id")
    if isinstance(response_id, str):
        proposal = proposal.model_copy(update={"response_id": response_id})
    return proposal


def validation_reason(exc: ValidationError) -> str:
    """Describe a ``ValidationError`` by field path and message, without the input."""
    parts = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False)[:5]:
        # A location can hold a key the model invented: keep it short.
        location = ".".join(str(p)[:40] for p in error.get("loc", ()))[:120] or "answer"
        parts.append(f"{location}: {error.get('msg', 'invalid')}")
    if exc.error_count() > 5:
        parts.append(f"and {exc.error_count() - 5} more errors")
    return "; ".join(parts) or "invalid answer"


def reask_messages(previous: Sequence[Attempt[Any]]) -> list[dict[str, str]]:
    """Return an assistant message and a user message per earlier attempt.

    The assistant message repeats the rejected proposal (its model-written
    fields) or, when the producer itself rejected the answer, says there was no
    usable one; roles alternate, as strict chat templates require.
    """
    messages: list[dict[str, str]] = []
    for attempt in previous:
        value = attempt.value
        if isinstance(value, Proposal):
            said = json.dumps(value.answer())
        elif isinstance(value, dict):
            said = json.dumps({k: value.get(k) for k in ("rationale", "candidates")})
        else:
            said = f"(attempt {attempt.number} gave no usable proposal)"
        messages.append({"role": "assistant", "content": said})
        messages.append(
            {
                "role": "user",
                "content": (
                    f"Attempt {attempt.number} was rejected by the {attempt.rejected_by!s} "
                    f"check: {attempt.reason!s}. Propose a corrected batch."
                ),
            }
        )
    return messages


def _message_of(body: Any) -> tuple[dict[str, Any], Any]:
    """Return ``choices[0].message`` and its finish reason, or raise ``ProviderError``."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ProviderError(
            "malformed chat-completions response: no choices", details={"field": "choices"}
        )
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ProviderError(
            "malformed chat-completions response: no message",
            details={"field": "choices[0].message"},
        )
    return message, choices[0].get("finish_reason")


def _unfenced(content: str) -> str:
    """Strip one Markdown code fence around the JSON, which some models add."""
    text = content.strip()
    if text.startswith("```") and text.endswith("```") and len(text) >= 6:
        text = text[3:-3]
        newline = text.find("\n")
        if newline != -1 and not text[:newline].strip().startswith(("{", "[")):
            text = text[newline + 1 :]
    return text
