"""The benchmark's yardsticks: plain Prefect flows doing the same rounds and simulations.

No gate, no fallback, no policy, no provenance, no checkpoint. Each simulation runs the
same ``awk`` objective on one candidate (at most ``concurrency`` at once, like the
``local`` site). Each flow appends one line per round to ``timings`` (epoch seconds):
``{"round", "started", "launched", "landed", "finished"}``, where ``launched`` ->
``landed`` is the batch (the simulations, the science).

- ``plain_rounds``: random candidates, one Prefect task per round (the simplest flow).
- ``plain_planned_rounds``: like for like with ``campaign_flow``: the same planner (the
  project's ``GaussianProcess``, one proposal per round with the seed the campaign's
  planner uses), the same task layout (three tasks a round: the proposal, the batch,
  learning from it; no cache, no persisted result, as ours) and the same way of
  waiting for a child's exit (``tasks._child_watcher``: a pidfd, not a thread per
  child; Python 3.12's default), so the batches cost the same on both sides.

Served by ``benchmarks/campaign.py`` with plain Prefect ``Runner``\\ s.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

AWK_OBJECTIVE = [
    "awk",
    "-F",
    "[][,]",
    '{s=0; for(i=2;i<NF;i++) s+=($i-0.3)^2; printf "{\\"value\\": %.9f}\\n", s}',
]


async def simulate(candidate: list[float], slots: asyncio.Semaphore) -> float:
    async with slots:
        process = await asyncio.create_subprocess_exec(
            *AWK_OBJECTIVE,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await process.communicate(json.dumps(candidate).encode() + b"\n")
    return float(json.loads(out)["value"])


async def run_batch(candidates: list[list[float]], concurrency: int) -> list[float]:
    slots = asyncio.Semaphore(concurrency)
    return list(await asyncio.gather(*(simulate(c, slots) for c in candidates)))


def record(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as out:
        out.write(json.dumps(row) + "\n")


@task(persist_result=False)
async def one_round(
    index: int, batch: int, dims: int, seed: int, concurrency: int
) -> tuple[float, float, float]:
    generator = random.Random(seed * 1000 + index)
    candidates = [[generator.random() for _ in range(dims)] for _ in range(batch)]
    launched = time.time()
    values = await run_batch(candidates, concurrency)
    return min(values), launched, time.time()


@flow(name="plain-rounds", persist_result=False)
async def plain_rounds(
    timings: str, rounds: int, batch: int, dims: int = 3, seed: int = 11, concurrency: int = 32
) -> float:
    best = float("inf")
    for index in range(rounds):
        started = time.time()
        value, launched, landed = await one_round(index, batch, dims, seed, concurrency)
        best = min(best, value)
        row = {"round": index, "started": started, "launched": launched, "landed": landed}
        record(Path(timings), {**row, "finished": time.time()})
    return best


def _step(name: str) -> Any:
    return task(name=name, cache_policy=NO_CACHE, persist_result=False, retries=0)


@flow(name="plain-planned-rounds", persist_result=False)
async def plain_planned_rounds(
    timings: str, rounds: int, batch: int, dims: int = 3, seed: int = 11, concurrency: int = 32
) -> float:
    from flows._engine._campaign_state import derive_seed
    from tasks import Bounds, GaussianProcess, _child_watcher

    _child_watcher.install()
    surrogate = GaussianProcess()
    bounds = Bounds(lower=[0.0] * dims, upper=[1.0] * dims)
    stamps: dict[str, float] = {}

    async def propose(index: int) -> list[list[float]]:
        return surrogate.propose(batch, bounds, derive_seed(seed, index, 0))

    async def simulate_batch(candidates: list[list[float]]) -> list[float]:
        stamps["launched"] = time.time()
        values = await run_batch(candidates, concurrency)
        stamps["landed"] = time.time()
        return values

    async def learn(candidates: list[list[float]], values: list[float]) -> None:
        surrogate.assimilate(candidates, values)

    for index in range(rounds):
        started = time.time()
        candidates = await _step(f"gate round {index}")(propose)(index)
        values = await _step(f"launch round {index}")(simulate_batch)(candidates)
        await _step(f"assimilate round {index}")(learn)(candidates, values)
        row = {"round": index, "started": started, **stamps}
        record(Path(timings), {**row, "finished": time.time()})
    best = surrogate.best_value
    return float("inf") if best is None else best
