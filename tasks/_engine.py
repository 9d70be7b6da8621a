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
import importlib.util
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from policies import SiteInvalid
from tasks._allocations import AllocationWatch, BudgetUsed
from tasks._asyncflow_internals import check_versions, loop_signal_handlers
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
        saved = cls(loop=loop_signal_handlers(loop, _ENGINE_SIGNALS))
        for sig in _ENGINE_SIGNALS:
            saved.python[sig] = signal.getsignal(sig)
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
    #: The batch jobs carrying the workers, when the site starts them itself.
    allocations: AllocationWatch | None = None
    #: Run before the engine and backend shut down (a pilot's session cancels it).
    before_close: list[Callable[[], Any]] = field(default_factory=list)


async def start_engine(
    site: SiteConfig, *, work_dir: str | None = None, used: BudgetUsed | None = None
) -> EngineParts:
    """Create the site's execution backend and one ``WorkflowEngine`` over it.

    ``used`` is what earlier runs of the campaign used of the site's allocation
    budget (``scheduler.max_allocations``, ``scheduler.max_node_hours``).
    """
    check_versions()  # before anything of asyncflow runs: its internals are touched
    from radical.asyncflow import LocalExecutionBackend, WorkflowEngine

    spec = site.backend
    parts: EngineParts
    if isinstance(spec, LocalBackend):
        pool = local_pool(spec)
        backend = await LocalExecutionBackend(pool)
        parts = EngineParts(engine=None, backend=backend, pool=pool)
    elif isinstance(spec, DaskBackend):
        parts = await _dask_backend(site, spec, work_dir=work_dir, used=used)
    elif isinstance(spec, RadicalPilotBackend):
        parts = await _radical_pilot_backend(site, spec, work_dir=work_dir, used=used)
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
    for first in parts.before_close:
        result = first()
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            await result
    if engine_started and parts.engine is not None:
        await parts.engine.shutdown()
    elif parts.backend is not None:
        await parts.backend.shutdown()
    for close in reversed(parts.closers):
        result = close()
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            await result


async def _dask_backend(
    site: SiteConfig, spec: DaskBackend, *, work_dir: str | None, used: BudgetUsed | None
) -> EngineParts:
    try:
        import distributed
        from rhapsody.backends.execution.dask_parallel import DaskExecutionBackend
    except ImportError:
        raise _missing_extra(site, "backend.kind", "rhapsody-py[dask]") from None

    closers: list[Callable[[], Any]] = []
    watch: AllocationWatch | None = None
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
        cluster, watch = await _jobqueue_cluster(
            site, spec, work_dir=work_dir or os.getcwd(), used=used
        )
        closers.append(cluster.close)
        # Runs before the cluster cancels the jobs still running (closers run in
        # reverse): records how each job ended, and the rest as released.
        closers.append(_release(watch))
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
    return EngineParts(engine=None, backend=backend, closers=closers, allocations=watch)


def _release(watch: AllocationWatch) -> Callable[[], Any]:
    async def release() -> None:
        await watch.stop()
        await watch.refresh()
        watch.mark_released()

    return release


async def _jobqueue_cluster(
    site: SiteConfig, spec: DaskBackend, *, work_dir: str, used: BudgetUsed | None
) -> tuple[Any, AllocationWatch]:
    """Start the jobqueue scheduler, submit the first allocation's jobs, and watch them."""
    assert spec.jobqueue is not None
    if importlib.util.find_spec("dask_jobqueue") is None:
        raise _missing_extra(site, "backend.jobqueue", "dask-jobqueue")
    from tasks._jobqueue import WorkerJobs, log_directory, start_jobqueue_cluster

    placeholders = [f for f in site.placeholders() if f.startswith(("scheduler.", "backend."))]
    if placeholders:
        raise SiteInvalid(
            f"{site.source or site.name}: field {placeholders[0]} still holds a placeholder",
            details={"file": site.source, "field": placeholders[0]},
        )
    cluster = await start_jobqueue_cluster(site, spec, log_directory(site, work_dir))
    jobs = WorkerJobs(cluster, spec.jobqueue.jobs, site=site.source or site.name)
    watch = AllocationWatch(
        jobs.submit,
        env=os.environ,
        poll_seconds=site.scheduler.poll_seconds,
        max_allocations=site.scheduler.max_allocations,
        max_node_hours=site.scheduler.max_node_hours,
        used=used,
        unreachable_seconds=site.scheduler.unreachable_seconds,
    )
    watch.on_job_ended = jobs.retire_jobs
    try:
        await watch.request()
    except BaseException:
        await cluster.close()
        raise
    watch.start()
    return cluster, watch


async def _radical_pilot_backend(
    site: SiteConfig, spec: RadicalPilotBackend, *, work_dir: str | None, used: BudgetUsed | None
) -> EngineParts:
    """Start a pilot; its sessions, PSI/J scripts and resource config live under ``work_dir``."""
    if importlib.util.find_spec("radical.pilot") is None:
        raise _missing_extra(site, "backend.kind", "unattended[radical-pilot]")
    from tasks._radical import (
        SLURM_RESOURCE,
        PilotJobs,
        home_for_children,
        import_radical,
        pilot_resources,
        radical_home,
    )

    home = contextlib.ExitStack()
    root = home.enter_context(radical_home(site, spec, work_dir or os.getcwd()))
    resources = pilot_resources(site, spec)
    try:
        with home_for_children(root):
            backend_class = import_radical()
            backend = await backend_class(dict(resources))
    except ImportError:
        home.close()
        raise _missing_extra(site, "backend.kind", "unattended[radical-pilot]") from None
    except BaseException:
        home.close()
        raise
    # The environment stays pointed at the campaign directory until the pilot is gone.
    parts = EngineParts(engine=None, backend=backend, closers=[home.close])
    if spec.resource != SLURM_RESOURCE:
        return parts  # a machine RADICAL-Pilot knows: its jobs are not watched here
    # Each allocation is one pilot job, watched like dask-jobqueue's worker jobs.
    watch = AllocationWatch(
        PilotJobs(backend, resources, env=os.environ).submit,
        env=os.environ,
        poll_seconds=site.scheduler.poll_seconds,
        max_allocations=site.scheduler.max_allocations,
        max_node_hours=site.scheduler.max_node_hours,
        used=used,
        unreachable_seconds=site.scheduler.unreachable_seconds,
    )
    try:
        await watch.request()
    except BaseException:
        await close_parts(parts, engine_started=False)
        raise
    watch.start()
    parts.allocations = watch
    # Before the session closes (it cancels the pilot): how the pilot ended, else released.
    parts.before_close.append(_release(watch))
    return parts


def _missing_extra(site: SiteConfig, field_name: str, extra: str) -> SiteInvalid:
    where = site.source or site.name
    return SiteInvalid(
        f"{where}: field {field_name}: this backend needs {extra}; install it with "
        f"pip install '{extra}'",
        details={"file": site.source, "field": field_name, "expected": f"{extra} installed"},
    )
