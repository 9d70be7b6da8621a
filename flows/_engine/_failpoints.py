"""Failpoints: kill the campaign process at a named point, to prove it resumes.

Set ``UNATTENDED_FAILPOINTS`` to ``name:N[,name:N...]`` and the process sends
itself SIGKILL at the Nth time it reaches ``failpoint(name)`` (no cleanup, no
``finally``, no flush: what a node failure or the batch system's kill does).
The variable (``flows._settings.Settings.failpoints``) is read once per process,
at the first ``failpoint`` call or when the campaign runner calls :func:`arm`;
without it every ``failpoint`` call is one dictionary truth test.

With ``UNATTENDED_FAILPOINT_SCOPE=runner`` the kill takes the whole runner tree
first: the process named by ``UNATTENDED_RUNNER_PID`` (set by ``unattended serve``
for the flow runs it starts) and all its descendants, as a login node that loses
its session would.

The points the campaign passes, in the order a round reaches them:

``campaign_start`` (the lease is held, no round has started), ``after_fallback_recorded``,
``after_answer`` (a model answer journaled, its checks
not yet run), ``mid_verifier`` (the verifier's tasks ran on the allocation, its verdict
is not judged or recorded), ``after_attempt_recorded`` (between attempts),
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
from typing import Any, TypeVar, cast

from flows._settings import Settings

T = TypeVar("T")

ENV_VARIABLE = "UNATTENDED_FAILPOINTS"
SCOPE_VARIABLE = "UNATTENDED_FAILPOINT_SCOPE"
RUNNER_PID_VARIABLE = "UNATTENDED_RUNNER_PID"

POINTS = (
    "campaign_start",
    "after_fallback_recorded",
    "after_answer",
    "mid_verifier",
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


_ARMED: dict[str, int] | None = None  # None: not read yet
_HITS: dict[str, int] = {}


def arm(env: Mapping[str, str] | Settings) -> dict[str, int]:
    """Read the failpoints from ``env`` (or settings), reset the hit counts; return them."""
    global _ARMED
    settings = env if isinstance(env, Settings) else Settings.from_env(env)
    _ARMED = parse_failpoints(settings.failpoints)
    _HITS.clear()
    return dict(_ARMED)


def _points() -> dict[str, int]:
    # A process nobody armed explicitly (a flow-run process, a test's child) reads its
    # own environment once: that is where a crash test puts the variable.
    return arm(os.environ) if _ARMED is None else _ARMED


def armed(name: str) -> bool:
    """Return True when ``name`` may fire in this process."""
    return name in _points()


def failpoint(name: str) -> None:
    """Count a pass through ``name``; at the armed occurrence, SIGKILL this process."""
    points = _points()
    if not points or name not in points:
        return
    hits = _HITS.get(name, 0) + 1
    _HITS[name] = hits
    if hits == points[name]:
        if os.environ.get(SCOPE_VARIABLE) == "runner":
            _kill_runner_tree()
        os.kill(os.getpid(), signal.SIGKILL)


def _kill_runner_tree() -> None:
    """SIGKILL the runner named by ``UNATTENDED_RUNNER_PID`` and every descendant but us."""
    import psutil

    try:
        root = psutil.Process(int(os.environ[RUNNER_PID_VARIABLE]))
        victims = [root, *root.children(recursive=True)]
    except (KeyError, ValueError, psutil.Error):
        return
    for victim in victims:  # the runner first, so it cannot react to its children dying
        if victim.pid != os.getpid():
            with contextlib.suppress(psutil.Error):
                victim.kill()


@contextlib.contextmanager
def failpoint_in_commit(store: object, name: str) -> Iterator[None]:
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

    def on_commit(connection: object) -> None:
        failpoint(name)

    event.listen(engine, "commit", on_commit)
    try:
        yield
    finally:
        event.remove(engine, "commit", on_commit)


class AfterCall:
    """Forward every attribute to ``target``; pass ``failpoint(name)`` after ``method`` returns."""

    def __init__(self, target: object, method: str, name: str) -> None:
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


def after_call(target: T, method: str, name: str) -> T:
    """Return ``target``, wrapped so ``name`` fires after each ``method`` call when armed."""
    # The wrapper forwards every attribute, so it stands in for ``target``'s type.
    return cast(T, AfterCall(target, method, name)) if armed(name) else target
