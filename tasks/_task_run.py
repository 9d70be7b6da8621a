"""Run one task to its final result: harvested, attempted, retried (``TaskRuns``).

What ``AllocationExecutor`` shares between the tasks it runs once it is entered:
the dispatcher, the slots bounding what runs at once, the task ledger. For each
task, ``TaskRuns.run`` takes a slot, harvests the result an earlier run of the
campaign recorded for its durable key (if any), and otherwise attempts it,
retrying a transient failure through tenacity. While a failed attempt waits for
its retry, the task gives its slot back. Every retry, and every attempt a dead
run lost, is a ``RetryRecord`` on the result.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_result,
    stop_after_attempt,
    wait_exponential,
)

from tasks._dispatch import AttemptOutcome, Dispatcher
from tasks._results import ExecutableTask, FunctionTask, RetryRecord, TaskResult, TaskSpec
from tasks._site import SiteConfig
from tasks._task_ledger import TaskLedger, TaskRef

_MAX_BACKOFF = 300.0


def _lost_record(number: int, marker: dict[str, Any]) -> RetryRecord:
    """Return the record of a task a dead run started that ended without a result."""
    return RetryRecord(
        attempt=number,
        error_code="allocation_ended",
        reason=(
            f"lost: started in job {marker.get('job_id')} on {marker.get('node')} by a run "
            "that died; its job ended without a result"
        ),
        at=float(marker.get("started_at") or time.time()),
    )


def _retryable(outcome: AttemptOutcome) -> bool:
    """Return whether a task's attempt failed in a way worth running it again."""
    return outcome.status != "done" and outcome.transient


def _last_result(state: RetryCallState) -> Any:
    """Return the last attempt's outcome once the retries are used up."""
    return state.outcome.result()  # type: ignore[union-attr]  # set after every attempt


@dataclass(frozen=True, slots=True)
class TaskRuns:
    """Run tasks on one entered executor's dispatcher, within its slots.

    Args:
        site: The site's config (timeouts, retries, backoff, poll interval).
        dispatch: Where each attempt goes.
        slots: At most ``max_concurrency`` tasks hold one at once.
        exec_slots: Executables also hold one of these (the open-files limit).
        ledger: The task ledger, on a site that starts its own batch jobs.
    """

    site: SiteConfig
    dispatch: Dispatcher
    slots: asyncio.Semaphore
    exec_slots: asyncio.Semaphore
    ledger: TaskLedger | None

    async def run(
        self,
        task: TaskSpec,
        key: str,
        index: int,
        durable: str | None = None,
        on_backoff: Callable[[], None] | None = None,
    ) -> TaskResult:
        """Run a task to its final result; with a ``durable`` key, harvest an earlier run's first.

        A durable key (``<batch prefix>/<index>``) names the same task in every run of
        the campaign: its result recorded in the task ledger by a run that died is
        taken as it is (recorded once, with its own job and node), one still running
        in a live job is waited for, and one lost (its job ended without a result) is
        run again, the loss kept in ``retries``. While a failed attempt waits for its
        retry the task holds no slot, and ``on_backoff`` is called (the batch starts
        another consumer, so the next task runs meanwhile).
        """
        timeout = task.timeout if task.timeout is not None else self.site.task_timeout
        retries = task.retries if task.retries is not None else self.site.retries
        records: list[RetryRecord] = []
        attempt = 1
        ledger = self.ledger
        slots = self.slots
        await slots.acquire()
        held = True
        try:
            outcome: AttemptOutcome | None = None
            if ledger is not None and durable is not None:
                found, lost = await ledger.settle(
                    durable, env=os.environ, poll_seconds=self.site.scheduler.poll_seconds
                )
                records += [_lost_record(n, marker) for n, marker in enumerate(lost, 1)]
                if found is not None:
                    outcome = self.dispatch.harvested(found, task, timeout)
                    attempt = int(found.get("attempt") or 1)
                    if outcome.transient and outcome.status != "done" and attempt <= retries:
                        outcome, attempt = None, attempt + 1  # retried from where it was
            if outcome is None:

                async def run_once() -> AttemptOutcome:
                    nonlocal held
                    if not held:  # given back while this retry waited
                        await slots.acquire()
                        held = True
                    ref = None
                    if ledger is not None:
                        ref = ledger.ref(durable or key, attempt, durable=durable is not None)
                    return await self._attempt(task, f"{key}#{attempt}", timeout, ref)

                def wait_without_slot(state: RetryCallState) -> None:
                    nonlocal attempt, held
                    failed: AttemptOutcome = state.outcome.result()  # type: ignore[union-attr]
                    records.append(
                        RetryRecord(
                            attempt=attempt,
                            error_code=failed.error_code or "task_failed",
                            reason=failed.reason,
                            at=time.time(),
                        )
                    )
                    attempt += 1
                    if state.upcoming_sleep > 0:
                        # A task waiting to be retried runs nothing: its slot goes to the
                        # batch's next task meanwhile, and is taken again for the retry.
                        slots.release()
                        held = False
                        if on_backoff is not None:
                            on_backoff()

                outcome = await run_once()
                if _retryable(outcome) and attempt <= retries:
                    first = [outcome]

                    async def first_then_again() -> AttemptOutcome:
                        # tenacity is given the run made above as its first: a call through
                        # it costs ~0.1 ms, which every task of a batch would pay.
                        return first.pop() if first else await run_once()

                    # Budget: runs up to attempt `retries + 1` (the task's or the site's), on a
                    # transient failure only, waiting retry_backoff * 2^(attempt-1) s, <= 300 s.
                    retried: AttemptOutcome = await AsyncRetrying(
                        retry=retry_if_result(_retryable),
                        stop=stop_after_attempt(retries + 2 - attempt),
                        wait=wait_exponential(
                            multiplier=self.site.retry_backoff * 2 ** (attempt - 1),
                            max=_MAX_BACKOFF,
                        ),
                        before_sleep=wait_without_slot,
                        retry_error_callback=_last_result,
                    )(first_then_again)
                    outcome = retried
        finally:
            if held:
                slots.release()
        # Every field comes from this module's own typed code (values already made
        # JSON by `jsonable`): validating again cost ~15 us a task at 10k tasks.
        return TaskResult.model_construct(
            index=index,
            key=key,
            status=outcome.status,
            value=outcome.value,
            runtime=max(outcome.runtime, 0.0),
            host=outcome.host,
            job_id=outcome.job_id,
            exit_code=outcome.exit_code,
            stderr_tail=outcome.stderr_tail,
            attempts=max(attempt, len(records) + 1),
            error_code=outcome.error_code,
            retries=tuple(records),
        )

    async def _attempt(
        self, task: TaskSpec, key: str, time_limit: float | None, ref: TaskRef | None
    ) -> AttemptOutcome:
        if isinstance(task, ExecutableTask):
            async with self.exec_slots:
                return await self.dispatch.executable(task, key, time_limit, ref)
        if isinstance(task, FunctionTask):
            return await self.dispatch.function(task, key, time_limit, ref)
        raise TypeError(f"not a task: {type(task).__name__}")
