"""The gate's OpenTelemetry records, through the API only.

One INTERNAL span ``accept <name>`` per call, a child span ``accept.attempt
<name>`` per attempt, and one ``gen_ai.evaluation.result`` log record per check
that ran (and per producer rejection), emitted while the attempt span is
current so it carries its trace and span ids.

Without an SDK installed as the provider the API would hand out non-recording
spans at a cost of several microseconds each; the gate checks the global
providers once per call and then skips span and record creation entirely.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import _logs, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from pydantic_core import to_json

_tracer = trace.get_tracer("unattended.acceptance")
_logger = _logs.get_logger("unattended.acceptance")

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_CAPTURE_MODES = frozenset({"SPAN_ONLY", "SPAN_AND_EVENT"})
EVALUATION_EVENT = "gen_ai.evaluation.result"


def capture_content() -> bool:
    """Return True when rejected values may be put on spans (OpenTelemetry's GenAI switch)."""
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().upper() in _CAPTURE_MODES


def response_id(value: Any) -> str | None:
    """Return a provider response id carried by ``value``, if it has one."""
    found = getattr(value, "response_id", None)
    if found is None and isinstance(value, Mapping):
        found = value.get("response_id")
    return str(found) if found is not None else None


_NO_OP_PROVIDERS = frozenset(
    {"ProxyTracerProvider", "NoOpTracerProvider", "ProxyLoggerProvider", "NoOpLoggerProvider"}
)


def _installed(provider: object) -> bool:
    """Return True when ``provider`` is a real one (an SDK), not the API's proxy or no-op."""
    return type(provider).__name__ not in _NO_OP_PROVIDERS


class GateSpan:
    """The ``accept <name>`` span, finished with the gate's disposition."""

    def __init__(self, span: Span | None) -> None:
        self._span = span

    def finish(self, disposition: str, used: int, *, error_type: str | None = None) -> None:
        """Record how the gate ended; an ``error_type`` marks the span ERROR."""
        if self._span is None:
            return
        self._span.set_attribute("unattended.accept.attempts.used", used)
        self._span.set_attribute("unattended.accept.disposition", disposition)
        if error_type is not None:
            self._span.set_attribute("error.type", error_type)
            self._span.set_status(Status(StatusCode.ERROR))


class AttemptSpan:
    """The ``accept.attempt <name>`` span and the evaluation records under it."""

    def __init__(self, span: Span | None, capture: bool, logging: bool) -> None:
        self._span = span
        self._capture = capture
        self._logging = logging
        self.trace_id: str | None = None
        self.span_id: str | None = None
        if span is not None:
            context = span.get_span_context()
            if context.is_valid:
                self.trace_id = format(context.trace_id, "032x")
                self.span_id = format(context.span_id, "016x")

    def evaluation(self, check: str, *, passed: bool, reason: str | None, value: Any) -> None:
        """Emit one ``gen_ai.evaluation.result`` record for a check or stage."""
        if not self._logging:
            return
        attributes: dict[str, Any] = {
            "gen_ai.evaluation.name": check,
            "gen_ai.evaluation.score.label": "pass" if passed else "fail",
        }
        if reason is not None:
            attributes["gen_ai.evaluation.explanation"] = reason
        if (rid := response_id(value)) is not None:
            attributes["gen_ai.response.id"] = rid
        _logger.emit(event_name=EVALUATION_EVENT, attributes=attributes)

    def score(self, name: str, score: float, value: Any) -> None:
        """Emit one ``gen_ai.evaluation.result`` record for a soft score."""
        if not self._logging:
            return
        attributes: dict[str, Any] = {
            "gen_ai.evaluation.name": name,
            "gen_ai.evaluation.score.value": score,
        }
        if (rid := response_id(value)) is not None:
            attributes["gen_ai.response.id"] = rid
        _logger.emit(event_name=EVALUATION_EVENT, attributes=attributes)

    def capture_value(self, value: Any) -> None:
        """Put a rejected value on the span as JSON, only when capture is switched on."""
        if (
            self._capture
            and value is not None
            and self._span is not None
            and self._span.is_recording()
        ):
            self._span.set_attribute(
                "unattended.accept.value", to_json(value, fallback=repr).decode()
            )


class GateTelemetry:
    """Spans and records of one ``accept`` call."""

    def __init__(self, name: str, attempts: int) -> None:
        self.name = name
        self.attempts = attempts
        self.capture = capture_content()
        self.tracing = _installed(trace.get_tracer_provider())
        self.logging = _installed(_logs.get_logger_provider())

    @contextmanager
    def gate_span(self) -> Iterator[GateSpan]:
        """Open the ``accept <name>`` span; a failure marks it ERROR with ``error.type``."""
        if not self.tracing:
            yield GateSpan(None)
            return
        with _tracer.start_as_current_span(
            f"accept {self.name}",
            kind=SpanKind.INTERNAL,
            attributes={
                "unattended.accept.name": self.name,
                "unattended.accept.attempts.max": self.attempts,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield GateSpan(span)
            except BaseException as exc:
                # NotAccepted already set its own attributes; a failure sets them here.
                if type(exc).__name__ != "NotAccepted":
                    span.set_attribute("error.type", type(exc).__qualname__)
                    span.set_status(Status(StatusCode.ERROR))
                    span.record_exception(exc, escaped=True)
                raise

    @contextmanager
    def attempt_span(self, number: int) -> Iterator[AttemptSpan]:
        """Open the ``accept.attempt <name>`` span; a rejection leaves its status unset."""
        if not self.tracing:
            yield AttemptSpan(None, self.capture, self.logging)
            return
        with _tracer.start_as_current_span(
            f"accept.attempt {self.name}",
            kind=SpanKind.INTERNAL,
            attributes={"unattended.accept.attempt": number},
            record_exception=True,
            set_status_on_exception=True,
        ) as span:
            yield AttemptSpan(span, self.capture, self.logging)
