"""What a task is (``FunctionTask``, ``ExecutableTask``) and what came of it (``TaskResult``).

A failed simulation is a failure *record* (``status="failed"``), never an
exception and never a rejection: the campaign decides what a failed batch means.
``TaskResult`` is frozen and JSON-serialisable because the provenance store keeps
it as is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticSerializationError, to_jsonable_python

#: ``interrupted``: the allocation the task ran (or waited) on ended before it finished
#: (walltime, ``scancel``, node failure). Not a failure of the task: the campaign
#: relaunches exactly these in its next allocation.
TaskStatus = Literal["done", "failed", "timeout", "cancelled", "interrupted"]

#: How much of a task's stderr (or of a function's exception) a result keeps.
STDERR_TAIL_CHARS = 2048

#: The stable code of a task that ran to its end but wrote no value its reader can use
#: (an executable's stdout that is not JSON; a simulation's value with no finite number
#: where the objective reads one). A failure, never a success with ``value = None``.
BAD_OUTPUT = "bad_output"

# What a bad output's record keeps of each stream: the two share ``stderr_tail``.
_OUTPUT_TAIL_CHARS = STDERR_TAIL_CHARS // 2 - 64


@dataclass(frozen=True, eq=False)
class FunctionTask:
    """Call ``fn(*args, **kwargs)`` on the allocation.

    Args:
        fn: A plain or ``async`` function. On a process pool or Dask it is
            shipped with cloudpickle, so closures work; its return value must be
            JSON-serialisable (numpy values are converted with ``tolist()``).
        timeout: Seconds before the attempt ends as ``timeout``; ``None`` uses the
            site's ``task_timeout``. A thread cannot be killed: a timed-out
            function keeps its worker until it returns.
        retries: Retries for transient failures; ``None`` uses the site's ``retries``.
        transient: Exception types that mark a failure as transient (retried).
            An ``UnattendedError`` with ``retryable=True`` is always transient.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    timeout: float | None = None
    retries: int | None = None
    transient: tuple[type[BaseException], ...] = ()


@dataclass(frozen=True, eq=False)
class ExecutableTask:
    """Run ``argv`` (no shell) in its own process group on the allocation.

    Args:
        argv: The program and its arguments; ``argv[0]`` is looked up on ``PATH``.
        stdin: Bytes written to the program's standard input (closed after).
        env: The whole environment of the program; ``None`` inherits the worker's.
        cwd: Working directory; ``None`` inherits the worker's.
        timeout: Seconds before the WHOLE process group is terminated (SIGTERM,
            then SIGKILL after the site's ``kill_grace``); ``None`` uses the site's.
        retries: Retries for transient failures; ``None`` uses the site's ``retries``.
        transient_exit_codes: Exit codes (besides the site's) that mean "try again".
    """

    argv: list[str]
    stdin: bytes | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None
    timeout: float | None = None
    retries: int | None = None
    transient_exit_codes: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if not self.argv or not all(isinstance(part, str) for part in self.argv):
            raise ValueError("ExecutableTask.argv must be a non-empty list of strings")


TaskSpec = FunctionTask | ExecutableTask


class RetryRecord(BaseModel):
    """One failed attempt that was retried because its failure was transient."""

    model_config = ConfigDict(frozen=True)

    attempt: int = Field(ge=1, description="The attempt that failed (1 for the first).")
    error_code: str = Field(description="Stable code of the failure, e.g. 'task_failed'.")
    reason: str = Field(description="Why it counted as transient: an exit code or a type name.")
    at: float = Field(description="Unix time the failure was seen.")


class TaskResult(BaseModel):
    """The outcome of one task, successful or not.

    ``value`` is a function's return value, or an executable's stdout parsed as
    JSON (``None`` when stdout is empty). Stdout that is not JSON (``NaN`` and
    ``Infinity`` are not) makes the task ``failed`` with code ``bad_output``; its
    ``stderr_tail`` then holds the tails of both streams (:func:`bad_output_tail`).
    """

    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=0, description="Position of the task in its batch (0 for submit).")
    key: str = Field(min_length=1, description="Unique task key: prefix/index-uuid.")
    status: TaskStatus = Field(description="done, failed, timeout, cancelled or interrupted.")
    value: Any = Field(default=None, description="JSON value the task produced.")
    runtime: float = Field(ge=0.0, description="Seconds the last attempt took.")
    host: str = Field(description="Host name the last attempt ran on.")
    job_id: str | None = Field(
        default=None, description="Batch job (Slurm job id) the last attempt ran in, if any."
    )
    exit_code: int | None = Field(
        default=None, description="Executable exit code (negative: killed by that signal)."
    )
    stderr_tail: str = Field(default="", description="Last ~2 KB of stderr or of the error.")
    attempts: int = Field(ge=1, description="1 + the retries used.")
    error_code: str | None = Field(
        default=None,
        description=(
            "Stable code when not done: task_failed, bad_output, deadline_exceeded, "
            "allocation_ended."
        ),
    )
    retries: tuple[RetryRecord, ...] = Field(default=(), description="Every retried attempt.")

    @property
    def ok(self) -> bool:
        """True when the task finished with status ``done``."""
        return self.status == "done"


def tail(text: str, limit: int = STDERR_TAIL_CHARS) -> str:
    """Return the last ``limit`` characters of ``text``."""
    return text if len(text) <= limit else text[-limit:]


def stdout_value(text: str) -> Any:
    """Return an executable's stdout as its value: strict JSON, None when empty.

    Raises:
        ValueError: The stdout is not JSON (``NaN`` and ``Infinity`` are not JSON,
            though Python's ``json`` reads them): the task's output is bad.
    """
    stripped = text.strip()
    if not stripped:
        return None
    return json.loads(stripped, parse_constant=_not_json)


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def bad_output_tail(why: str, stdout: str, stderr: str) -> str:
    """Return what a ``bad_output`` record keeps: why, then the ends of stdout and stderr.

    Both streams are kept (about 1 KB each) in the one text a task result has for
    them, so ``inspect`` and the provenance show what the program printed instead
    of a value.
    """
    out = tail(stdout, _OUTPUT_TAIL_CHARS)
    err = tail(stderr, _OUTPUT_TAIL_CHARS)
    return (
        f"{why}\n--- stdout (last {len(out)} chars) ---\n{out}\n"
        f"--- stderr (last {len(err)} chars) ---\n{err}"
    )


def _numpy_friendly(value: Any) -> Any:
    """Convert values that know how to become lists (numpy arrays and scalars)."""
    to_list = getattr(value, "tolist", None)
    if callable(to_list):
        return to_list()
    raise TypeError(type(value).__name__)


def jsonable(value: Any) -> Any:
    """Return ``value`` as plain JSON data, or raise ``TypeError`` naming the bad type."""
    try:
        return to_jsonable_python(value, fallback=_numpy_friendly)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise TypeError(f"value of type {type(value).__name__} is not JSON-serialisable") from exc
