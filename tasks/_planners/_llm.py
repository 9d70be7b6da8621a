"""``LLMPlanner``: ask an OpenAI-compatible endpoint (vLLM on the allocation) for a batch.

One call of the planner is one chat-completions request with a strict JSON
schema as ``response_format``. What the model said is judged by
``parse_completion`` (rejections); whether the endpoint answered at all is
judged here (``ProviderError`` failures, never rejections). The API key goes
into the Authorization header only: it is kept as a ``SecretStr`` and never
appears in a message, a repr or a log record.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from typing import Any

import httpx
from opentelemetry import trace
from pydantic import SecretStr

from acceptance import Attempt
from policies import ProviderError
from tasks._planners._completion import parse_completion, reask_messages
from tasks._proposal import Bounds, Proposal

_tracer = trace.get_tracer("tasks.planners")

_SYSTEM = (
    "You plan simulation campaigns that MINIMISE an objective. Each turn you propose "
    "one batch of candidates. Reply with one JSON object only: first a short "
    '"rationale", then "candidates", a list of exactly {count} distinct points, each a '
    "list of {dim} finite numbers inside the bounds."
)


class LLMPlanner:
    """Propose batches by asking a chat-completions endpoint; usable as an ``accept`` producer.

    Args:
        base_url: The API root, e.g. ``http://node17:8000/v1``; ``/chat/completions`` is added.
        model: The served model name.
        api_key: Sent as ``Authorization: Bearer ...`` when given.
        count: The batch size.
        bounds: The box candidates must lie in.
        objective: What is being minimised, in words for the model.
        timeout: Seconds for the whole request.
        temperature: Sampling temperature (0 for the most repeatable answers).
        max_tokens: The answer's token limit; hitting it is a ``truncation`` rejection.
        client: An ``httpx.AsyncClient`` to reuse; the planner never closes it.
            Without one, each call opens and closes its own.
        max_observations: How many of the best observations the prompt shows.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: SecretStr | str | None,
        count: int,
        bounds: Bounds,
        objective: str,
        timeout: float = 120.0,
        temperature: float = 0.0,
        max_tokens: int = 2048,
        client: httpx.AsyncClient | None = None,
        max_observations: int = 50,
    ) -> None:
        if count < 1:
            raise ValueError("count must be at least 1")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError("timeout must be a positive number of seconds")
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError("temperature must be a non-negative number")
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        self.url = base_url.rstrip("/") + "/chat/completions"
        if httpx.URL(self.url).scheme not in ("http", "https"):
            raise ValueError("base_url must be an http:// or https:// URL")
        self.model = model
        self._api_key = api_key if isinstance(api_key, SecretStr | None) else SecretStr(api_key)
        self.count = count
        self.bounds = bounds
        self.objective = objective
        self.timeout = float(timeout)
        self.temperature = float(temperature)
        self.max_tokens = max_tokens
        self._client = client
        self.max_observations = max_observations
        self._observations: list[tuple[list[float], float]] = []

    def __repr__(self) -> str:
        return f"LLMPlanner(model={self.model!r}, count={self.count}, dim={self.bounds.dim})"

    def observe(self, points: Sequence[Sequence[float]], values: Sequence[float]) -> None:
        """Remember evaluated candidates; the best of them are shown in later prompts."""
        for point, value in zip(points, values, strict=True):
            if math.isfinite(value):
                self._observations.append(([float(v) for v in point], float(value)))

    def messages(self, previous: Sequence[Attempt[Any]] = ()) -> list[dict[str, str]]:
        """Return the chat messages for a call after ``previous`` attempts."""
        best = sorted(self._observations, key=lambda pair: pair[1])[: self.max_observations]
        lines = [
            f"Objective: {self.objective}",
            f"Bounds: lower {list(self.bounds.lower)}, upper {list(self.bounds.upper)}.",
            f"Propose exactly {self.count} candidates of {self.bounds.dim} coordinates.",
        ]
        if best:
            lines.append("Best observations so far (candidate -> value):")
            lines.extend(f"{point} -> {value:.6g}" for point, value in best)
        else:
            lines.append("Nothing has been evaluated yet.")
        system = _SYSTEM.format(count=self.count, dim=self.bounds.dim)
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": "\n".join(lines)},
            *reask_messages(previous),
        ]

    def request_body(self, previous: Sequence[Attempt[Any]] = ()) -> dict[str, Any]:
        """Return the JSON body of the chat-completions request."""
        return {
            "model": self.model,
            "messages": self.messages(previous),
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "proposal",
                    "strict": True,
                    "schema": Proposal.answer_schema(count=self.count, dim=self.bounds.dim),
                },
            },
        }

    async def __call__(self, previous: tuple[Attempt[Any], ...]) -> Proposal:
        """Ask the endpoint once; reject what the model said, fail if the endpoint did."""
        body = self.request_body(previous)
        with _tracer.start_as_current_span(
            f"chat {self.model}", kind=trace.SpanKind.CLIENT
        ) as span:
            span.set_attribute("gen_ai.operation.name", "chat")
            span.set_attribute("gen_ai.request.model", self.model)
            span.set_attribute("gen_ai.request.max_tokens", self.max_tokens)
            span.set_attribute("gen_ai.request.temperature", self.temperature)
            answer = await self._post(body)
            _record_response(span, answer)
        # Judged outside the span: a rejected answer is not a failed model call.
        return parse_completion(answer, max_tokens=self.max_tokens)

    async def _post(self, body: dict[str, Any]) -> Any:
        """POST the request and return the decoded JSON, or raise ``ProviderError``."""
        headers = {"Content-Type": "application/json"}
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key.get_secret_value()}"
        content = json.dumps(body, allow_nan=False).encode()
        details: dict[str, Any] = {"model": self.model, "endpoint": _endpoint(self.url)}
        try:
            async with asyncio.timeout(self.timeout):
                if self._client is not None:
                    response = await self._client.post(
                        self.url, content=content, headers=headers, timeout=self.timeout
                    )
                else:
                    async with httpx.AsyncClient(timeout=self.timeout) as client:
                        response = await client.post(self.url, content=content, headers=headers)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise ProviderError(
                f"model endpoint did not answer within {self.timeout:g} s",
                details={**details, "status_code": None, "cause": type(exc).__name__},
            ) from None
        except httpx.HTTPError as exc:
            raise ProviderError(
                f"model endpoint unreachable ({type(exc).__name__})",
                details={**details, "status_code": None, "cause": type(exc).__name__},
            ) from None
        status = response.status_code
        if status >= 400:
            raise ProviderError(
                f"model endpoint answered HTTP {status}",
                retryable=status >= 500 or status in (408, 429),
                details={**details, "status_code": status},
            )
        try:
            return response.json()
        except (ValueError, RecursionError):  # a hostile, deeply nested body
            raise ProviderError(
                f"model endpoint answered HTTP {status} with a body that is not JSON",
                details={**details, "status_code": status},
            ) from None


def _endpoint(url: str) -> str:
    """Return the URL without user info or query, safe to record."""
    parsed = httpx.URL(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"


def _record_response(span: trace.Span, answer: Any) -> None:
    """Put the response id, finish reason and token counts on the model-call span."""
    if not isinstance(answer, dict):
        return
    if isinstance(answer.get("id"), str):
        span.set_attribute("gen_ai.response.id", answer["id"])
    choices = answer.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        if isinstance(reason, str):
            span.set_attribute("gen_ai.response.finish_reasons", [reason])
    usage = answer.get("usage")
    if isinstance(usage, dict):
        for key, name in (("prompt_tokens", "input"), ("completion_tokens", "output")):
            if isinstance(usage.get(key), int):
                span.set_attribute(f"gen_ai.usage.{name}_tokens", usage[key])
