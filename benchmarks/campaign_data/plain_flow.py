"""The benchmark's yardstick: a plain Prefect flow doing the same rounds and simulations.

No gate, no policy, no provenance, no surrogate: each round draws ``batch`` random
candidates in the bounds and runs the same ``awk`` objective on each (at most
``concurrency`` at once, like the ``local`` site), as one Prefect task per round.
It appends ``{"round", "started", "finished"}`` to ``timings`` (epoch seconds).
Served by ``benchmarks/campaign.py`` with a plain Prefect ``Runner``.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

from prefect import flow, task

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


@task(persist_result=False)
async def one_round(index: int, batch: int, dims: int, seed: int, concurrency: int) -> float:
    generator = random.Random(seed * 1000 + index)
    candidates = [[generator.random() for _ in range(dims)] for _ in range(batch)]
    slots = asyncio.Semaphore(concurrency)
    values = await asyncio.gather(*(simulate(c, slots) for c in candidates))
    return min(values)


def record(path: Path, line: str) -> None:
    with path.open("a") as out:
        out.write(line + "\n")


@flow(name="plain-rounds", persist_result=False)
async def plain_rounds(
    timings: str, rounds: int, batch: int, dims: int = 3, seed: int = 11, concurrency: int = 32
) -> float:
    best = float("inf")
    for index in range(rounds):
        started = time.time()
        best = min(best, await one_round(index, batch, dims, seed, concurrency))
        line = json.dumps({"round": index, "started": started, "finished": time.time()})
        record(Path(timings), line)
    return best
