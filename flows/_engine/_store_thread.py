"""The engine's store off its event loop: every call in one worker thread, in order.

A provenance write can wait a long time: SQLite's busy timeout (30 s) and the
store's retries on lock contention or a full disk. Called inside a coroutine, that
wait would stop the whole event loop: no task launched, no result taken, no
heartbeat of the backend answered. :class:`StoreThread` is the one adapter between
the engine (which awaits :class:`~flows._engine._store.AsyncCampaignStore`) and the
synchronous store (:class:`~flows._engine._store.CampaignStore`, in practice
``flows._provenance.ProvenanceStore``, whose synchronous API the readers and the CLI
keep using).

Why one dedicated thread per store, not ``asyncio.to_thread``'s shared pool: the
calls must run in the order they are issued. A round's checkpoint must come after
the results it covers, and a call queued without waiting (:meth:`StoreThread.later`,
the allocation watch's records) must land before the run's ending. One worker gives
that order for free, and keeps the store's own bookkeeping (the rounds it has seen
committed, the campaign ids) in one thread. SQLAlchemy's SQLite engine pools file
connections (``QueuePool``, ``check_same_thread`` off); each call checks a
connection out and back in within the worker, as the lease heartbeat and the
artifact publisher already do from their own threads.

What a call raises in the worker (``CampaignFenced``, ``DecisionMismatch``,
``StorageUnavailable``, ...) is raised by the ``await``, the same exception object.
A failpoint that fires inside a call SIGKILLs the process from the worker as it
would from the loop. An ``await`` cancelled before its call started drops the
call (as a synchronous call never made); one cancelled while its call runs lets
it finish, and :meth:`StoreThread.aclose` waits for it, so nothing is written
after the run gives its lease back.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, ParamSpec, TypeVar, cast

from flows._engine._store import CampaignStore

log = logging.getLogger("unattended.campaign")
P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S", bound=CampaignStore)


class StoreThread(Generic[S]):
    """Run each call of ``store`` in one worker thread, in the order issued (see the module).

    ``await adapter.record_gate_call(...)`` is ``store.record_gate_call(...)`` run in
    the worker; any other attribute of ``store`` that is not callable (its ``engine``,
    for a failpoint inside a commit) is read as it is. Use it as an ``async with``
    block, or call :meth:`aclose` once the run is over.
    """

    def __init__(self, store: S, *, name: str = "provenance") -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._worker: threading.Thread | None = None
        self._closed = False

    def _submit(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        # The caller's context (its OpenTelemetry span) goes with the call, as to_thread does.
        context = contextvars.copy_context()
        return self._pool.submit(self._in_worker, context, functools.partial(fn, *args, **kwargs))

    def _in_worker(self, context: contextvars.Context, call: Callable[[], T]) -> T:
        self._worker = threading.current_thread()
        return context.run(call)

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` in the worker after every call issued before; await it."""
        return await asyncio.wrap_future(self._submit(fn, *args, **kwargs))

    def later(self, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> None:
        """Queue ``fn(*args, **kwargs)`` after every call issued before; do not wait for it.

        For a synchronous callback that must not block (the allocation watch's
        records): a failure is logged, never raised (nobody waits to receive it).
        """
        what = getattr(fn, "__name__", repr(fn))

        def done(future: Future[Any]) -> None:
            error = None if future.cancelled() else future.exception()
            if error is not None:
                log.warning("store call %s failed: %s", what, type(error).__name__, exc_info=error)

        self._submit(fn, *args, **kwargs).add_done_callback(done)

    def wait(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` in the worker after every call issued before; block until it returns.

        Only for a caller that cannot await (see :attr:`blocking`); from the worker
        itself the call runs at once (waiting for itself would never end).
        """
        if threading.current_thread() is self._worker:
            return fn(*args, **kwargs)
        return self._submit(fn, *args, **kwargs).result()

    @property
    def blocking(self) -> CampaignStore:
        """The store for a caller that cannot await: each call runs in turn in the worker."""
        return cast(CampaignStore, _Blocking(self))

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        target = getattr(self.store, method)
        if not callable(target):
            return target

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self.run(target, *args, **kwargs)

        call.__name__ = method
        return call

    async def aclose(self) -> None:
        """Wait for every call issued so far (those queued by :meth:`later` too); end the worker."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.run(lambda: None)  # the queue is first in, first out
        finally:
            self._pool.shutdown(wait=False)

    async def __aenter__(self) -> StoreThread[S]:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()


class _Blocking:
    """A store's calls run in turn in a :class:`StoreThread`'s worker; each waits for its result."""

    def __init__(self, thread: StoreThread[Any]) -> None:
        self._thread = thread

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        target = getattr(self._thread.store, method)
        if not callable(target):
            return target
        return functools.partial(self._thread.wait, target)
