"""Start and stop the one asyncflow ``WorkflowEngine`` of this process.

What this module designs around (measured with radical.asyncflow 0.6.0):

* The engine numbers tasks with a process-wide counter and resets it when any
  engine shuts down, which can hand one engine's result to another's future:
  only ONE live engine per process (a second start raises).
* The engine installs SIGINT/SIGTERM/SIGHUP handlers that shut it down and
  swallow the signal, and leaves them installed after ``shutdown()``: Slurm's
  and Prefect's cancellation would stop working. The handlers that were there
  before are put back right after the engine starts and again after it stops.
* The Dask backend uses the task uid as the Dask key; callers pass a unique
  ``key`` per attempt in ``task_description`` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from policies import SiteInvalid
from tasks._site import SiteConfig
from tasks._site_backends import DaskBackend, LocalBackend, RadicalPilotBackend

_ENGINE_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_live_owner: object | None = None


@dataclass
class SavedSignals:
    """The handlers (Python-level and event-loop level) in place before the engine."""

    python: dict[int, Any] = field(default_factory=dict)
    loop: dict[int, tuple[Callable[..., Any], tuple[Any, ...]]] = field(default_factory=dict)

    @classmethod
    def capture(cls, loop: asyncio.AbstractEventLoop) -> SavedSignals:
        """Record the current handlers of SIGINT, SIGTERM and SIGHUP."""
        saved = cls()
        # asyncio keeps loop handlers in a private dict; without reading it a
        # handler the caller added with add_signal_handler would be lost.
        loop_handlers: dict[int, Any] = getattr(loop, "_signal_handlers", {}) or {}
        for sig in _ENGINE_SIGNALS:
            saved.python[sig] = signal.getsignal(sig)
            handle = loop_handlers.get(sig)
            if handle is not None:
                saved.loop[sig] = (handle._callback, tuple(handle._args))
        return saved

    def restore(self, loop: asyncio.AbstractEventLoop) -> None:
        """Remove the engine's handlers and put the recorded ones back."""
        if threading.current_thread() is not threading.main_thread():
            return  # the engine installs handlers only from the main thread
        for sig in _ENGINE_SIGNALS:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
            if sig in self.loop:
                callback, args = self.loop[sig]
                loop.add_signal_handler(sig, callback, *args)
            elif self.python.get(sig) is not None:
                signal.signal(sig, self.python[sig])


def claim_process(owner: object) -> None:
    """Mark ``owner`` as this process's engine owner; raise if another is live."""
    global _live_owner
    if _live_owner is not None and _live_owner is not owner:
        raise RuntimeError(
            "another AllocationExecutor is live in this process: asyncflow shares one "
            "task counter per process, so only one engine may run at a time"
        )
    _live_owner = owner


def release_process(owner: object) -> None:
    """Forget ``owner`` as the live engine owner."""
    global _live_owner
    if _live_owner is owner:
        _live_owner = None


def pool_workers(backend: LocalBackend) -> int:
    """Return the worker count of a local site's pool (the executors' own defaults)."""
    if backend.max_workers is not None:
        return backend.max_workers
    cpus = os.cpu_count() or 1
    return min(32, cpus + 4) if backend.executor == "thread" else cpus


def local_pool(backend: LocalBackend) -> Executor:
    """Build the process or thread pool of a local site."""
    workers = pool_workers(backend)
    if backend.executor == "thread":
        return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="unattended")
    context = multiprocessing.get_context(backend.start_method) if backend.start_method else None
    return ProcessPoolExecutor(max_workers=workers, mp_context=context)


@dataclass
class EngineParts:
    """The engine, its backend and whatever the executor must close after it."""

    engine: Any
    backend: Any
    pool: Executor | None = None
    closers: list[Callable[[], Any]] = field(default_factory=list)


async def start_engine(site: SiteConfig, *, work_dir: str | None = None) -> EngineParts:
    """Create the site's execution backend and one ``WorkflowEngine`` over it."""
    from radical.asyncflow import LocalExecutionBackend, WorkflowEngine

    spec = site.backend
    parts: EngineParts
    if isinstance(spec, LocalBackend):
        pool = local_pool(spec)
        backend = await LocalExecutionBackend(pool)
        parts = EngineParts(engine=None, backend=backend, pool=pool)
    elif isinstance(spec, DaskBackend):
        parts = await _dask_backend(site, spec)
    elif isinstance(spec, RadicalPilotBackend):
        parts = await _radical_pilot_backend(site, spec)
    else:  # pragma: no cover - the discriminated union admits nothing else
        raise SiteInvalid("unknown backend kind", details={"field": "backend.kind"})
    try:
        parts.engine = await WorkflowEngine.create(
            backend=parts.backend, implicit_data=False, work_dir=work_dir
        )
    except BaseException:
        await close_parts(parts, engine_started=False)
        raise
    return parts


async def close_parts(parts: EngineParts, *, engine_started: bool = True) -> None:
    """Shut the engine and its backend down, then close clusters and clients."""
    if engine_started and parts.engine is not None:
        await parts.engine.shutdown()
    elif parts.backend is not None:
        await parts.backend.shutdown()
    for close in reversed(parts.closers):
        result = close()
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            await result


async def _dask_backend(site: SiteConfig, spec: DaskBackend) -> EngineParts:
    try:
        import distributed
        from rhapsody.backends.execution.dask_parallel import DaskExecutionBackend
    except ImportError:
        raise _missing_extra(site, "backend.kind", "rhapsody-py[dask]") from None

    closers: list[Callable[[], Any]] = []
    cluster: Any
    if spec.cluster == "local":
        cluster = await distributed.LocalCluster(  # type: ignore[no-untyped-call]  # untyped upstream
            n_workers=spec.n_workers,
            threads_per_worker=spec.threads_per_worker,
            host=site.listen,
            # None would still bind the scheduler's HTTP server to port 8787 (and
            # warn when it is taken); port 0 on the listen host picks a free one.
            dashboard_address=f"[{site.listen}]:0" if ":" in site.listen else f"{site.listen}:0",
            asynchronous=True,
        )
        closers.append(cluster.close)
        address = cluster.scheduler_address
    elif spec.jobqueue is not None:
        cluster = await _jobqueue_cluster(site, spec)
        closers.append(cluster.close)
        address = cluster.scheduler_address
    else:
        assert spec.scheduler_address is not None  # the model requires one source
        if spec.scheduler_address.startswith("<"):
            raise SiteInvalid(
                f"{site.source or site.name}: field backend.scheduler_address still holds "
                "a placeholder",
                details={"file": site.source, "field": "backend.scheduler_address"},
            )
        address = spec.scheduler_address
    try:
        client = await distributed.Client(address, asynchronous=True)  # type: ignore[no-untyped-call]  # untyped upstream
    except BaseException:
        for close in reversed(closers):
            await close()
        raise
    # The backend never closes a client it was given: close it after the engine.
    closers.append(client.close)
    backend = await DaskExecutionBackend(client=client)
    return EngineParts(engine=None, backend=backend, closers=closers)


async def _jobqueue_cluster(site: SiteConfig, spec: DaskBackend) -> Any:
    assert spec.jobqueue is not None
    try:
        import dask_jobqueue
    except ImportError:
        raise _missing_extra(site, "backend.jobqueue", "dask-jobqueue") from None
    jobqueue = spec.jobqueue
    cluster_class = {
        "slurm": "SLURMCluster",
        "pbs": "PBSCluster",
        "sge": "SGECluster",
        "lsf": "LSFCluster",
    }[jobqueue.system]
    options: dict[str, Any] = {
        "cores": jobqueue.cores,
        "memory": jobqueue.memory,
        "processes": jobqueue.processes,
        "job_extra_directives": list(jobqueue.job_extra_directives),
        "asynchronous": True,
    }
    if jobqueue.interface:
        options["interface"] = jobqueue.interface
    if site.scheduler.account:
        options["account"] = site.scheduler.account
    if site.scheduler.queue:
        options["queue"] = site.scheduler.queue
    if site.scheduler.walltime:
        options["walltime"] = site.scheduler.walltime
    cluster = await getattr(dask_jobqueue, cluster_class)(**options)
    cluster.scale(jobs=jobqueue.jobs)
    return cluster


async def _radical_pilot_backend(site: SiteConfig, spec: RadicalPilotBackend) -> EngineParts:
    try:
        import radical.pilot  # noqa: F401  # only to test that the extra is installed
        from rhapsody.backends.execution.radical_pilot import RadicalExecutionBackend
    except ImportError:
        raise _missing_extra(site, "backend.kind", "unattended[radical-pilot]") from None
    resources: dict[str, Any] = {
        "resource": spec.resource,
        "cores": spec.cores,
        "gpus": spec.gpus,
        "runtime": spec.runtime_minutes,
    }
    if spec.queue:
        resources["queue"] = spec.queue
    if spec.project:
        resources["project"] = spec.project
    backend = await RadicalExecutionBackend(resources)
    return EngineParts(engine=None, backend=backend)


def _missing_extra(site: SiteConfig, field_name: str, extra: str) -> SiteInvalid:
    where = site.source or site.name
    return SiteInvalid(
        f"{where}: field {field_name}: this backend needs {extra}; install it with "
        f"pip install '{extra}'",
        details={"file": site.source, "field": field_name, "expected": f"{extra} installed"},
    )
