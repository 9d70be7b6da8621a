"""Verifier checks: run a cheap simulation on the allocation and judge the proposal by it.

``verifier(...)`` returns an async check for ``acceptance.accept(checks=[...])``.
A judge that returns a reason rejects the proposal (``Rejected``: the planner
may try again). A verifier task that does not finish (failed, timeout,
cancelled) is a failure (``VerifierFailed``), never a rejection: a broken
verifier must not quietly turn proposals away. Its ``details`` say which task
broke and how (status, stable code, exit code, Slurm job, the tail of its
stderr, bounded like a simulation's) besides where every task ran; the gate
records them on the attempt the failure ended. A task whose allocation ended
(``interrupted``) runs again in the next allocation first.

Where the tasks ran is recorded with the verdict: the check returns (and
``Rejected`` carries) ``details = {"tasks": [...], "job_ids": [...]}``, each task
with its key, status, host, runtime and Slurm job id (the allocation it ran in);
the campaign's provenance stores it in the attempt's verdicts.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from acceptance import Rejected
from policies import VerifierFailed
from tasks._executor import AllocationExecutor
from tasks._results import TaskResult, TaskSpec, tail

T = TypeVar("T")

_tracer = trace.get_tracer("unattended.tasks")

Judge = Callable[[T, Any], "str | Awaitable[str | None] | None"]


def verifier(
    executor: AllocationExecutor,
    *,
    task_for: Callable[[T], TaskSpec | Sequence[TaskSpec]],
    judge: Judge[T],
    name: str = "verifier",
) -> Callable[[T], Awaitable[dict[str, Any]]]:
    """Return an async check that verifies a value with a task on the allocation.

    Args:
        executor: A started executor.
        task_for: Builds the verifier task for a value, or a list of tasks (run
            as one batch; the judge then gets the list of results, in order).
        judge: Given the value and the finished ``TaskResult`` (or list), returns a reason
            to reject (``"predicted energy 3.2 above the limit 1.0 at x=0.7"``)
            or None to pass. Sync or async.
        name: The check's name in verdicts and the span ``verifier <name>``.

    The check raises ``acceptance.Rejected`` when the judge gives a reason, and
    ``policies.VerifierFailed`` when the verifier task did not finish. Either way
    (and on a pass, as its return value) it says where the tasks ran: ``task_details``.
    """

    async def check(value: T) -> dict[str, Any]:
        with _tracer.start_as_current_span(
            f"verifier {name}",
            kind=SpanKind.INTERNAL,
            attributes={"unattended.verifier.name": name},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            spec = task_for(value)
            # Interrupted verifier tasks (the allocation ended) run again in the next one.
            if isinstance(spec, Sequence):
                results = await executor.run_until_done(spec, key_prefix=f"verifier/{name}")
                judged: Any = results
            else:
                results = await executor.run_until_done([spec], key_prefix=f"verifier/{name}")
                judged = results[0]
            span.set_attribute("unattended.verifier.tasks", len(results))
            jobs = sorted({r.job_id for r in results if r.job_id})
            details = task_details(results)
            if jobs:
                # Where the verifier ran: the Slurm jobs (allocations) of its tasks.
                span.set_attribute("unattended.verifier.job_ids", jobs)
            span.set_attribute(
                "unattended.task.runtime", max((r.runtime for r in results), default=0.0)
            )
            broken = next((r for r in results if r.status != "done"), None)
            if broken is not None:
                span.set_attribute("error.type", "VerifierFailed")
                span.set_status(Status(StatusCode.ERROR))
                raise VerifierFailed(
                    f"verifier {name!r}: task {broken.key} ended {broken.status} "
                    f"({broken.error_code})",
                    details={
                        **details,
                        "verifier": name,
                        "task_key": broken.key,
                        "status": broken.status,
                        "error_code": broken.error_code,
                        "exit_code": broken.exit_code,
                        "job_id": broken.job_id,
                        # Bounded here too: a backend's own error text may come uncut.
                        "stderr_tail": tail(broken.stderr_tail),
                    },
                )
            reason: Any = judge(value, judged)
            if inspect.isawaitable(reason):
                reason = await reason
            span.set_attribute("unattended.verifier.passed", reason is None)
            if reason is not None:
                raise Rejected(str(reason), check=name, details=details)
            return details

    check.__name__ = name
    check.__qualname__ = name
    return check


def task_details(results: Sequence[TaskResult]) -> dict[str, Any]:
    """Return where each verifier task ran, for its verdict: keys, statuses, hosts, jobs."""
    return {
        "tasks": [
            {
                "index": r.index,
                "key": r.key,
                "status": r.status,
                "host": r.host,
                "job_id": r.job_id,
                "runtime": r.runtime,
                "attempts": r.attempts,
            }
            for r in results
        ],
        "job_ids": sorted({r.job_id for r in results if r.job_id}),
    }
