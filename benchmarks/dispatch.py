"""Dispatch throughput of the AllocationExecutor against the plain ways of doing the same work.

Measured side by side in one run, like with like, the sides alternated repetition by
repetition and reported as medians with the load average:

* through asyncflow: the executor with ``dispatch = "engine"`` (our asyncflow path) vs
  plain asyncflow on the same thread pool, 2,000 trivial function tasks (asyncflow's
  per-task bookkeeping grows ~N², so 10k would take minutes; target: within 1.5x);
* the direct pool path (``dispatch = "direct"``, the default for local function tasks,
  which skips asyncflow) vs plain ``concurrent.futures`` on the same pool, 10,000
  tasks, thread and process pools (target: within 4x);
* for information, what skipping asyncflow buys: plain asyncflow / the direct path
  at 2,000 tasks (two different paths, so not a target);
* peak RSS of a process running the 10k batch through the executor (target < 300 MB);
* 2,000 ``/bin/true`` executables under ``ulimit -n 1024`` (target: zero failures);
* 1,000 tasks on a 2-worker Dask LocalCluster: executor vs raw ``client.submit``
  (target: within 2.5x).

    python benchmarks/dispatch.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

WORKERS = 4


def trivial(i: int) -> int:
    return i


def site(kind: str, dispatch: str = "direct", **extra: Any) -> Any:
    from tasks import SiteConfig

    backend: dict[str, Any]
    if kind == "dask":
        backend = {"kind": "dask", "scheduler_address": extra.pop("address")}
    else:
        backend = {"kind": "local", "executor": kind, "max_workers": WORKERS, "dispatch": dispatch}
    return SiteConfig.model_validate(
        {
            "name": f"bench-{kind}",
            "backend": backend,
            "cost": {"node_hours_per_simulation": 1.0},
            "max_concurrency": extra.pop("max_concurrency", 256),
            "retries": 0,
        }
    )


async def executor_seconds(kind: str, n: int, dispatch: str = "direct") -> float:
    """Time ``n`` trivial tasks through ``AllocationExecutor.run_batch`` on a warm pool."""
    from tasks import AllocationExecutor, FunctionTask

    async with AllocationExecutor.from_site(site(kind, dispatch)) as executor:
        await executor.run_batch(
            [FunctionTask(trivial, (i,)) for i in range(WORKERS * 4)], key_prefix="warm"
        )
        tasks = [FunctionTask(trivial, (i,)) for i in range(n)]
        started = time.perf_counter()
        results = await executor.run_batch(tasks, key_prefix="bench/0/b")
        elapsed = time.perf_counter() - started
    assert all(r.status == "done" for r in results)
    return elapsed


async def asyncflow_seconds(n: int) -> float:
    """Time ``n`` trivial tasks submitted at once to a warmed plain asyncflow thread-pool engine."""
    from radical.asyncflow import LocalExecutionBackend, WorkflowEngine

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    backend = await LocalExecutionBackend(ThreadPoolExecutor(max_workers=WORKERS))
    engine = await WorkflowEngine.create(backend=backend)

    @engine.function_task
    async def trivial_task(i: int) -> int:
        return i

    # Warmed like the executor's side: the same number of tasks first, not timed.
    await asyncio.gather(*[trivial_task(i) for i in range(WORKERS * 4)])
    started = time.perf_counter()
    values = await asyncio.gather(*[trivial_task(i) for i in range(n)])
    elapsed = time.perf_counter() - started
    await engine.shutdown()
    loop = asyncio.get_running_loop()
    for sig, handler in saved.items():  # asyncflow leaves its handlers installed
        loop.remove_signal_handler(sig)
        signal.signal(sig, handler)
    assert values == list(range(n))
    return elapsed


def futures_seconds(pool: Executor, n: int) -> float:
    """Time ``n`` trivial tasks submitted to a warm ``concurrent.futures`` pool."""
    list(pool.map(trivial, range(WORKERS * 4)))
    started = time.perf_counter()
    futures = [pool.submit(trivial, i) for i in range(n)]
    values = [f.result() for f in futures]
    elapsed = time.perf_counter() - started
    assert values == list(range(n))
    return elapsed


def child(args: list[str]) -> None:
    """Run one measurement in this (fresh) process and print it as JSON."""
    what = args[0]
    if what == "rss":
        n = int(args[1])
        elapsed = asyncio.run(executor_seconds("thread", n))
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({"seconds": elapsed, "peak_mb": peak_kb / 1024}))
    elif what == "true":
        n = int(args[1])
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
        from tasks import AllocationExecutor, ExecutableTask

        async def run() -> tuple[float, int, int]:
            async with AllocationExecutor.from_site(site("thread", max_concurrency=2000)) as ex:
                started = time.perf_counter()
                results = await ex.run_batch(
                    [ExecutableTask(["/bin/true"]) for _ in range(n)], key_prefix="true"
                )
                return (
                    time.perf_counter() - started,
                    sum(r.status != "done" for r in results),
                    ex.executable_concurrency,
                )

        elapsed, failures, slots = asyncio.run(run())
        print(json.dumps({"seconds": elapsed, "failures": failures, "slots": slots}))


def in_child(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


async def dask_seconds(n: int, rounds: int = 2) -> tuple[float, float]:
    """Time the same ``n``-task batch through the executor and raw ``client.submit``.

    The two alternate ``rounds`` times on one cluster and the best of each is
    kept: on a small shared machine a single run swings by 50%.
    """
    import distributed

    from tasks import AllocationExecutor, FunctionTask

    ours: list[float] = []
    raw: list[float] = []
    async with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
        asynchronous=True,
    ) as cluster:
        for _ in range(rounds):
            async with distributed.Client(cluster, asynchronous=True) as client:
                keys = [f"raw-{uuid.uuid4().hex}" for _ in range(n)]
                started = time.perf_counter()
                futures = [client.submit(operator.add, i, 1, key=keys[i]) for i in range(n)]
                raw_values = await client.gather(futures)
                raw.append(time.perf_counter() - started)
            assert raw_values == [i + 1 for i in range(n)]
            bench_site = site("dask", address=cluster.scheduler_address)
            async with AllocationExecutor.from_site(bench_site) as executor:
                tasks = [FunctionTask(operator.add, (i, 1)) for i in range(n)]
                started = time.perf_counter()
                results = await executor.run_batch(tasks, key_prefix="dask")
                ours.append(time.perf_counter() - started)
            assert [r.value for r in results] == [i + 1 for i in range(n)]
    return min(ours), min(raw)


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller sizes (2k functions, 500 executables, 300 Dask tasks)",
    )
    parser.add_argument("--reps", type=int, default=3, help="repetitions per side")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    n_functions, n_engine, n_true, n_dask = (
        (2_000, 500, 500, 300) if args.quick else (10_000, 2_000, 2_000, 1_000)
    )
    reps = args.reps

    print(f"machine: {os.cpu_count()} CPUs; pools of {WORKERS} workers; load {load()}")
    engine_path: dict[str, list[float]] = {"ours": [], "raw": [], "direct": []}
    direct_path: dict[str, list[float]] = {
        k: [] for k in ("thread", "cf_thread", "process", "cf_process")
    }
    for rep in range(reps):  # alternate the order of the two sides each repetition
        first_ours = rep % 2 == 0
        for side in ("ours", "raw") if first_ours else ("raw", "ours"):
            if side == "ours":
                engine_path["ours"].append(
                    asyncio.run(executor_seconds("thread", n_engine, "engine"))
                )
            else:
                engine_path["raw"].append(asyncio.run(asyncflow_seconds(n_engine)))
        engine_path["direct"].append(asyncio.run(executor_seconds("thread", n_engine)))
        for kind, pool_type in (("thread", ThreadPoolExecutor), ("process", ProcessPoolExecutor)):
            for side in (kind, f"cf_{kind}") if first_ours else (f"cf_{kind}", kind):
                if side == kind:
                    direct_path[side].append(asyncio.run(executor_seconds(kind, n_functions)))
                else:
                    with pool_type(max_workers=WORKERS) as pool:
                        direct_path[side].append(futures_seconds(pool, n_functions))

    med = statistics.median
    print(
        f"\n1. through asyncflow, {n_engine} trivial function tasks, thread pool "
        f"(median of {reps}, alternated):"
    )
    for label, key in (("executor, dispatch=engine", "ours"), ("plain asyncflow", "raw")):
        seconds = med(engine_path[key])
        print(f"  {label:34s} {seconds:8.3f} s  {n_engine / seconds:10.0f}/s")
    ratio = med(engine_path["ours"]) / med(engine_path["raw"])
    print(
        f"  executor (engine) / plain asyncflow    {ratio:6.2f}x  target <= 1.5x  "
        f"{verdict(ratio <= 1.5)}"
    )

    print(
        f"\n2. the direct pool path, {n_functions} trivial function tasks "
        f"(median of {reps}, alternated):"
    )
    for label, key in (
        ("executor, dispatch=direct, threads", "thread"),
        ("concurrent.futures thread pool", "cf_thread"),
        ("executor, dispatch=direct, processes", "process"),
        ("concurrent.futures process pool", "cf_process"),
    ):
        seconds = med(direct_path[key])
        print(f"  {label:38s} {seconds:8.3f} s  {n_functions / seconds:10.0f}/s")
    for kind in ("thread", "process"):
        ratio = med(direct_path[kind]) / med(direct_path[f"cf_{kind}"])
        print(
            f"  executor / concurrent.futures ({kind:7s}) {ratio:6.2f}x  target <= 4x   "
            f"{verdict(ratio <= 4)}"
        )

    bypass = med(engine_path["raw"]) / med(engine_path["direct"])
    print(
        f"\n3. what skipping asyncflow buys ({n_engine} tasks, two different paths, no target): "
        f"plain asyncflow {med(engine_path['raw']):.3f} s / direct path "
        f"{med(engine_path['direct']):.3f} s = {bypass:.1f}x"
    )

    rss = in_child("rss", str(n_functions))
    print(
        f"\npeak RSS of a process running {n_functions} tasks through the executor: "
        f"{rss['peak_mb']:.0f} MB  target < 300 MB   {verdict(rss['peak_mb'] < 300)}"
    )

    true = in_child("true", str(n_true))
    print(
        f"\n{n_true} /bin/true under ulimit -n 1024: {true['failures']} failures, "
        f"{true['seconds']:.2f} s ({n_true / true['seconds']:.0f}/s), {true['slots']} at once   "
        f"{verdict(true['failures'] == 0)}"
    )

    ours_dask, raw_dask = asyncio.run(dask_seconds(n_dask))
    ratio = ours_dask / raw_dask
    print(
        f"\n{n_dask} tasks on a 2-worker Dask LocalCluster: executor {ours_dask:.2f} s, "
        f"raw client.submit {raw_dask:.2f} s, ratio {ratio:.2f}x  target <= 2.5x   "
        f"{verdict(ratio <= 2.5)}"
    )
    print(f"\nload average (1, 5, 15 min) at the end: {load()}")


if __name__ == "__main__":
    main()
