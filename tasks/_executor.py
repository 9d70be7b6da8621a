"""``AllocationExecutor``: run tasks on the site's backend, bounded, retried, keyed.

Usage::

    async with AllocationExecutor.from_site(load_site("local")) as executor:
        results = await executor.run_batch(tasks, key_prefix="campaign/3/ab12cd")

One executor (one asyncflow engine) per process. Every task gets a unique key
(``<prefix>/<index>-<random token>``), at most ``max_concurrency`` tasks are in flight
(executables also within the open-files limit), transient failures are retried
a bounded number of times and every retry is recorded on the result (one task's
run, harvest and retries: ``tasks._task_run``). A task that fails is a
``TaskResult`` with ``status != "done"``, never an exception.

On a site that starts its own batch jobs (``[backend.jobqueue]``) the executor
requests the first allocation when it starts and watches it. Once every job of
it has ended, unfinished tasks come back ``interrupted`` (with the job id), and
``request_allocation()`` asks for the next one within the site's budget::

    results = await executor.run_batch(tasks, key_prefix=...)
    again = [t for t, r in zip(tasks, results) if r.status == "interrupted"]
    if again:
        await executor.request_allocation()
        results = await executor.run_batch(again, key_prefix=...)
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any

from policies import DeadlineExceeded
from tasks._allocations import AllocationRecord, AllocationWatch, BudgetUsed
from tasks._asyncflow_internals import replace_pool
from tasks._dispatch import Dispatcher
from tasks._engine import (
    EngineParts,
    SavedSignals,
    claim_process,
    close_parts,
    local_pool,
    pool_workers,
    release_process,
    start_engine,
)
from tasks._executables import executable_slots
from tasks._results import FunctionTask, TaskResult, TaskSpec
from tasks._site import SiteConfig
from tasks._site_backends import LocalBackend
from tasks._slurm import job_from_env
from tasks._task_ledger import RESULTS_FOLDER, TaskLedger
from tasks._task_run import TaskRuns

OnResult = Callable[[TaskResult], "Awaitable[None] | None"]
logger = logging.getLogger("unattended.tasks.executor")
#: Allocations in a row that finish none of a batch's tasks before it stops relaunching.
STALLED_ALLOCATIONS = 2
# Key suffixes: random per process, counted per call. One os.urandom per task
# (uuid4) cost ~90 us on the VMs measured here, more than dispatching the task.
_PROCESS_TOKEN = secrets.token_hex(6)
_CALLS = itertools.count(1)


def _new_process_token() -> None:
    # A forked child (a pool process, a flow runner) must not reuse the parent's keys.
    global _PROCESS_TOKEN
    _PROCESS_TOKEN = secrets.token_hex(6)


os.register_at_fork(after_in_child=_new_process_token)


def unique_token() -> str:
    """Return a suffix no other call in any process will produce."""
    return f"{_PROCESS_TOKEN}{next(_CALLS):x}"


class AllocationExecutor:
    """Run ``FunctionTask`` and ``ExecutableTask`` on one site's backend.

    Args:
        site: The validated site config.
        work_dir: Where asyncflow puts its per-engine folder (the campaign directory).
            By default a temporary folder, removed on exit: asyncflow would otherwise
            leave an ``asyncflow.session.*`` folder in the current directory every time.
        budget_used: What earlier runs of the campaign used of the site's allocation
            budget (from its provenance); the limits count it, so they are the campaign's.
    """

    def __init__(
        self,
        site: SiteConfig,
        *,
        work_dir: str | None = None,
        budget_used: BudgetUsed | None = None,
    ) -> None:
        self.site = site
        self.work_dir = work_dir
        self.budget_used = budget_used
        self._scratch: str | None = None
        self._parts: EngineParts | None = None
        self._saved: SavedSignals | None = None
        self._dispatch: Dispatcher | None = None
        self._runs: TaskRuns | None = None
        self._exec_limit = 0
        self._transient_codes = frozenset(site.transient_exit_codes)
        self._watch: AllocationWatch | None = None

    @classmethod
    def from_site(
        cls,
        site: SiteConfig,
        *,
        work_dir: str | None = None,
        budget_used: BudgetUsed | None = None,
    ) -> AllocationExecutor:
        """Return an executor for ``site`` (enter it with ``async with``)."""
        return cls(site, work_dir=work_dir, budget_used=budget_used)

    @property
    def backend_kind(self) -> str:
        """Return the site's backend kind: local, dask or radical_pilot."""
        return self.site.backend.kind

    @property
    def allocations(self) -> list[AllocationRecord]:
        """Return every batch job this executor requested (none on sites without jobs).

        Still readable after the executor closed: the jobs it let go are ``released``.
        """
        return self._watch.records if self._watch is not None else []

    @property
    def allocation_lost(self) -> bool:
        """True when every job of the current allocation has ended."""
        return self._watch is not None and self._watch.is_lost

    def queue_line(self) -> str:
        """Return ``waiting in queue: job 12 PENDING (Resources)``, or '' when nothing waits."""
        return self._watch.queue_line() if self._watch is not None else ""

    def allocation_end(self) -> float | None:
        """Return when the allocation running the tasks ends (epoch seconds), if known.

        On a site with its own jobs: the earliest planned end of the running jobs.
        Otherwise the batch job this process runs in (``SLURM_JOB_END_TIME``), if any.
        """
        if self._watch is not None:
            return self._watch.ends_at()
        inside = job_from_env()
        return inside.ends_at if inside is not None else None

    async def request_allocation(self) -> list[AllocationRecord]:
        """Ask the batch system for the next allocation; return its jobs' records.

        Raises:
            RuntimeError: The site starts no batch jobs of its own.
            policies.BudgetExceeded: ``scheduler.max_allocations`` or
                ``scheduler.max_node_hours`` is used up.
        """
        if self._watch is None or self._parts is None:
            raise RuntimeError("this site starts no batch jobs of its own ([backend.jobqueue])")
        return await self._watch.request()

    async def refresh_allocations(self) -> None:
        """Ask the batch system about the jobs now, instead of at the next poll."""
        if self._watch is not None:
            await self._watch.refresh()

    def on_allocation_change(self, callback: Callable[[list[AllocationRecord]], None]) -> None:
        """Call ``callback`` with every record whenever an allocation changes (and now)."""
        if self._watch is not None:
            self._watch.on_change = callback
            callback(self._watch.records)

    def on_scheduler_outage(self, callback: Callable[[str, dict[str, object]], None]) -> None:
        """Call ``callback(kind, details)`` when the batch system stops or starts answering.

        ``kind`` is one of ``tasks._allocations.OUTAGE_EVENTS``.
        """
        if self._watch is not None:
            self._watch.on_outage = callback

    def seconds_left(self) -> float | None:
        """Return seconds until the running allocation ends, if known (see ``allocation_end``)."""
        end = self.allocation_end()
        return None if end is None else max(0.0, end - time.time())

    async def ensure_time(self, seconds: float, *, unit: float | None = None) -> bool:
        """Make sure work of ``seconds`` can run in this allocation; return True if renewed.

        ``unit`` is how long the work's first task (its first wave) takes; by default
        the whole work is one unit. Nothing is launched into an allocation that cannot
        finish one unit before its end:

        * the current allocation has ended, or ends in less than ``seconds`` while a
          fresh one (the site's walltime) would hold the work: the next is requested;
        * the work is longer than the walltime (no allocation holds it): it is split,
          launched here when one unit finishes before the end (what is interrupted
          is relaunched in the next), else in the next allocation;
        * one unit is longer than the walltime: no allocation can finish it, and the
          work is refused. A job still queued has its whole walltime ahead.

        Raises:
            policies.DeadlineExceeded: One unit is longer than an allocation
                (``scheduler.walltime``, or a pilot's shorter ``runtime_minutes``).
            policies.BudgetExceeded: The next allocation is beyond the site's budget.
        """
        if self._watch is None:
            return False
        limit = self.site.allocation_limit()
        field, walltime = (limit[0], limit[1]) if limit is not None else ("", None)
        first = seconds if unit is None else min(unit, seconds)
        if walltime is not None and first > walltime:
            raise DeadlineExceeded(
                f"one task takes {first:.0f} s by the site's cost model, longer than "
                f"{field} ({walltime:.0f} s): no allocation can finish it; raise "
                "it or lower cost.simulation_seconds / cost.verifier_seconds",
                details={"field": field, "seconds": first, "walltime": walltime},
            )
        if self._watch.is_lost:
            await self.request_allocation()
            return True
        left = self._watch.seconds_left()
        if left is None or left >= seconds:
            return False
        if walltime is not None and seconds > walltime and left > 0.0 and first <= left:
            logger.info(
                "work of %.0f s is longer than the walltime (%.0f s): launched with %.0f s "
                "left, which finish its first %.0f s; the rest is relaunched in the next",
                seconds,
                walltime,
                left,
                first,
            )
            return False
        logger.info(
            "%.0f s left in the allocation, %.0f s needed: asking for the next", left, seconds
        )
        await self.request_allocation()
        return True

    async def run_until_done(
        self,
        tasks: Iterable[TaskSpec],
        *,
        key_prefix: str,
        on_result: OnResult | None = None,
    ) -> list[TaskResult]:
        """Run a batch; relaunch its interrupted tasks in new allocations until none is left.

        The final result of each task is returned in input order. A new allocation is
        requested only when the current one has ended (``policies.BudgetExceeded``
        when the budget is used up). Sites without batch jobs run the batch once.
        After ``STALLED_ALLOCATIONS`` allocations in a row that finish none of them
        (tasks longer than the walltime), the rest is returned ``interrupted``.
        """
        todo = list(tasks)
        results = await self.run_batch(todo, key_prefix=key_prefix, on_result=on_result)
        relaunch = stalled = 0
        while self._watch is not None:
            again = [i for i, result in enumerate(results) if result.status == "interrupted"]
            if not again or stalled >= STALLED_ALLOCATIONS:
                break
            relaunch += 1
            if self._watch.is_lost:
                await self.request_allocation()
            rerun = await self.run_batch(
                [todo[i] for i in again], key_prefix=f"{key_prefix}/r{relaunch}"
            )
            stalled = 0 if any(r.status != "interrupted" for r in rerun) else stalled + 1
            for index, result in zip(again, rerun, strict=True):
                results[index] = result.model_copy(update={"index": index})
                if on_result is not None:
                    returned = on_result(results[index])
                    if inspect.isawaitable(returned):
                        await returned
        return results

    @property
    def executable_concurrency(self) -> int:
        """Return how many executables may run at once (after entering)."""
        return self._exec_limit

    async def __aenter__(self) -> AllocationExecutor:
        claim_process(self)
        loop = asyncio.get_running_loop()
        self._saved = SavedSignals.capture(loop)
        work_dir = self.work_dir
        if work_dir is None:
            self._scratch = work_dir = tempfile.mkdtemp(prefix="unattended-asyncflow-")
        try:
            self._parts = await start_engine(self.site, work_dir=work_dir, used=self.budget_used)
        except BaseException:
            self._remove_scratch()
            release_process(self)
            raise
        finally:
            # The engine's handlers swallow SIGINT/SIGTERM (and outlive it): put
            # the caller's back at once, so Slurm/Prefect cancellation still works.
            self._saved.restore(loop)
        spec = self.site.backend
        local = isinstance(spec, LocalBackend)
        self._dispatch = Dispatcher(
            pool=self._parts.pool,
            direct=isinstance(spec, LocalBackend) and spec.dispatch == "direct",
            engine=self._parts.engine,
            remote_kind=spec.kind,
            host=socket.gethostname(),
            grace=self.site.kill_grace,
            transient_codes=self._transient_codes,
        )
        if isinstance(spec, LocalBackend):
            self._dispatch.replace_pool = self._replace_pool
        self._watch = self._parts.allocations
        self._dispatch.allocations = self._watch
        ledger = None
        if self._watch is not None:
            # Tasks on the allocation report here; workers of earlier runs start no more.
            ledger = TaskLedger(os.path.join(work_dir, RESULTS_FOLDER), unique_token())
            ledger.fence()
            self._dispatch.ledger = ledger
        # Only local executables hold descriptors of this process.
        limit = executable_slots(self.site.max_concurrency) if local else self.site.max_concurrency
        self._exec_limit = limit
        self._runs = TaskRuns(
            site=self.site,
            dispatch=self._dispatch,
            slots=asyncio.Semaphore(self.site.max_concurrency),
            exec_slots=asyncio.Semaphore(limit),
            ledger=ledger,
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            if self._parts is not None:
                await close_parts(self._parts)
        finally:
            if self._saved is not None:
                self._saved.restore(loop)
            self._parts = None
            self._dispatch = None
            self._runs = None
            self._remove_scratch()
            release_process(self)

    def _remove_scratch(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def _replace_pool(self) -> Any:
        """Build a fresh pool after a pool process died, and hand it to asyncflow too."""
        assert self._parts is not None
        assert isinstance(self.site.backend, LocalBackend)
        old = self._parts.pool
        pool = local_pool(self.site.backend)
        self._parts.pool = pool
        replace_pool(self._parts.backend, pool)
        if old is not None:
            old.shutdown(wait=False, cancel_futures=True)
        return pool

    def _entered(self) -> TaskRuns:
        """Return what runs the tasks, once entered (``tasks._task_run``)."""
        if self._runs is None:
            raise RuntimeError("use 'async with AllocationExecutor(...)' before submitting tasks")
        return self._runs

    async def submit(self, task: TaskSpec, *, key: str | None = None) -> TaskResult:
        """Run one task and return its result (index 0).

        Args:
            task: The task.
            key: A readable key prefix; a random suffix makes it unique.
        """
        return await self._entered().run(task, f"{key or 'task'}/0-{unique_token()}", 0)

    async def run_batch(
        self,
        tasks: Iterable[TaskSpec],
        *,
        key_prefix: str,
        on_result: OnResult | None = None,
        durable: bool = False,
    ) -> list[TaskResult]:
        """Run every task, at most ``max_concurrency`` at once; return results in input order.

        Args:
            tasks: The tasks of the batch.
            key_prefix: ``campaign/round/batch``; each task's key adds ``/<index>-<token>``.
            on_result: Called (sync or async) with each result as it finishes, for progress.
            durable: ``key_prefix`` names this batch in every run of the campaign (a
                simulation batch's): on a site with its own jobs each task's result
                recorded by an earlier run is harvested instead of run again.
        """
        todo = list(tasks)
        token = unique_token()
        results: list[TaskResult | None] = [None] * len(todo)
        queue = iter(enumerate(todo))

        async def consume() -> None:
            # One shared iterator: a bounded set of consumers, not one task per item.
            for index, task in queue:
                durable_key = f"{key_prefix}/{index}" if durable else None
                result = await self._entered().run(
                    task, f"{key_prefix}/{index}-{token}", index, durable_key, one_more
                )
                results[index] = result
                if self._watch is not None:  # before on_result: it records the job's window
                    await self._watch.saw_task_in(result.job_id)
                if on_result is not None:
                    returned = on_result(result)
                    if inspect.isawaitable(returned):
                        await returned

        width = self.site.max_concurrency
        spec = self.site.backend
        direct = isinstance(spec, LocalBackend) and spec.dispatch == "direct"
        if (
            isinstance(spec, LocalBackend)
            and direct
            and all(isinstance(task, FunctionTask) for task in todo)
        ):
            # The pool runs at most its worker count at once; more coroutines
            # waiting on it only add switching (threads: 256 in flight vs 8 was
            # 4x slower for 10k). A process pool's pipe needs a deeper queue.
            depth = 2 if spec.executor == "thread" else 16
            width = min(width, depth * pool_workers(spec))
        consumers: list[asyncio.Future[None]] = []

        def one_more() -> None:
            # A task waiting for its retry gave its slot back: one more consumer takes
            # the queue's next task meanwhile (the slots still bound what runs at once).
            consumers.append(asyncio.ensure_future(consume()))

        consumers += [asyncio.ensure_future(consume()) for _ in range(min(width, len(todo)))]
        try:
            while pending := [consumer for consumer in consumers if not consumer.done()]:
                await asyncio.gather(*pending)
        except BaseException:
            for consumer in consumers:
                consumer.cancel()
            await asyncio.gather(*consumers, return_exceptions=True)
            raise
        return [result for result in results if result is not None]
