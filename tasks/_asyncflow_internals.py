"""Every place ``tasks`` touches radical.asyncflow's (and asyncio's) private parts.

asyncflow has no public way to do four things the executor needs, so this
module does them against the internals of the versions in :data:`SUPPORTED`
and nothing else does:

* prune a finished task's bookkeeping (``engine.components``, ``dependencies``,
  ``resolved``): the engine keeps every task forever otherwise;
* hand a fresh pool to a ``LocalExecutionBackend`` (``backend.executor``) after
  a pool process died;
* read the event loop's signal handlers (``loop._signal_handlers``) so those
  the engine replaces can be put back.

:func:`check_versions` runs before an engine starts: an installed
radical.asyncflow or rhapsody-py outside the supported range stops the
executor with an error naming the range, instead of failing somewhere inside
asyncflow later.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any, Final

from policies import InternalError

# distribution -> (lowest supported version, first unsupported version)
SUPPORTED: Final[dict[str, tuple[tuple[int, ...], tuple[int, ...]]]] = {
    "radical.asyncflow": ((0, 6), (0, 7)),
    "rhapsody-py": ((0, 6), (0, 7)),
}


def _release(version: str) -> tuple[int, ...]:
    """Return the numeric release of a version string (``0.6.0rc1`` -> ``(0, 6, 0)``)."""
    numbers = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(n) for n in numbers.group(0).split(".")) if numbers else ()


def _range(distribution: str) -> str:
    low, high = SUPPORTED[distribution]
    return f"{distribution}>={'.'.join(map(str, low))},<{'.'.join(map(str, high))}"


def check_version(distribution: str, installed: str) -> None:
    """Raise ``InternalError`` naming the supported range unless ``installed`` is in it."""
    low, high = SUPPORTED[distribution]
    if not low <= _release(installed) < high:
        raise InternalError(
            f"{distribution} {installed} is installed, but unattended touches its internals "
            f"as they are in {_range(distribution)}; install a version in that range",
            details={
                "distribution": distribution,
                "installed": installed,
                "supported": _range(distribution),
            },
        )


@functools.cache
def check_versions() -> None:
    """Check every distribution in :data:`SUPPORTED` once per process (before an engine starts)."""
    for distribution in SUPPORTED:
        try:
            installed = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            raise InternalError(
                f"{distribution} is not installed; unattended needs {_range(distribution)}",
                details={"distribution": distribution, "supported": _range(distribution)},
            ) from None
        check_version(distribution, installed)


def forget_finished(engine: Any, uids: Iterable[str]) -> list[str]:
    """Drop finished tasks' bookkeeping from ``engine``; return the uids not finished yet.

    Only a task the run loop has moved out of ``running`` into ``resolved`` is
    unreferenced; the others are returned to try again later.
    """
    keep = []
    for uid in uids:
        if uid in engine.running or uid not in engine.resolved:
            keep.append(uid)
            continue
        engine.components.pop(uid, None)
        engine.dependencies.pop(uid, None)
        engine.resolved.discard(uid)
    return keep


def task_uid(future: Any) -> str | None:
    """Return the uid asyncflow gave the task behind ``future``, if it has one."""
    description = getattr(future, "task", None)
    if isinstance(description, dict) and isinstance(description.get("uid"), str):
        return str(description["uid"])
    return None


def replace_pool(backend: Any, pool: Any) -> None:
    """Make a ``LocalExecutionBackend`` submit to ``pool`` from now on."""
    backend.executor = pool


def loop_signal_handlers(
    loop: asyncio.AbstractEventLoop, signals: Iterable[int]
) -> dict[int, tuple[Callable[..., Any], tuple[Any, ...]]]:
    """Return ``{signal: (callback, args)}`` of the handlers ``loop`` has for ``signals``.

    asyncio keeps them in a private dict; without reading it a handler the
    caller added with ``add_signal_handler`` would be lost when the engine's
    handlers are removed.
    """
    handlers: dict[int, Any] = getattr(loop, "_signal_handlers", {}) or {}
    found = {}
    for sig in signals:
        handle = handlers.get(sig)
        if handle is not None:
            found[sig] = (handle._callback, tuple(handle._args))
    return found
