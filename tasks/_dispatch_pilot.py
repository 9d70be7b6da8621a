"""One attempt of an executable task as a RADICAL-Pilot task, turned into an ``AttemptOutcome``.

The pilot runs ``tasks._radical.pilot_command`` around the task: it prints where it
runs (the Slurm job and node) as its first stdout line and feeds the task's stdin,
which travels base64-encoded as an argument (RADICAL-Pilot tasks take no stdin).
With the campaign's task ledger (a ``TaskRef``) the program runs inside that
wrapper under ``tasks/_task_supervisor.py``, exactly as a Dask worker runs it
(``tasks._executables.supervised_argv``): the supervisor writes the started marker
(run, attempt, job, node), refuses to start when a newer run of the campaign has
fenced the folder, and writes the result atomically, so a continuation harvests
what finished after the login node died (``TaskLedger.settle``) instead of running
it again. A task whose key is not durable leaves only its started marker.

RADICAL-Pilot fails (or cancels) the tasks of a pilot whose job ended; once
``squeue`` shows that job ended those are ``interrupted``, credited through the
ledger to the job and node the task started on (or to none, if it never started).
"""

from __future__ import annotations

import asyncio
import shlex
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from tasks._executables import ExecOutcome, supervised_argv
from tasks._outcome import AttemptOutcome, executable_outcome
from tasks._results import ExecutableTask, tail
from tasks._task_ledger import TaskRef

if TYPE_CHECKING:
    from tasks._dispatch import Dispatcher

#: A pilot task can fail a moment before ``squeue`` shows its job ended: ask this
#: many times, this many seconds apart, before calling the failure the task's own.
PILOT_END_CHECKS = 3
PILOT_END_WAIT = 1.0


def pilot_argv(task: ExecutableTask, ref: TaskRef | None) -> list[str]:
    """Return the argv of the pilot task that runs ``task`` (under the supervisor with ``ref``)."""
    from tasks._radical import pilot_command

    argv = list(task.argv) if ref is None else supervised_argv(list(task.argv), ref.shipped())
    return pilot_command(argv, task.stdin)


async def executable_pilot(
    dispatcher: Dispatcher,
    task: ExecutableTask,
    time_limit: float | None,
    ref: TaskRef | None = None,
) -> AttemptOutcome:
    """Run an executable as a RADICAL-Pilot task of ``dispatcher``'s engine.

    With ``ref`` it reports to the task ledger; env and cwd are not supported there.
    """
    from tasks._radical import split_where

    started = time.perf_counter()
    if task.env is not None or task.cwd is not None:
        return AttemptOutcome(
            status="failed",
            host=dispatcher.host,
            error_code="task_failed",
            stderr_tail="env and cwd are not supported on radical_pilot sites",
            reason="unsupported on radical_pilot",
        )
    command = shlex.join(pilot_argv(task, ref))

    async def command_line() -> str:
        return command

    watch = dispatcher.allocations
    lost = watch.lost if watch is not None else None
    if lost is not None and lost.done():
        # The pilot's job has ended: wait for the next allocation, do not fail here.
        return dispatcher.interrupted(lost.result(), 0.0, ref)
    future = dispatcher.engine.executable_task(command_line)()
    try:
        beaten = await dispatcher.race(future, lost, time_limit, started, ref)
        if beaten is not None:
            return beaten
        stdout = future.result()
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        if await pilot_ended(dispatcher):
            assert watch is not None
            return dispatcher.interrupted(watch.lost.result(), time.perf_counter() - started, ref)
        return AttemptOutcome(
            status="cancelled",
            runtime=time.perf_counter() - started,
            host=dispatcher.host,
            error_code="task_failed",
            reason="cancelled by the backend",
            stderr_tail="cancelled by the execution backend",
        )
    except Exception as exc:  # noqa: BLE001  # any error of a task is its failure record
        if await pilot_ended(dispatcher):
            # RADICAL-Pilot fails the tasks of a pilot whose job ended: an interruption.
            assert watch is not None
            return dispatcher.interrupted(watch.lost.result(), time.perf_counter() - started, ref)
        return AttemptOutcome(
            status="failed",
            runtime=time.perf_counter() - started,
            host=dispatcher.host,
            stderr_tail=tail(str(exc)),
            error_code="task_failed",
            reason=type(exc).__name__,
        )
    job_id, host, output = split_where(str(stdout))
    where = host or dispatcher.host
    out = ExecOutcome(0, output, "", False, time.perf_counter() - started, where)
    outcome = executable_outcome(out, task, dispatcher.transient_codes, time_limit)
    return replace(outcome, job_id=job_id) if job_id else outcome


async def pilot_ended(dispatcher: Dispatcher) -> bool:
    """True when the pilot's job has ended (asked a few times: tasks may fail first)."""
    from tenacity import AsyncRetrying, retry_if_result, stop_after_attempt, wait_fixed

    watch = dispatcher.allocations
    if watch is None:
        return False

    async def lost() -> bool:
        await watch.refresh()
        return watch.is_lost

    # Budget: PILOT_END_CHECKS looks, PILOT_END_WAIT apart; not lost by then: not ended.
    looks = AsyncRetrying(
        retry=retry_if_result(lambda ended: not ended),
        stop=stop_after_attempt(PILOT_END_CHECKS),
        wait=wait_fixed(PILOT_END_WAIT),
        retry_error_callback=lambda _: False,
    )
    return bool(await looks(lost))
