"""Failpoints: kill the campaign process at a named point, to prove it resumes.

Set ``UNATTENDED_FAILPOINTS`` to ``name:N[,name:N...]`` and the process sends
itself SIGKILL at the Nth time it reaches ``failpoint(name)`` (no cleanup, no
``finally``, no flush: what a node failure or the batch system's kill does).
The variable is read once per process, when this module is imported; without
it every ``failpoint`` call is one dictionary truth test.

The points the campaign passes, in the order a round reaches them:

``after_fallback_recorded``, ``after_answer`` (a model answer journaled, its checks
not yet run), ``after_attempt_recorded`` (between attempts),
``after_gate``, ``after_decision_recorded``, ``before_suspend``,
``after_approval_recorded``, ``after_batch_launch_recorded``, ``mid_batch``
(after each task result), ``after_batch``, ``checkpoint_commit`` (inside the
checkpoint's transaction, just before it commits) and ``after_checkpoint``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator, Mapping
from typing import Any

ENV_VARIABLE = "UNATTENDED_FAILPOINTS"

POINTS = (
    "after_fallback_recorded",
    "after_answer",
    "after_attempt_recorded",
    "after_gate",
    "after_decision_recorded",
    "before_suspend",
    "after_approval_recorded",
    "after_batch_launch_recorded",
    "mid_batch",
    "after_batch",
    "checkpoint_commit",
    "after_checkpoint",
)


def parse_failpoints(text: str) -> dict[str, int]:
    """Return ``{point: occurrence}`` from ``name:N,...``; raise ``ValueError`` naming the entry.

    An unknown point is refused too: a misspelt name would otherwise never fire
    and a crash test would pass without crashing anything.
    """
    armed: dict[str, int] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, _, count = entry.partition(":")
        name = name.strip()
        if name not in POINTS:
            raise ValueError(f"{ENV_VARIABLE}: unknown failpoint {name!r} in {entry!r}")
        try:
            occurrence = int(count) if count.strip() else 1
        except ValueError:
            raise ValueError(
                f"{ENV_VARIABLE}: occurrence of {name!r} must be an integer, got {count!r}"
            ) from None
        if occurrence < 1:
            raise ValueError(f"{ENV_VARIABLE}: occurrence of {name!r} must be >= 1")
        armed[name] = occurrence
    return armed


_ARMED: dict[str, int] = parse_failpoints(os.environ.get(ENV_VARIABLE, ""))
_HITS: dict[str, int] = {}


def arm(env: Mapping[str, str]) -> dict[str, int]:
    """Re-read the failpoints from ``env`` and reset the hit counts; return what is armed.

    For tests of this module; a campaign process reads its environment once at import.
    """
    global _ARMED
    _ARMED = parse_failpoints(env.get(ENV_VARIABLE, ""))
    _HITS.clear()
    return dict(_ARMED)


def armed(name: str) -> bool:
    """Return True when ``name`` may fire in this process."""
    return name in _ARMED


def failpoint(name: str) -> None:
    """Count a pass through ``name``; at the armed occurrence, SIGKILL this process."""
    if not _ARMED or name not in _ARMED:
        return
    hits = _HITS.get(name, 0) + 1
    _HITS[name] = hits
    if hits == _ARMED[name]:
        os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def failpoint_in_commit(store: Any, name: str) -> Iterator[None]:
    """Fire ``name`` inside the next transactions' commit on ``store.engine``, before COMMIT.

    Wrap one store call that writes in one transaction: a kill here lands after
    every statement of it ran and before any is durable, which is what proves
    the write atomic (a failpoint just before the call would prove nothing more
    than one just after the previous write).
    """
    engine = getattr(store, "engine", None)
    if not armed(name) or engine is None:
        yield
        return
    from sqlalchemy import event

    def on_commit(connection: Any) -> None:
        failpoint(name)

    event.listen(engine, "commit", on_commit)
    try:
        yield
    finally:
        event.remove(engine, "commit", on_commit)


class AfterCall:
    """Forward every attribute to ``target``; pass ``failpoint(name)`` after ``method`` returns."""

    def __init__(self, target: Any, method: str, name: str) -> None:
        self._target = target
        self._method = method
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        value = getattr(self._target, attribute)
        if attribute != self._method:
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            result = value(*args, **kwargs)
            failpoint(self._name)
            return result

        return call


def after_call(target: Any, method: str, name: str) -> Any:
    """Return ``target``, wrapped so ``name`` fires after each ``method`` call when armed."""
    return AfterCall(target, method, name) if armed(name) else target
