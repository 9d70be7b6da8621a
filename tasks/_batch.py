"""Simulation batches with idempotency keys: a batch is launched at most once.

A flow that resumes after an approval runs again from the top. ``launch_batch``
asks the ``BatchStore`` first: when the batch with the same key has finished
results, they are returned and nothing runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tasks._executor import AllocationExecutor, OnResult
from tasks._results import ExecutableTask, FunctionTask, TaskResult, TaskSpec

Candidate = Sequence[float]


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
    campaign: str, round_index: int, candidates: Sequence[Candidate], simulation_id: str
) -> str:
    """Return the idempotency key of a batch: sha256 over canonical JSON.

    Stable across processes and Python versions: numbers become floats (so
    ``1`` and ``1.0`` are the same candidate) and JSON is written with sorted
    keys and no whitespace.
    """
    document = {
        "campaign": campaign,
        "round": int(round_index),
        "simulation": simulation_id,
        "candidates": _canonical_candidates(candidates),
    }
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
    ) -> None:
        """Record that batch ``key`` was launched (idempotent)."""
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
    """

    id: str
    argv: tuple[str, ...] | None = None
    fn: Callable[[list[float]], Any] | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None
    timeout: float | None = None
    retries: int | None = None
    transient_exit_codes: frozenset[int] = field(default_factory=frozenset)

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


@dataclass(frozen=True)
class BatchOutcome:
    """The results of a batch and whether they were reused from the store."""

    key: str
    results: list[TaskResult]
    reused: bool


async def launch_batch(
    executor: AllocationExecutor,
    store: BatchStore,
    *,
    campaign: str,
    round_index: int,
    candidates: Sequence[Candidate],
    simulation: Simulation,
    on_result: OnResult | None = None,
) -> BatchOutcome:
    """Run one simulation per candidate, at most once per batch key.

    If ``store`` already holds the results of this batch (same campaign, round,
    candidates and simulation id) they are returned and nothing runs
    (``reused=True``). Otherwise the launch is recorded, the batch runs, and the
    results are recorded. Failed simulations are results, not exceptions.
    """
    canonical = _canonical_candidates(candidates)
    key = batch_key(campaign, round_index, canonical, simulation.id)
    finished = store.find_batch(key)
    if finished is not None:
        return BatchOutcome(key=key, results=finished, reused=True)
    store.record_batch_launched(
        key,
        campaign=campaign,
        round_index=round_index,
        candidates=canonical,
        backend=executor.backend_kind,
    )
    tasks = [
        simulation.task_for(candidate, index=i, campaign=campaign, round_index=round_index)
        for i, candidate in enumerate(canonical)
    ]
    results = await executor.run_batch(
        tasks, key_prefix=f"{campaign}/{round_index}/{key[:16]}", on_result=on_result
    )
    store.record_batch_results(key, results)
    return BatchOutcome(key=key, results=results, reused=False)
