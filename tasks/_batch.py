"""Simulation batches with idempotency keys: a batch is launched at most once.

A flow that resumes after an approval runs again from the top. ``launch_batch``
asks the ``BatchStore`` first: when the batch with the same key has finished
results, they are returned and nothing runs.

When the allocation ends mid-batch, its unfinished tasks come back
``interrupted``; ``launch_batch`` then relaunches exactly those candidates as
their own batch (``relaunch`` 1, 2, ..., keyed apart), in the next allocation,
until each has a final result. Every relaunch is recorded like a batch, so a
restart replays the chain instead of running a completed candidate again.

A simulation that says what its reader takes (``Simulation.reads``, for a campaign
:func:`objective_value`) has every ``done`` result judged before it is recorded: one
whose value holds no finite number is recorded ``failed`` with code ``bad_output``, so
nothing downstream counts it a success.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tasks._executor import STALLED_ALLOCATIONS, AllocationExecutor, OnResult
from tasks._results import (
    BAD_OUTPUT,
    ExecutableTask,
    FunctionTask,
    TaskResult,
    TaskSpec,
    bad_output_tail,
)

Candidate = Sequence[float]

# What a simulation that reads an objective must produce, in the words of its failure.
OBJECTIVE_SHAPE = 'a finite number, or {"value": <finite number>}'


def objective_value(value: Any) -> float | None:
    """Return the objective a simulation's value carries, or None when it carries none.

    The value is a finite number, or a JSON object whose ``"value"`` is one
    (booleans, NaN and infinities are not numbers here). This is what a campaign
    learns from; a ``done`` task whose value gives None is a ``bad_output`` failure.
    """
    if isinstance(value, Mapping):
        value = value.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _canonical_candidates(candidates: Sequence[Candidate]) -> list[list[float]]:
    """Return candidates as lists of floats; NaN and infinities are refused."""
    canonical = []
    for i, candidate in enumerate(candidates):
        row = [float(x) for x in candidate]
        if not all(math.isfinite(x) for x in row):
            raise ValueError(f"candidate {i} has a value that is not finite")
        canonical.append(row)
    return canonical


def batch_key(
    campaign: str,
    round_index: int,
    candidates: Sequence[Candidate],
    simulation_id: str,
    *,
    relaunch: int = 0,
) -> str:
    """Return the idempotency key of a batch: sha256 over canonical JSON.

    Stable across processes and Python versions: numbers become floats (so
    ``1`` and ``1.0`` are the same candidate) and JSON is written with sorted
    keys and no whitespace. ``relaunch`` (the n-th relaunch of interrupted
    candidates) is part of the key only when it is not 0, so round batches keep
    the keys they always had.
    """
    document: dict[str, Any] = {
        "campaign": campaign,
        "round": int(round_index),
        "simulation": simulation_id,
        "candidates": _canonical_candidates(candidates),
    }
    if relaunch:
        document["relaunch"] = int(relaunch)
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@runtime_checkable
class BatchStore(Protocol):
    """Where launched batches and their results are recorded (the provenance store)."""

    def find_batch(self, key: str) -> list[TaskResult] | None:
        """Return the finished results of batch ``key``, or None."""
        ...

    def record_batch_launched(
        self,
        key: str,
        *,
        campaign: str,
        round_index: int,
        candidates: list[list[float]],
        backend: str,
        relaunch: int = 0,
    ) -> None:
        """Record that batch ``key`` was launched (idempotent); ``relaunch`` > 0 for relaunches."""
        ...

    def record_batch_results(self, key: str, results: Sequence[TaskResult]) -> None:
        """Record the results of batch ``key`` (idempotent)."""
        ...


class MemoryBatchStore:
    """A ``BatchStore`` in memory, for tests and for runs without a database."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.launched: dict[str, dict[str, Any]] = {}
        self.results: dict[str, list[TaskResult]] = {}

    def find_batch(self, key: str) -> list[TaskResult] | None:
        """Return the finished results of batch ``key``, or None."""
        with self._lock:
            found = self.results.get(key)
            return list(found) if found is not None else None

    def record_batch_launched(
        self,
        key: str,
        *,
        campaign: str,
        round_index: int,
        candidates: list[list[float]],
        backend: str,
        relaunch: int = 0,
    ) -> None:
        """Record that batch ``key`` was launched; a second call changes nothing."""
        with self._lock:
            self.launched.setdefault(
                key,
                {
                    "campaign": campaign,
                    "round_index": round_index,
                    "candidates": [list(c) for c in candidates],
                    "backend": backend,
                    "relaunch": relaunch,
                },
            )

    def record_batch_results(self, key: str, results: Sequence[TaskResult]) -> None:
        """Record the results of batch ``key``; the first recording wins."""
        with self._lock:
            self.results.setdefault(key, list(results))


@dataclass(frozen=True)
class Simulation:
    """How a candidate becomes a task.

    Build one with ``Simulation.executable`` (the candidate is written as JSON to
    the program's stdin, its stdout JSON is the value) or ``Simulation.function``
    (the function is called with the candidate as a list of floats).

    ``id`` names the simulation in the batch key: change it when the simulation
    changes meaning, or old results would be reused.

    ``reads`` says what the reader of the results takes from a value (a campaign:
    :func:`objective_value`): a ``done`` result it finds nothing in becomes
    ``failed`` with code ``bad_output`` (:meth:`judged`). ``None`` keeps any value.
    """

    id: str
    argv: tuple[str, ...] | None = None
    fn: Callable[[list[float]], Any] | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None
    timeout: float | None = None
    retries: int | None = None
    transient_exit_codes: frozenset[int] = field(default_factory=frozenset)
    reads: Callable[[Any], float | None] | None = None

    def __post_init__(self) -> None:
        if (self.argv is None) == (self.fn is None):
            raise ValueError("a Simulation needs exactly one of argv or fn")
        if not self.id:
            raise ValueError("a Simulation needs an id")

    @classmethod
    def executable(
        cls, argv: Sequence[str], *, id: str | None = None, **options: Any
    ) -> Simulation:
        """Run ``argv`` per candidate; ``{index}``, ``{round}``, ``{campaign}`` are filled in.

        Without an ``id`` the simulation is named by a hash of its argv.
        """
        parts = tuple(str(part) for part in argv)
        if id is None:
            digest = hashlib.sha256(json.dumps(parts).encode("utf-8")).hexdigest()[:16]
            id = f"argv-{digest}"
        return cls(id=id, argv=parts, **options)

    @classmethod
    def function(
        cls,
        fn: Callable[[list[float]], Any],
        *,
        id: str | None = None,
        **options: Any,
    ) -> Simulation:
        """Call ``fn(candidate)`` per candidate; without an ``id`` it is the function's name."""
        if id is None:
            id = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        return cls(id=id, fn=fn, **options)

    def task_for(
        self, candidate: list[float], *, index: int, campaign: str, round_index: int
    ) -> TaskSpec:
        """Return the task that simulates ``candidate``."""
        if self.fn is not None:
            return FunctionTask(
                self.fn, args=(candidate,), timeout=self.timeout, retries=self.retries
            )
        assert self.argv is not None
        fills = {"{index}": str(index), "{round}": str(round_index), "{campaign}": campaign}
        argv = [fills.get(part, part) for part in self.argv]
        return ExecutableTask(
            argv=argv,
            stdin=json.dumps(candidate).encode("utf-8"),
            env=self.env,
            cwd=self.cwd,
            timeout=self.timeout,
            retries=self.retries,
            transient_exit_codes=self.transient_exit_codes,
        )

    def judged(self, result: TaskResult) -> TaskResult:
        """Return ``result``, or a ``bad_output`` failure if it is done with nothing to read."""
        if self.reads is None or result.status != "done" or self.reads(result.value) is not None:
            return result
        shown = "" if result.value is None else json.dumps(result.value, allow_nan=True)
        what = "stdout" if self.argv is not None else "the function's return value"
        why = (
            f"simulation {self.id} wrote no value the objective reads: {what} gave "
            f"{'nothing' if result.value is None else 'no finite number'} "
            f"(expected {OBJECTIVE_SHAPE})"
        )
        return result.model_copy(
            update={
                "status": "failed",
                "error_code": BAD_OUTPUT,
                "value": None,
                "stderr_tail": bad_output_tail(why, shown, result.stderr_tail),
            }
        )


@dataclass(frozen=True)
class BatchOutcome:
    """The final results of a batch, whether they were reused, and how often it relaunched.

    ``results`` has one entry per candidate, in order: the last word on it (a
    relaunched candidate's result from its relaunch). ``key`` is the round batch's key.
    """

    key: str
    results: list[TaskResult]
    reused: bool
    relaunches: int = 0


SecondsFor = Callable[[int], float]


async def launch_batch(
    executor: AllocationExecutor,
    store: BatchStore,
    *,
    campaign: str,
    round_index: int,
    candidates: Sequence[Candidate],
    simulation: Simulation,
    on_result: OnResult | None = None,
    seconds_for: SecondsFor | None = None,
) -> BatchOutcome:
    """Run one simulation per candidate, at most once per batch key; relaunch interruptions.

    If ``store`` already holds the results of this batch (same campaign, round,
    candidates and simulation id) they are returned and nothing runs
    (``reused=True``). Otherwise the launch is recorded, the batch runs, and the
    results are recorded. Failed simulations are results, not exceptions.

    Candidates whose tasks come back ``interrupted`` (the allocation ended) are
    relaunched as batch ``relaunch=1, 2, ...`` in the next allocation, each
    recorded in the store, until none is left (see ``AllocationExecutor.run_until_done``
    for when it gives up).

    Args:
        seconds_for: How long ``n`` of these simulations take on the site; before a
            batch that must run, ``executor.ensure_time`` gets a fresh allocation
            when the current one would end first (walltime-aware launch).

    Raises:
        policies.BudgetExceeded: A relaunch needs an allocation beyond the site's budget.
    """
    canonical = _canonical_candidates(candidates)
    key = batch_key(campaign, round_index, canonical, simulation.id)
    indexes = list(range(len(canonical)))
    results, reused = await _launch_once(
        executor, store, key, 0, indexes, canonical, campaign, round_index, simulation,
        on_result, seconds_for,
    )  # fmt: skip
    merged = list(results)
    relaunch = stalled = 0
    while True:
        again = [i for i, result in enumerate(merged) if result.status == "interrupted"]
        if not again or stalled >= STALLED_ALLOCATIONS:
            break
        relaunch += 1
        subset = [canonical[i] for i in again]
        sub_key = batch_key(campaign, round_index, subset, simulation.id, relaunch=relaunch)
        rerun, _ = await _launch_once(
            executor, store, sub_key, relaunch, again, subset, campaign, round_index,
            simulation, on_result, seconds_for,
        )  # fmt: skip
        stalled = 0 if any(r.status != "interrupted" for r in rerun) else stalled + 1
        for index, result in zip(again, rerun, strict=True):
            merged[index] = _at_index(result, index)
    return BatchOutcome(key=key, results=merged, reused=reused, relaunches=relaunch)


def _judging(on_result: OnResult | None, simulation: Simulation) -> OnResult | None:
    """Return ``on_result`` seeing each result as it will be recorded: judged."""
    if on_result is None:
        return None
    report = on_result

    def seen(result: TaskResult) -> Any:
        return report(simulation.judged(result))

    return seen


def _at_index(result: Any, index: int) -> Any:
    """Return ``result`` renumbered to its candidate's place in the round batch."""
    if getattr(result, "index", index) == index:
        return result
    if hasattr(result, "model_copy"):
        return result.model_copy(update={"index": index})
    return dataclasses.replace(result, index=index)


async def _launch_once(
    executor: AllocationExecutor,
    store: BatchStore,
    key: str,
    relaunch: int,
    indexes: list[int],
    candidates: list[list[float]],
    campaign: str,
    round_index: int,
    simulation: Simulation,
    on_result: OnResult | None,
    seconds_for: SecondsFor | None,
) -> tuple[list[Any], bool]:
    """Return the recorded results of batch ``key``, or run and record it; say which."""
    finished = store.find_batch(key)
    if finished is not None:
        return finished, True
    if seconds_for is not None:
        await executor.ensure_time(seconds_for(len(candidates)), unit=seconds_for(1))
    elif executor.allocation_lost:
        await executor.request_allocation()
    store.record_batch_launched(
        key,
        campaign=campaign,
        round_index=round_index,
        candidates=candidates,
        backend=executor.backend_kind,
        relaunch=relaunch,
    )
    tasks = [
        simulation.task_for(candidate, index=index, campaign=campaign, round_index=round_index)
        for index, candidate in zip(indexes, candidates, strict=True)
    ]
    prefix = f"{campaign}/{round_index}/{key[:16]}"
    # durable: the prefix names this batch in every run, so a continuation harvests
    # what a run that died left in the task ledger instead of running it again.
    ran = await executor.run_batch(
        tasks, key_prefix=prefix, on_result=_judging(on_result, simulation), durable=True
    )
    results = [simulation.judged(result) for result in ran]
    store.record_batch_results(key, results)
    return results, False
