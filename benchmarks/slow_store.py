"""A batch of 64 tasks against a slow store: are launches held up by the writes? (issue 46)

One real local executor (``site-configs/local.toml``, ``--width`` tasks in flight), 64
executable tasks that print their start time and sleep ``--task-seconds``, and one
store write per task result, made slow on purpose: a benchmark-only wrapper around a
real ``ProvenanceStore`` sleeps ``--write-seconds`` (200 ms) before each write.
Two sides, each in its own process, alternating, ``--reps`` times:

- ``loop``: the write is called inside the coroutine that took the result, as the
  engine called its store before ``StoreThread`` (and as the code ``--before REF``
  names still does). With ``--before`` this side runs that version's code.
- ``thread``: the write is queued to the store's one worker thread
  (``flows._engine._store_thread.StoreThread.later``, what the run does with the
  allocation watch's records); the run ends when every write is done.

Printed per side, medians: when the last of the 64 tasks started (from the first
start), how many tasks started while a write was in progress, the batch's wall time
and the whole run's (the batch, then the writes still queued). The load average is
printed before and after.

    python benchmarks/slow_store.py [--reps N] [--before REF|DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TASKS = 64


class SlowStore:
    """A real store whose ``record_event`` sleeps first (benchmark-only); writes are timed."""

    def __init__(self, store: Any, seconds: float) -> None:
        self.store = store
        self.seconds = seconds
        self.writes: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def record_event(self, *args: Any, **kwargs: Any) -> None:
        began = time.time()
        time.sleep(self.seconds)
        self.store.record_event(*args, **kwargs)
        with self._lock:
            self.writes.append((began, time.time()))


async def one_side(side: str, width: int, task_seconds: float, write_seconds: float) -> dict:
    """Run the batch once with the writes on the loop or in the store's thread."""
    from flows._provenance import ProvenanceStore
    from tasks import AllocationExecutor, ExecutableTask, load_site

    folder = Path(tempfile.mkdtemp(prefix="slow-store-"))
    os.chdir(folder)  # asyncflow's session folders land here
    site = load_site(REPO / "site-configs" / "local.toml").model_copy(
        update={"max_concurrency": width}
    )
    store = ProvenanceStore.open(folder / "db")
    store.ensure_campaign("bench", spec={}, site="local", seed=1, code_version="bench")
    slow = SlowStore(store, write_seconds)
    script = f"date +%s.%N; sleep {task_seconds}"
    tasks = [ExecutableTask(argv=["sh", "-c", script]) for _ in range(TASKS)]
    async with contextlib.AsyncExitStack() as stack:
        writes = None
        if side == "thread":
            from flows._engine._store_thread import StoreThread

            writes = await stack.enter_async_context(StoreThread(store))
        executor = await stack.enter_async_context(
            AllocationExecutor.from_site(site, work_dir=str(folder))
        )

        def on_result(result: Any) -> None:
            details = {"status": result.status}
            if writes is None:
                slow.record_event("bench", "task_result", details=details)
            else:
                writes.later(slow.record_event, "bench", "task_result", details=details)

        began = time.time()
        results = await executor.run_batch(tasks, key_prefix="bench/0/b", on_result=on_result)
        batch = time.time() - began
    total = time.time() - began  # the thread side's queued writes are done here
    store.close()
    starts = sorted(float(r.value) for r in results if r.status == "done")
    if len(starts) != TASKS or len(slow.writes) != TASKS:
        raise SystemExit(f"{side}: {len(starts)} tasks done, {len(slow.writes)} writes")
    during = sum(1 for s in starts if any(a < s < b for a, b in slow.writes))
    return {
        "all_started": starts[-1] - starts[0],
        "started_during_writes": during,
        "batch": batch,
        "total": total,
    }


def run_child(side: str, code: Path | None, args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    command = [sys.executable, str(Path(__file__).resolve()), "--side", side]
    command += ["--width", str(args.width), "--task-seconds", str(args.task_seconds)]
    command += ["--write-seconds", str(args.write_seconds)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"side {side} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--width", type=int, default=8, help="tasks in flight at once")
    parser.add_argument("--task-seconds", type=float, default=0.1)
    parser.add_argument("--write-seconds", type=float, default=0.2)
    parser.add_argument("--before", help="run the 'loop' side with this ref's or folder's code")
    parser.add_argument("--side", choices=("loop", "thread"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        figures = asyncio.run(
            one_side(args.side, args.width, args.task_seconds, args.write_seconds)
        )
        print(json.dumps(figures))
        return 0
    sys.path.insert(0, str(HERE))
    from _before import checkout, describe

    with contextlib.ExitStack() as stack:
        before = stack.enter_context(checkout(args.before)) if args.before else None
        print(f"load average before: {os.getloadavg()}")
        print(
            f"{TASKS} tasks of {args.task_seconds} s, {args.width} in flight, one "
            f"{args.write_seconds} s store write per result ({TASKS * args.write_seconds:.1f} s "
            "of writes)"
        )
        if args.before:
            print(f"loop side: {describe(args.before)}; thread side: this checkout")
        runs: dict[str, list[dict]] = {"loop": [], "thread": []}
        for _ in range(args.reps):
            for side in ("loop", "thread"):  # alternating
                runs[side].append(run_child(side, before if side == "loop" else None, args))
        print(f"load average after: {os.getloadavg()}")
    keys = ("all_started", "started_during_writes", "batch", "total")
    print(f"{'median of ' + str(args.reps):<28}{'loop':>12}{'thread':>12}{'loop/thread':>14}")
    for key in keys:
        loop = statistics.median(r[key] for r in runs["loop"])
        thread = statistics.median(r[key] for r in runs["thread"])
        ratio = f"{loop / thread:.1f}x" if thread else "-"
        unit = "" if key == "started_during_writes" else " s"
        print(f"{key + unit:<28}{loop:>12.2f}{thread:>12.2f}{ratio:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
