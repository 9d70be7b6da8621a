"""Dask-on-Slurm figures, measured on a real single-node Slurm (22.05) in one run.

* per-task overhead: the executor on ``site-configs/slurm-local.toml`` against raw
  dask-jobqueue ``client.submit`` on the SAME allocation (same scheduler, same worker
  job), sides alternated, medians (target: executor <= 1.5x raw);
* ``sbatch`` -> first task running: from asking for the allocation to the first
  task's start on its worker (and, apart, sbatch -> the job RUNNING in squeue);
* from an allocation's end (``scancel``) to the next allocation's first task: the
  executor noticing the end (squeue every ``poll_seconds``), the next job starting,
  its worker connecting.

By default it starts a private Slurm under a temporary folder (as root; see
``tests/slurm/private_slurm.py``) and stops it at the end; ``--use-existing`` uses
the cluster ``SLURM_CONF`` names instead.

    python benchmarks/slurm.py [--quick] [--use-existing] [--concurrency N]

Measured here (2 cores shared with other work, load 4-5, Slurm 22.05, one 1-core job):
per-task 6.1 ms vs 4.4 ms raw = 1.40x at max_concurrency 16 (slurm-local's), 8.6 vs
5.6 ms = 1.53x at 256; sbatch -> first task 2.1-3.2 s (the worker's start); an
allocation's end -> noticed 0.8-1.4 s (squeue every 2 s) -> next first task 4.3-4.5 s.
With the task ledger (issue 43), --overhead-only on a quiet box (load 0.1-1.0), the
before side run as ``PYTHONPATH=<git archive of 690c82a> python benchmarks/slurm.py``,
alternated: executor/raw 1.00, 1.09, 1.02 before against 1.04, 0.97, 0.98 after (medians
1.02x and 0.98x: no growth) once started markers were journal lines (0bb8be8; with a file
per marker it was 1.16-1.23x); a simulation batch's durable tasks, whose result is
fsync'd, 1.44-1.65x raw (4.7-5.6 ms a task: ~1.5 ms paid once per simulation).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import inspect
import math
import operator
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _private_slurm() -> Any:
    """Import tests/slurm/private_slurm.py (the tests' cluster helper) by path."""
    path = ROOT / "tests" / "slurm" / "private_slurm.py"
    spec = importlib.util.spec_from_file_location("private_slurm", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["private_slurm"] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def slurm_scratch(prefix: str, *, use_existing: bool) -> Iterator[Path]:
    """Yield a scratch folder with ``SLURM_CONF`` naming a Slurm: a private one started here
    (stopped, and the folder removed, at the end) or, with ``use_existing``, the caller's.

    Prints why and exits 2 when neither is there.
    """
    slurm = _private_slurm()
    cluster = None
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        if use_existing:
            if "SLURM_CONF" not in os.environ:
                print("--use-existing needs SLURM_CONF")
                raise SystemExit(2)
        else:
            failure = slurm.ensure_slurm_installed()
            if failure is not None:
                print(f"cannot start a private Slurm here: {failure}")
                raise SystemExit(2)
            cluster = slurm.start_cluster(scratch / "slurm")
            os.environ["SLURM_CONF"] = str(cluster.conf)
        yield scratch
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def started_at(_: int) -> float:
    """Return when this task started on its worker (epoch seconds)."""
    return time.time()


async def per_task_overhead(work: Path, n: int, rounds: int, concurrency: int) -> dict[str, Any]:
    """Time ``n`` trivial tasks: executor vs raw client.submit on one allocation, alternating."""
    import distributed

    from tasks import AllocationExecutor, FunctionTask

    site = _private_slurm().slurm_local_site(max_concurrency=concurrency, retries=0)
    async with AllocationExecutor.from_site(site, work_dir=str(work)) as executor:
        # The benchmark reaches into the executor for its scheduler: the raw side must
        # submit to the very same scheduler and worker job.
        address = executor._parts.backend._client.scheduler.address  # type: ignore[union-attr]
        raw = await distributed.Client(address, asynchronous=True)
        try:
            # Warm up both sides: the worker connects, imports, caches functions.
            await executor.run_batch(
                [FunctionTask(operator.add, (i, 1)) for i in range(20)], key_prefix="warm/0"
            )
            await raw.gather([raw.submit(operator.add, i, 1, pure=False) for i in range(20)])
            ours: list[float] = []
            theirs: list[float] = []
            durable: list[float] = []
            # A simulation batch's tasks keep their results in the task ledger (issue 43);
            # an executor from before it has no such batches: only ours and raw then.
            keeps = "durable" in inspect.signature(executor.run_batch).parameters
            sides = ("ours", "raw", "durable") if keeps else ("ours", "raw")
            for r in range(rounds):
                for side in sides if r % 2 == 0 else tuple(reversed(sides)):
                    started = time.perf_counter()
                    if side in ("ours", "durable"):
                        extra = {"durable": True} if side == "durable" else {}
                        results = await executor.run_batch(
                            [FunctionTask(operator.add, (i, 1)) for i in range(n)],
                            key_prefix=f"bench-{side}/{r}",
                            **extra,
                        )
                        assert all(x.status == "done" for x in results)
                        took = (time.perf_counter() - started) / n
                        (ours if side == "ours" else durable).append(took)
                    else:
                        futures = [raw.submit(operator.add, i, 1, pure=False) for i in range(n)]
                        await raw.gather(futures)
                        theirs.append((time.perf_counter() - started) / n)
            job = executor.allocations[0].job_id
        finally:
            await raw.close()
    return {
        "tasks": n,
        "rounds": rounds,
        "job": job,
        "ours_ms": statistics.median(ours) * 1e3,
        "raw_ms": statistics.median(theirs) * 1e3,
        "ratio": statistics.median(ours) / statistics.median(theirs),
        "ratios": [o / t for o, t in zip(ours, theirs, strict=True)],
        "durable_ms": statistics.median(durable) * 1e3 if durable else None,
    }


async def sbatch_to_first_task(work: Path, repeats: int) -> dict[str, Any]:
    """Time from asking for an allocation to its first task running, ``repeats`` times."""
    from tasks import AllocationExecutor, FunctionTask

    site = _private_slurm().slurm_local_site()
    first: list[float] = []
    running: list[float] = []
    for i in range(repeats):
        asked = time.time()
        async with AllocationExecutor.from_site(site, work_dir=str(work / f"s{i}")) as ex:
            (result,) = await ex.run_batch([FunctionTask(started_at, (0,))], key_prefix="s/0")
            record = ex.allocations[0]
        first.append(result.value - asked)
        if record.started_at is not None:
            # Slurm's start time is whole seconds (truncated): against the request's own
            # whole second the difference is exact to 1 s and never negative.
            running.append(record.started_at - math.floor(asked))
    return {"first_task_s": first, "job_running_s": running}


async def end_to_next_first_task(work: Path, repeats: int) -> dict[str, Any]:
    """Time from an allocation's end (scancel) to the next allocation's first task."""
    from tasks import AllocationExecutor, FunctionTask

    site = _private_slurm().slurm_local_site()
    noticed: list[float] = []
    first: list[float] = []
    async with AllocationExecutor.from_site(site, work_dir=str(work / "next")) as ex:
        await ex.run_batch([FunctionTask(started_at, (0,))], key_prefix="n/warm")
        for i in range(repeats):
            job = ex.allocations[-1].job_id
            ended = time.time()
            await asyncio.to_thread(subprocess.run, ["scancel", job], check=True)
            while not ex.allocation_lost:  # noqa: ASYNC110  # the time to notice is measured
                await asyncio.sleep(0.05)
            noticed.append(time.time() - ended)
            await ex.request_allocation()
            (result,) = await ex.run_batch([FunctionTask(started_at, (0,))], key_prefix=f"n/{i}")
            first.append(result.value - ended)
    return {"noticed_s": noticed, "first_task_s": first, "poll_s": site.scheduler.poll_seconds}


def _fmt(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f})"
    )


async def main_async(args: argparse.Namespace) -> int:
    with slurm_scratch("unattended-bench-slurm-", use_existing=args.use_existing) as scratch:
        n, rounds, repeats = (100, 3, 2) if args.quick else (300, 7, 3)
        print(f"load average before: {os.getloadavg()[0]:.2f} (2-core machine)")
        overhead = await per_task_overhead(scratch / "overhead", n, rounds, args.concurrency)
        print(
            f"per-task, {overhead['tasks']} trivial tasks x {overhead['rounds']} rounds, "
            f"max_concurrency {args.concurrency}, on job "
            f"{overhead['job']}: executor {overhead['ours_ms']:.2f} ms, raw client.submit "
            f"{overhead['raw_ms']:.2f} ms -> {overhead['ratio']:.2f}x (target <= 1.5x); "
            f"per round {', '.join(f'{r:.2f}' for r in overhead['ratios'])}"
        )
        if overhead["durable_ms"] is not None:
            print(
                f"per-task, a simulation batch's (durable: started marker and result "
                f"written, fsync'd, in the task ledger): {overhead['durable_ms']:.2f} ms -> "
                f"{overhead['durable_ms'] / overhead['raw_ms']:.2f}x raw"
            )
        if args.overhead_only:
            print(f"load average after: {os.getloadavg()[0]:.2f}")
            return 0
        first = await sbatch_to_first_task(scratch / "first", repeats)
        # Slurm's start time has whole seconds: this one is only good to ~1 s.
        print(f"sbatch -> job RUNNING (whole seconds): {_fmt(first['job_running_s'])}")
        print(f"sbatch -> first task runs: {_fmt(first['first_task_s'])}")
        nxt = await end_to_next_first_task(scratch, repeats)
        every = f"squeue every {nxt['poll_s']:g} s"
        print(f"allocation end -> noticed ({every}): {_fmt(nxt['noticed_s'])}")
        print(f"allocation end -> next allocation's first task: {_fmt(nxt['first_task_s'])}")
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tasks and repeats")
    parser.add_argument(
        "--concurrency", type=int, default=256, help="the executor's max_concurrency"
    )
    parser.add_argument(
        "--use-existing", action="store_true", help="use the Slurm SLURM_CONF names"
    )
    parser.add_argument("--overhead-only", action="store_true", help="only the per-task overhead")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
