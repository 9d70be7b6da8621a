"""One attempt of one task, on each kind of backend, turned into an ``AttemptOutcome``.

Three paths, chosen per site and task:

* local function tasks, ``dispatch = "direct"`` (the default): straight onto the
  pool that asyncflow's ``LocalExecutionBackend`` wraps. asyncflow's own
  per-task bookkeeping (a component dict, a registration task, a run loop that
  rescans every running task every 10 ms, and ``asyncio.run`` per call) made
  10k thread-pool tasks about 200x slower than ``concurrent.futures``; see
  ``benchmarks/dispatch.py`` for the ratios this choice is measured by.
* local executables: ``run_executable`` on this event loop (process groups,
  stdin, timeouts; asyncflow's executable path has none of them).
* everything else (Dask, RADICAL-Pilot, local ``dispatch = "engine"``): through
  the ``WorkflowEngine``, at most ``max_concurrency`` in flight so its run loop
  stays cheap, with a unique Dask key per attempt; a RADICAL-Pilot executable
  as a pilot task (``tasks._dispatch_pilot``).

On the allocation every task reports to the campaign's task ledger (a ``TaskRef``):
a function from the worker's thread, an executable through the task supervisor.

Every outcome says where it ran: the host and, inside a batch job, the Slurm job id
(read on the worker, so a Dask-on-Slurm task names the worker's job). When the
site's allocations are watched (``AllocationWatch``) and all of them have ended,
an attempt still waiting or running comes back ``interrupted``, not ``failed``.
An interrupted attempt is credited to the job and node its started marker names.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import pickle
import re
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import cloudpickle

from policies import UnattendedError
from tasks._asyncflow_internals import forget_finished, task_uid
from tasks._dispatch_pilot import executable_pilot
from tasks._executables import (
    ExecOutcome,
    SpawnFailed,
    node_name,
    run_executable,
    run_executable_blocking,
)
from tasks._outcome import (
    LOST_WORKER,
    error_text,
    executable_outcome,
    function_done,
    function_failure,
    timed_out,
)
from tasks._outcome import (
    AttemptOutcome as AttemptOutcome,  # re-exported: the executor's type for an attempt
)
from tasks._results import ExecutableTask, FunctionTask, jsonable
from tasks._task_ledger import TaskLedger, TaskRef
from tasks._task_supervisor import claim_start, mark_started, where, write_atomically

if TYPE_CHECKING:
    from tasks._allocations import AllocationRecord, AllocationWatch


def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call ``fn``; run it to completion if it is a coroutine function."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


def call_plain(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run a function task in a pool thread."""
    return _call(fn, args, kwargs)


def pack_for_pool(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """Pickle a call for a local pool process: by reference when possible, else cloudpickle.

    Plain pickle is several times cheaper for module-level functions; lambdas and
    closures fail it quickly and go by value through cloudpickle instead.
    """
    call = (fn, args, kwargs)
    try:
        return pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        packed: bytes = cloudpickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL)
        return packed


def call_pickled(payload: bytes) -> Any:
    """Run a pickled function task in a pool process (closures survive the trip)."""
    fn, args, kwargs = pickle.loads(payload)  # noqa: S301  # our own payload, from our process
    return _call(fn, args, kwargs)


def _call_recorded(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    record: tuple[str, str, str, int, str, bool] | None,
) -> Any:
    """Call ``fn`` and, with ``record``, report its start and result to the task ledger.

    Runs on the worker, in the thread that calls the function, so the result is
    written even when the coroutine that awaits it is gone (``tasks._task_ledger``).
    """
    if record is None:
        return _call(fn, args, kwargs)
    folder, digest, token, attempt, key, durable = record
    marker = {"key": key, "token": token, "attempt": attempt, "started_at": time.time(), **where()}
    if not durable:  # only where it ran: no later run looks for its result
        mark_started(folder, digest, marker)
        return _call(fn, args, kwargs)
    if not claim_start(folder, digest, token, marker):  # see tasks/_task_supervisor.py
        raise TaskFenced(f"task {key} not started: a newer run of the campaign took over")
    started = time.perf_counter()
    try:
        value = _call(fn, args, kwargs)
    except BaseException as exc:
        failure = {
            "kind": "error",
            "type": type(exc).__name__,
            "mro": [f"{k.__module__}.{k.__qualname__}" for k in type(exc).__mro__],
            "retryable": bool(isinstance(exc, UnattendedError) and exc.retryable),
            "text": error_text(exc),
        }
        result = {**marker, **failure, "runtime": time.perf_counter() - started}
        write_atomically(folder, f"{digest}.result", result, sync=True)
        raise
    try:
        recorded: dict[str, Any] = {"kind": "value", "value": jsonable(value)}
    except TypeError as exc:
        recorded = {"kind": "error", "type": "TypeError", "mro": [], "text": str(exc),
                    "retryable": False, "reason": "result not JSON"}  # fmt: skip
    result = {**marker, **recorded, "runtime": time.perf_counter() - started}
    write_atomically(folder, f"{digest}.result", result, sync=True)
    return value


class TaskFenced(Exception):  # noqa: N818  # names what happened, like the taxonomy
    """A worker of an earlier run was asked to start a task after a newer run took over."""


async def remote_call(
    payload: bytes, offload: bool, record: tuple[str, str, str, int, str, bool] | None = None
) -> tuple[str, str | None, float, Any]:
    """Run a cloudpickled call where the engine's backend puts it.

    Returns ``(host, Slurm job id or None, runtime, value)``, read on the worker.
    With ``record`` the call reports to the task ledger (``_call_recorded``).

    asyncflow accepts only ``async`` task functions. On Dask a coroutine runs on
    the worker's event loop, so the blocking call is ``offload``-ed to a thread
    there to keep the worker's heartbeats going.
    """
    fn, args, kwargs = cloudpickle.loads(payload)
    started = time.perf_counter()
    if offload:
        value = await asyncio.to_thread(_call_recorded, fn, args, kwargs, record)
    else:
        value = _call_recorded(fn, args, kwargs, record)
    job_id = os.environ.get("SLURM_JOB_ID") or None
    return node_name(), job_id, time.perf_counter() - started, value


def _record(ref: TaskRef | None) -> tuple[str, str, str, int, str, bool] | None:
    """Return a ledger reference as the plain tuple shipped to the worker, or None."""
    return None if ref is None else ref.shipped()


def dask_key(key: str) -> str:
    """Return the Dask key for a task attempt key: ``<first part>-<sha256 prefix>``.

    Dask groups tasks by ``key_split(key)``, which keeps the leading words up to
    the first hex or numeric one. Keys such as ``camp/0/b/17-...`` made one group
    per task, and the scheduler's per-group scans grew with the batch (3x slower
    at 1,000 tasks). The first part of our key names the group; the digest of the
    whole key keeps it unique.
    """
    group = re.sub(r"[^A-Za-z0-9_.]", "_", key.split("/", 1)[0])[:48] or "task"
    return f"{group}-{hashlib.sha256(key.encode('utf-8')).hexdigest()[:32]}"


class Dispatcher:
    """Run single attempts on the paths described in the module docstring."""

    def __init__(
        self,
        *,
        pool: Executor | None,
        direct: bool,
        engine: Any,
        remote_kind: str,
        host: str,
        grace: float,
        transient_codes: frozenset[int],
    ) -> None:
        self.pool = pool
        self.direct = direct
        self.engine = engine
        self.remote_kind = remote_kind  # "local", "dask" or "radical_pilot"
        self.host = host
        self.grace = grace
        self.transient_codes = transient_codes
        self.replace_pool: Callable[[], Executor] | None = None
        #: The batch job this process runs in; local tasks ran in it too.
        self.job_id = os.environ.get("SLURM_JOB_ID") or None
        #: The site's watched allocations (dask-jobqueue jobs, a pilot), if any.
        self.allocations: AllocationWatch | None = None
        #: Where tasks on the allocation report their start and result, if anywhere.
        self.ledger: TaskLedger | None = None
        self._remote: Any = engine.function_task(remote_call) if engine is not None else None
        self._finished: list[str] = []

    async def function(
        self, task: FunctionTask, key: str, time_limit: float | None, ref: TaskRef | None = None
    ) -> AttemptOutcome:
        """Run one attempt of a function task (reporting to the ledger with ``ref``)."""
        if self.direct and self.pool is not None:
            return self._here(await self._function_direct(task, time_limit))
        payload = cloudpickle.dumps((task.fn, tuple(task.args), dict(task.kwargs)))
        return await self._through_engine(payload, key, time_limit, lambda value: value, task, ref)

    async def executable(
        self,
        task: ExecutableTask,
        key: str,
        time_limit: float | None,
        ref: TaskRef | None = None,
    ) -> AttemptOutcome:
        """Run one attempt of an executable task (reporting to the ledger with ``ref``)."""
        if self.remote_kind == "local":
            try:
                out = await run_executable(task, time_limit=time_limit, grace=self.grace)
            except SpawnFailed as exc:
                return AttemptOutcome(
                    status="failed",
                    host=self.host,
                    stderr_tail=str(exc),
                    error_code="task_failed",
                    reason="spawn failed",
                )
            return self._here(executable_outcome(out, task, self.transient_codes, time_limit))
        if self.remote_kind == "radical_pilot":
            return await executable_pilot(self, task, time_limit, ref)
        payload = cloudpickle.dumps(
            (
                run_executable_blocking,
                (list(task.argv), task.stdin, task.env, task.cwd, time_limit, self.grace,
                 _record(ref)),
                {},
            )
        )  # fmt: skip
        # The worker enforces the time limit and kills the group; this is a backstop.
        backstop = None if time_limit is None else time_limit + 2 * self.grace + 30.0
        outcome = await self._through_engine(payload, key, backstop, None, task, ref)
        if outcome.status == "done" and isinstance(outcome.value, ExecOutcome):
            judged = executable_outcome(outcome.value, task, self.transient_codes, time_limit)
            return replace(judged, job_id=outcome.job_id) if outcome.job_id else judged
        return outcome

    def _here(self, outcome: AttemptOutcome) -> AttemptOutcome:
        """Stamp a local outcome with the batch job this process runs in, if any."""
        return outcome if self.job_id is None else replace(outcome, job_id=self.job_id)

    async def race(
        self,
        future: Any,
        lost: asyncio.Future[Any] | None,
        time_limit: float | None,
        started: float,
        ref: TaskRef | None,
    ) -> AttemptOutcome | None:
        """Wait for a backend task against its allocation's end and ``time_limit``.

        Returns None when the task finished (read ``future.result()``); otherwise the
        task is cancelled in the backend and the outcome says why (interrupted, timed
        out). Not ``wait_for``: asyncflow's cancel only *requests* a backend cancel, and
        ``wait_for`` would wait for the backend to confirm it.
        """
        waiting = {future} if lost is None else {future, lost}
        done, _ = await asyncio.wait(
            waiting, timeout=time_limit, return_when=asyncio.FIRST_COMPLETED
        )
        if future in done:
            return None
        future.cancel()
        if lost is not None and lost in done:
            return self.interrupted(lost.result(), time.perf_counter() - started, ref)
        return timed_out(time.perf_counter() - started, self.host, time_limit)

    def interrupted(
        self, record: AllocationRecord | None, runtime: float, ref: TaskRef | None = None
    ) -> AttemptOutcome:
        """Return the outcome of an attempt whose allocation ended before it finished.

        With the task's ledger entry (``ref``) it is credited to the job and node it
        started in, or to none when it never started; otherwise to the last job to end.
        """
        why = "allocation ended" if record is None else (
            f"allocation ended: job {record.job_id} {record.state}"
        )  # fmt: skip
        job_id = record.job_id if record is not None else None
        host = record.nodes[0] if record is not None and record.nodes else self.host
        if ref is not None and self.ledger is not None:
            marker = self.ledger.started_by(ref)
            if marker is None:
                job_id, host, why = None, "", f"{why}; the task had not started"
            else:
                job_id, host = marker.get("job_id"), str(marker.get("node") or "")
        return AttemptOutcome(
            status="interrupted",
            runtime=runtime,
            host=host,
            error_code="allocation_ended",
            reason=why,
            stderr_tail=why,
            job_id=job_id,
        )

    def harvested(
        self, found: dict[str, Any], task: FunctionTask | ExecutableTask, time_limit: float | None
    ) -> AttemptOutcome:
        """Return the outcome a task's wrapper recorded in the ledger (an earlier run's)."""
        host = str(found.get("node") or found.get("host") or "")
        job_id = found.get("job_id")
        runtime = float(found.get("runtime") or 0.0)
        kind = found.get("kind")
        if kind == "exec" and isinstance(task, ExecutableTask):
            out = ExecOutcome(
                found.get("exit_code"), str(found.get("stdout") or ""),
                str(found.get("stderr_tail") or ""), False, runtime, host,
            )  # fmt: skip
            outcome = executable_outcome(out, task, self.transient_codes, time_limit)
        elif kind == "value":
            outcome = function_done(found.get("value"), runtime, host)
        else:
            names = set(found.get("mro") or ())
            wanted = {f"{k.__module__}.{k.__qualname__}" for k in getattr(task, "transient", ())}
            name = str(found.get("type") or "Exception")
            outcome = AttemptOutcome(
                status="failed",
                runtime=runtime,
                host=host,
                stderr_tail=str(found.get("text") or ""),
                error_code="task_failed",
                transient=name in LOST_WORKER
                or bool(found.get("retryable"))
                or bool(names & wanted),
                reason=str(found.get("reason") or name),
            )
        return replace(outcome, job_id=str(job_id) if job_id else None)

    async def _function_direct(
        self, task: FunctionTask, time_limit: float | None
    ) -> AttemptOutcome:
        pool = self.pool
        assert pool is not None
        started = time.perf_counter()
        try:
            if isinstance(pool, ProcessPoolExecutor):
                payload = pack_for_pool(task.fn, tuple(task.args), dict(task.kwargs))
                future = pool.submit(call_pickled, payload)
            else:
                future = pool.submit(call_plain, task.fn, tuple(task.args), dict(task.kwargs))
            try:
                value = await asyncio.wait_for(asyncio.wrap_future(future), time_limit)
            except TimeoutError:
                future.cancel()
                return timed_out(time.perf_counter() - started, self.host, time_limit)
        except BrokenProcessPool as exc:
            # A pool process died (OOM killer, segfault): the pool is unusable.
            # The first task to notice builds a new one; the retry runs on it.
            if self.replace_pool is not None and self.pool is pool:
                self.pool = self.replace_pool()
            return function_failure(exc, task.transient, time.perf_counter() - started, self.host)
        except Exception as exc:  # noqa: BLE001  # any error of a task is its failure record
            return function_failure(exc, task.transient, time.perf_counter() - started, self.host)
        return function_done(value, time.perf_counter() - started, self.host)

    async def _through_engine(
        self,
        payload: bytes,
        key: str,
        time_limit: float | None,
        convert: Callable[[Any], Any] | None,
        task: FunctionTask | ExecutableTask,
        ref: TaskRef | None = None,
    ) -> AttemptOutcome:
        started = time.perf_counter()
        watch = self.allocations
        lost = watch.lost if watch is not None else None
        if lost is not None and lost.done():
            # Nothing is left to run it: do not leave it queued for the next allocation.
            return self.interrupted(lost.result(), 0.0, ref)
        offload = self.remote_kind == "dask"
        # A function reports to the ledger itself; an executable's supervisor does.
        record = _record(ref) if convert is not None else None
        # Dask keys the task by this; every attempt of every task is unique.
        future = self._remote(payload, offload, record, task_description={"key": dask_key(key)})
        try:
            # Cancelled in Dask too when it loses, so it cannot run in the next allocation.
            beaten = await self.race(future, lost, time_limit, started, ref)
            if beaten is not None:
                return beaten
            host, job_id, runtime, value = future.result()
        except asyncio.CancelledError:
            if not future.done():
                future.cancel()
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return AttemptOutcome(
                status="cancelled",
                runtime=time.perf_counter() - started,
                host=self.host,
                error_code="task_failed",
                reason="cancelled by the backend",
                stderr_tail="cancelled by the execution backend",
            )
        except Exception as exc:  # noqa: BLE001  # any error of a task is its failure record
            if watch is not None and type(exc).__name__ in LOST_WORKER:
                # The worker went away: if its allocation did too, this is an interruption.
                await watch.refresh()
                if watch.is_lost:
                    return self.interrupted(watch.lost.result(), time.perf_counter() - started, ref)
            types = task.transient if isinstance(task, FunctionTask) else ()
            return function_failure(exc, types, time.perf_counter() - started, self.host)
        finally:
            self._forget(future)
        if convert is None:
            return AttemptOutcome(
                status="done", value=value, runtime=runtime, host=host, job_id=job_id
            )
        outcome = function_done(convert(value), runtime, host)
        return outcome if job_id is None else replace(outcome, job_id=job_id)

    def _forget(self, future: Any) -> None:
        """Drop finished components from the engine, which otherwise keeps them all."""
        uid = task_uid(future)
        if uid is not None:
            self._finished.append(uid)
        if len(self._finished) < 512:
            return
        self._finished = forget_finished(self.engine, self._finished)
