"""``accept``: ask, check in order, re-ask with the reasons, fall back or stop.

A rejection (``Rejected``, or a pydantic ``ValidationError``) is recorded and,
while attempts remain, answered with a new attempt. Anything else a producer, a
check, a score or the fallback raises is a failure and propagates at once; when the
producer or a check fails, the attempt it ended (``failed_by`` the check, or
``"producer"`` with no value) is handed to ``on_failed_attempt`` first, so the caller
can record it.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import ValidationError

from acceptance._telemetry import GateTelemetry
from acceptance._types import Attempt, NotAccepted, Outcome, Rejected, Verdict

T = TypeVar("T")

Producer = Callable[[tuple[Attempt[T], ...]], "T | Awaitable[T]"]
#: A check returns None, or a mapping of what it did (recorded as its verdict's details).
Check = Callable[[T], "Awaitable[Mapping[str, Any] | None] | Mapping[str, Any] | None"]
Score = Callable[[T], "float | Awaitable[float]"]
Fallback = Callable[[], "T | Awaitable[T]"]
#: Given the attempt a failing check ended, before the failure propagates; sync or async.
FailedAttemptHook = Callable[[Attempt[T]], "Awaitable[None] | None"]

_perf = time.perf_counter


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a sync or async function and return its result."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def _name_of(fn: Callable[..., Any]) -> str:
    """Return the name a check or score is recorded under."""
    name = getattr(fn, "__name__", None) or getattr(fn, "name", None)
    return str(name) if name else type(fn).__name__


def validation_reason(exc: ValidationError) -> str:
    """Describe a ``ValidationError`` by field and message, without the input values."""
    parts = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        location = ".".join(str(p) for p in error.get("loc", ())) or "value"
        parts.append(f"{location}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid value"


def _failure_reason(exc: Exception) -> str:
    """Describe a check's failure: its message (errors here name codes and ids, not values)."""
    message = getattr(exc, "message", None) or str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _details_of(exc: Exception) -> Mapping[str, Any] | None:
    """Return what a failing check's error says it did (its ``details`` mapping), if any."""
    details = getattr(exc, "details", None)
    return details if isinstance(details, Mapping) else None


async def accept(
    producer: Producer[T],
    *,
    checks: Sequence[Check[T]] = (),
    attempts: int = 1,
    fallback: Fallback[T] | None = None,
    name: str,
    scores: Sequence[Score[T]] = (),
    on_failed_attempt: FailedAttemptHook[T] | None = None,
) -> Outcome[T]:
    """Ask ``producer`` for a value until one passes every check, within ``attempts``.

    Args:
        producer: Called with every earlier attempt (``()`` first); sync or async.
            It rejects its own output by raising ``Rejected(reason, check=stage)``
            or a pydantic ``ValidationError`` (recorded as ``"schema"``).
        checks: Run in order, cheapest first; the first rejection ends the
            attempt. Each takes the value and raises ``Rejected`` or a
            ``ValidationError`` to reject. Sync or async. A check may return a
            mapping of what it did (JSON values): it becomes its verdict's ``details``.
        attempts: The only budget (at least 1). 1 means no re-ask.
        fallback: Called with no arguments when no attempt passes. Its value is
            not checked: it must be valid by construction.
        name: Names the gate in telemetry and errors.
        scores: Soft signals run on a value that passed every check; recorded
            on the attempt under the function's name, never gating.
        on_failed_attempt: Called with the attempt the producer or a check failed
            (raised anything but a rejection): ``failed_by`` names the check, or is
            ``"producer"`` (the attempt has no value); ``reason`` and the verdict's
            ``details`` come from the error. The error then propagates.

    Returns:
        The ``Outcome``: the value, ``"accepted"`` or ``"fallback"``, every attempt.

    Raises:
        NotAccepted: Every attempt was rejected and there is no fallback.
        ValueError: ``attempts`` is below 1.
        Exception: Whatever a producer, check, score or fallback raised as a failure
            (after ``on_failed_attempt`` for a producer's or a check's).
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    named_checks = [(_name_of(check), check) for check in checks]
    named_scores = [(_name_of(score), score) for score in scores]
    telemetry = GateTelemetry(name, attempts)
    history: list[Attempt[T]] = []
    with telemetry.gate_span() as gate:
        for number in range(1, attempts + 1):
            attempt = await _attempt(
                producer,
                named_checks,
                named_scores,
                number,
                tuple(history),
                telemetry,
                on_failed_attempt,
            )
            history.append(attempt)
            if attempt.rejected_by is None:
                gate.finish("accepted", number)
                return Outcome.model_construct(
                    value=attempt.value, disposition="accepted", attempts=tuple(history)
                )
        if fallback is None:
            gate.finish("not_accepted", attempts, error_type="NotAccepted")
            raise NotAccepted(name, tuple(history))
        value = await _call(fallback)
        gate.finish("fallback", attempts)
        return Outcome.model_construct(value=value, disposition="fallback", attempts=tuple(history))


async def _attempt(
    producer: Producer[T],
    checks: list[tuple[str, Check[T]]],
    scores: list[tuple[str, Score[T]]],
    number: int,
    previous: tuple[Attempt[T], ...],
    telemetry: GateTelemetry,
    on_failed_attempt: FailedAttemptHook[T] | None = None,
) -> Attempt[T]:
    """Run one attempt under its own span and return its record."""
    with telemetry.attempt_span(number) as span:
        started = _perf()
        verdicts: list[Verdict] = []

        def rejected(
            value: T | None,
            stage: str,
            reason: str,
            since: float,
            details: Mapping[str, Any] | None = None,
            *,
            failed: bool = False,
        ) -> Attempt[T]:
            now = _perf()
            verdicts.append(Verdict(stage, False, reason, now - since, details))
            span.evaluation(stage, passed=False, reason=reason, value=value)
            span.capture_value(value)
            return Attempt.model_construct(
                number=number,
                value=value,
                rejected_by=None if failed else stage,
                failed_by=stage if failed else None,
                reason=reason,
                scores={},
                verdicts=tuple(verdicts),
                duration=now - started,
                trace_id=span.trace_id,
                span_id=span.span_id,
            )

        try:
            value: T = await _call(producer, previous)
        except Rejected as exc:
            return rejected(None, exc.check or "producer", exc.reason, started, exc.details)
        except ValidationError as exc:
            return rejected(None, "schema", validation_reason(exc), started)
        except Exception as exc:
            if on_failed_attempt is not None:
                failed = rejected(
                    None, "producer", _failure_reason(exc), started, _details_of(exc), failed=True
                )
                await _call(on_failed_attempt, failed)
            raise

        for check_name, check in checks:
            since = _perf()
            try:
                said = await _call(check, value)
            except Rejected as exc:
                return rejected(value, exc.check or check_name, exc.reason, since, exc.details)
            except ValidationError as exc:
                return rejected(value, check_name, validation_reason(exc), since)
            except Exception as exc:
                if on_failed_attempt is not None:
                    failed = rejected(
                        value,
                        check_name,
                        _failure_reason(exc),
                        since,
                        _details_of(exc),
                        failed=True,
                    )
                    await _call(on_failed_attempt, failed)
                raise
            details = said if isinstance(said, Mapping) else None
            verdicts.append(Verdict(check_name, True, None, _perf() - since, details))
            span.evaluation(check_name, passed=True, reason=None, value=value)

        recorded: dict[str, float] = {}
        for score_name, score in scores:
            recorded[score_name] = float(await _call(score, value))
            span.score(score_name, recorded[score_name], value)

        return Attempt.model_construct(
            number=number,
            value=value,
            rejected_by=None,
            failed_by=None,
            reason=None,
            scores=recorded,
            verdicts=tuple(verdicts),
            duration=_perf() - started,
            trace_id=span.trace_id,
            span_id=span.span_id,
        )
