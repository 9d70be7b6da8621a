"""What one attempt of one task produced (``AttemptOutcome``), and how each kind is judged.

Shared by every dispatch path (``tasks._dispatch``, ``tasks._dispatch_pilot``) and by
the harvest of an earlier run's recorded result: a function's value must be JSON, an
executable's stdout must be JSON, a non-zero exit is its failure (transient for the
site's and the task's transient exit codes), a lost worker is always transient.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

from policies import UnattendedError
from tasks._executables import ExecOutcome
from tasks._results import (
    BAD_OUTPUT,
    ExecutableTask,
    TaskStatus,
    bad_output_tail,
    jsonable,
    stdout_value,
    tail,
)

#: Exceptions that mean the worker, not the task, went away: always transient.
LOST_WORKER = frozenset(
    {"KilledWorker", "CommClosedError", "BrokenProcessPool", "WorkerLostError", "StreamClosedError"}
)


@dataclass(frozen=True)
class AttemptOutcome:
    """What one attempt produced, before it becomes a ``TaskResult``."""

    status: TaskStatus
    value: Any = None
    runtime: float = 0.0
    host: str = ""
    exit_code: int | None = None
    stderr_tail: str = ""
    error_code: str | None = None
    transient: bool = False
    reason: str = ""
    job_id: str | None = None


def error_text(exc: BaseException) -> str:
    """Return the tail of ``exc``'s traceback, as a failure record keeps it."""
    return tail("".join(traceback.format_exception(exc)))


def function_failure(
    exc: BaseException, transient_types: tuple[type[BaseException], ...], runtime: float, host: str
) -> AttemptOutcome:
    """Return the failure of a function task that raised ``exc`` (transient or not)."""
    name = type(exc).__name__
    transient = (
        name in LOST_WORKER
        or (bool(transient_types) and isinstance(exc, transient_types))
        or (isinstance(exc, UnattendedError) and exc.retryable)
    )
    return AttemptOutcome(
        status="failed",
        runtime=runtime,
        host=host,
        stderr_tail=error_text(exc),
        error_code="task_failed",
        transient=transient,
        reason=name,
    )


def function_done(value: Any, runtime: float, host: str) -> AttemptOutcome:
    """Return a ``done`` outcome, or a failure when the value is not JSON."""
    try:
        data = jsonable(value)
    except TypeError as exc:
        return AttemptOutcome(
            status="failed",
            runtime=runtime,
            host=host,
            stderr_tail=str(exc),
            error_code="task_failed",
            reason="result not JSON",
        )
    return AttemptOutcome(status="done", value=data, runtime=runtime, host=host)


def timed_out(
    runtime: float,
    host: str,
    time_limit: float | None,
    exit_code: int | None = None,
    stderr_tail: str = "",
) -> AttemptOutcome:
    """Return the outcome of an attempt that ran past its time limit."""
    return AttemptOutcome(
        status="timeout",
        runtime=runtime,
        host=host,
        exit_code=exit_code,
        stderr_tail=stderr_tail,
        error_code="deadline_exceeded",
        reason=f"timeout after {time_limit}s",
    )


def executable_outcome(
    out: ExecOutcome,
    task: ExecutableTask,
    transient_codes: frozenset[int],
    time_limit: float | None,
) -> AttemptOutcome:
    """Turn what an executable produced into an outcome; stdout JSON becomes the value."""
    if out.timed_out:
        return timed_out(out.runtime, out.host, time_limit, out.exit_code, out.stderr_tail)
    if out.exit_code != 0:
        code = out.exit_code
        return AttemptOutcome(
            status="failed",
            runtime=out.runtime,
            host=out.host,
            exit_code=code,
            stderr_tail=out.stderr_tail,
            error_code="task_failed",
            transient=code in transient_codes or code in task.transient_exit_codes,
            reason=f"exit code {code}",
        )
    try:
        value = jsonable(stdout_value(out.stdout))
    except ValueError:
        # Ran to its end, printed no value: a failure of its own (never retried), not `done`.
        return AttemptOutcome(
            status="failed",
            runtime=out.runtime,
            host=out.host,
            exit_code=0,
            stderr_tail=bad_output_tail("stdout is not JSON", out.stdout, out.stderr_tail),
            error_code=BAD_OUTPUT,
            reason="stdout not JSON",
        )
    return AttemptOutcome(
        status="done",
        value=value,
        runtime=out.runtime,
        host=out.host,
        exit_code=0,
        stderr_tail=out.stderr_tail,
    )
