"""Learn that a child exited from a pidfd on the event loop, not from a thread per child.

On Python 3.11 asyncio watches every subprocess with ``ThreadedChildWatcher``: one new
thread per child, blocked in ``waitpid``. Starting a thread waits until the new thread
holds the GIL, and in a flow-run process Prefect keeps half a dozen threads of its own
(heartbeats, lease renewal, events, logs) busy. py-spy on a campaign's flow-run
process (64 ``awk`` simulations a round) found 15 % of the event loop's time in
``ThreadedChildWatcher.add_child_handler``, waiting for those threads to start: about
35 ms a round, which the engine alone (fewer threads) did not pay.

``RunningLoopPidfdWatcher`` does what Python 3.12's default watcher does: it opens a
pidfd for the child and lets the event loop that spawned it (the running loop, in
whichever thread) read it; no thread, no signal handler. ``install()`` puts it in
place for the process on Python 3.11 when the kernel has ``pidfd_open`` (Linux 5.3)
and the default event loop policy is in use; elsewhere (3.12 and newer already do
this, another OS, another policy) it changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

_log = logging.getLogger(__name__)
_installed = False
_install_lock = threading.Lock()

Callback = Callable[..., object]


class RunningLoopPidfdWatcher(asyncio.AbstractChildWatcher):
    """Watch each child through a pidfd read by the loop that spawned it.

    ``add_child_handler`` is called by the subprocess transport on its own loop, so the
    reader goes on that loop and the callback runs there; several loops in several
    threads can each spawn children. The loop must run until its children exit (as
    with any asyncio subprocess).
    """

    def __init__(self) -> None:
        # pid -> (loop, pidfd, callback, args); a dict's single operations are atomic.
        self._children: dict[int, tuple[asyncio.AbstractEventLoop, int, Callback, Any]] = {}

    def __enter__(self) -> RunningLoopPidfdWatcher:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def is_active(self) -> bool:
        return True

    def close(self) -> None:
        return None

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        return None  # every child is watched on the loop that spawned it

    def add_child_handler(  # type: ignore[override]  # typeshed types *args with a TypeVarTuple
        self, pid: int, callback: Callback, *args: Any
    ) -> None:
        loop = asyncio.get_running_loop()
        known = self._children.get(pid)
        if known is not None:  # asyncio's contract: a second handler replaces the first
            self._children[pid] = (known[0], known[1], callback, args)
            return
        pidfd = os.pidfd_open(pid)
        self._children[pid] = (loop, pidfd, callback, args)
        loop.add_reader(pidfd, self._reap, pid)

    def remove_child_handler(self, pid: int) -> bool:
        child = self._children.pop(pid, None)
        if child is None:
            return False
        loop, pidfd, _, _ = child
        loop.remove_reader(pidfd)
        os.close(pidfd)
        return True

    def _reap(self, pid: int) -> None:
        child = self._children.pop(pid, None)
        if child is None:
            return
        loop, pidfd, callback, args = child
        loop.remove_reader(pidfd)
        os.close(pidfd)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            # Reaped elsewhere (a waitpid(-1) somewhere in the process): the status is lost.
            _log.warning("child %d was reaped elsewhere; reporting exit code 255", pid)
            code = 255
        else:
            code = os.waitstatus_to_exitcode(status)
        callback(pid, code, *args)


def install() -> bool:
    """Watch children with pidfds in this process (Python 3.11 on Linux); True if in place.

    Idempotent and cheap after the first call. Changes nothing on Python 3.12 and newer,
    without ``os.pidfd_open`` (or a kernel that refuses it), or under another event loop
    policy (uvloop watches its children itself).
    """
    global _installed
    if _installed:
        return True
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    with _install_lock:
        if _installed:
            return True
        policy = asyncio.get_event_loop_policy()
        if type(policy) is not asyncio.DefaultEventLoopPolicy:
            return False
        try:
            os.close(os.pidfd_open(os.getpid()))
        except OSError:  # an old kernel, or a seccomp filter refusing the call
            return False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_child_watcher(RunningLoopPidfdWatcher())
        _installed = True
    return True
