"""Failpoints: kill (or stop) the campaign process at a named point, to prove it resumes.

Set ``UNATTENDED_FAILPOINTS`` to ``name:N[:action][,name:N[:action]...]`` and the
process acts on itself the Nth time it reaches ``failpoint(name)``. The action
``kill`` (the default) sends SIGKILL (no cleanup, no ``finally``, no flush: what a
node failure or the batch system's kill does). The action ``stop`` sends SIGSTOP:
the process halts right there, holding whatever it holds, until someone sends it
SIGCONT, and then goes on from the point as if nothing happened. A test uses it to
hold a process in a window deterministically (``after_lease_released:1:stop``)
instead of racing to suspend it from outside.
The variable (``flows._settings.Settings.failpoints``) is read once per process,
at the first ``failpoint`` call or when the campaign runner calls :func:`arm`;
without it every ``failpoint`` call is one dictionary truth test.

With ``UNATTENDED_FAILPOINT_SCOPE=runner`` the kill takes the whole runner tree
first: the process named by ``UNATTENDED_RUNNER_PID`` (set by ``unattended serve``
for the flow runs it starts) and all its descendants, as a login node that loses
its session would. A ``stop`` stops only the process that reached the point.

The points the campaign passes, in the order a round reaches them:

``campaign_start`` (the lease is held, no round has started), ``after_fallback_recorded``,
``after_answer`` (a model answer journaled, its checks
not yet run), ``mid_verifier`` (the verifier's tasks ran on the allocation, its verdict
is not judged or recorded), ``after_attempt_recorded`` (between attempts),
``after_gate``, ``after_decision_recorded``, ``before_suspend``,
``after_approval_recorded``, ``after_batch_launch_recorded``, ``mid_batch``
(after each task result), ``after_batch``, ``checkpoint_commit`` (inside the
checkpoint's transaction, just before it commits) and ``after_checkpoint``.
A Prefect flow run passes one more as it ends: ``after_lease_released`` (the run
recorded its ending and gave the campaign's lease back; Prefect is not told yet).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator, Mapping
from typing import Any, Literal, NamedTuple, TypeVar, cast, get_args

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
    "after_lease_released",
)

Action = Literal["kill", "stop"]
ACTIONS: tuple[str, ...] = get_args(Action)


class Armed(NamedTuple):
    """One armed failpoint: act at its ``occurrence``th pass."""

    occurrence: int
    action: Action = "kill"


def parse_failpoints(text: str) -> dict[str, Armed]:
    """Return ``{point: Armed}`` from ``name:N[:action],...``; raise ``ValueError`` naming it.

    An unknown point is refused too: a misspelt name would otherwise never fire
    and a crash test would pass without crashing anything. So is an unknown action.
    """
    armed: dict[str, Armed] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, _, rest = entry.partition(":")
        count, _, action = rest.partition(":")
        name, action = name.strip(), action.strip() or "kill"
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
        if action not in ACTIONS:
            raise ValueError(
                f"{ENV_VARIABLE}: action of {name!r} must be one of {', '.join(ACTIONS)}, "
                f"got {action!r}"
            )
        armed[name] = Armed(occurrence, cast(Action, action))
    return armed


_ARMED: dict[str, Armed] | None = None  # None: not read yet
_HITS: dict[str, int] = {}


def arm(env: Mapping[str, str] | Settings) -> dict[str, Armed]:
    """Read the failpoints from ``env`` (or settings), reset the hit counts; return them."""
    global _ARMED
    settings = env if isinstance(env, Settings) else Settings.from_env(env)
    _ARMED = parse_failpoints(settings.failpoints)
    _HITS.clear()
    return dict(_ARMED)


def _points() -> dict[str, Armed]:
    # A process nobody armed explicitly (a flow-run process, a test's child) reads its
    # own environment once: that is where a crash test puts the variable.
    return arm(os.environ) if _ARMED is None else _ARMED


def armed(name: str) -> bool:
    """Return True when ``name`` may fire in this process."""
    return name in _points()


def failpoint(name: str) -> None:
    """Count a pass through ``name``; at the armed occurrence, SIGKILL (or SIGSTOP) this process."""
    points = _points()
    if not points or name not in points:
        return
    hits = _HITS.get(name, 0) + 1
    _HITS[name] = hits
    occurrence, action = points[name]
    if hits != occurrence:
        return
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)  # returns once someone sends SIGCONT
        return
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
