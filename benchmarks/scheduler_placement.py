"""Where the Dask scheduler should live on a Slurm site: measured on a private Slurm (issue 43).

With dask-jobqueue the scheduler lives in the campaign's flow-run process on the login
node. Three figures decide whether it should move into the allocation:

1. **The flow-run process SIGKILLed mid-batch** (today: the scheduler dies with it), one
   function task and one executable task of a durable batch in flight on the worker
   job (``AllocationExecutor``, the real path) and a third queued behind them: how long
   the worker job lives on, whether each task's result reaches the task ledger
   (``<work>/task-results``), and whether the queued one starts.
2. **What a scheduler in the allocation costs**: a ``dask scheduler`` in its own Slurm
   job and a worker job submitted with it (sbatch -> scheduler reachable -> worker
   connected -> first task), against today's in-process ``SLURMCluster`` (scheduler
   up -> worker connected -> first task), sides alternated, medians.
3. **What it buys**: the same SIGKILL of the client process with the scheduler in its
   own job: does the worker live on, and does the in-flight function task's result
   (written by ``tasks._dispatch._call_recorded``, the wrapper every durable function
   task runs in) reach the ledger?

It starts a private Slurm under a temporary folder (as root; ``tests/slurm/private_slurm.py``)
and stops it at the end; ``--use-existing`` uses the cluster ``SLURM_CONF`` names.

    python benchmarks/scheduler_placement.py [--quick] [--use-existing] [--task-seconds S]

The figures and the decision are in docs/reliability-operations.md ("What survives a
login-node death").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from slurm import _private_slurm, slurm_scratch  # benchmarks/slurm.py: the private cluster

TASK_SECONDS = 8.0  # an in-flight task's length (--task-seconds): killed a quarter in
POLL = 0.1
WORKER_FLAGS = ["--nthreads", "1", "--memory-limit", "1GB", "--nanny", "--death-timeout", "60"]


def _site(**changes: Any) -> Any:
    return _private_slurm().slurm_local_site(retries=0, **changes)


def _job_state(job: str) -> str:
    done = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else "GONE"


def _wait(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(POLL)
    raise TimeoutError(f"timed out waiting for {what}")


def _watch_after_kill(
    ledger: Path, jobs: list[str], digests: dict[str, str], killed_at: float, horizon: float
) -> dict[str, Any]:
    """Poll the worker job(s) and the ledger's results after a kill, until ``horizon`` s."""
    job_end: float | None = None
    results: dict[str, Any] = {}
    while time.time() - killed_at < horizon:
        for name, digest in digests.items():
            path = ledger / f"{digest}.result"
            if name not in results and path.exists():
                results[name] = (time.time() - killed_at, json.loads(path.read_text()))
        if job_end is None and all(_job_state(job) in ("", "GONE") for job in jobs):
            job_end = time.time() - killed_at
        if job_end is not None and len(results) == len(digests):
            break
        time.sleep(POLL)
    return {"job_end": job_end, "results": results}


# --- 1. today: the scheduler in the flow-run process --------------------------------------


async def _child_batch(work: str, seconds: float) -> None:
    """The flow-run process: a durable batch of one function and one executable task."""
    from tasks import AllocationExecutor, ExecutableTask, FunctionTask

    site = _site(backend__jobqueue__cores=2, max_concurrency=4)
    code = f"import time; time.sleep({seconds}); print({seconds})"
    async with AllocationExecutor.from_site(site, work_dir=work) as executor:
        await executor.run_batch(
            [
                FunctionTask(time.sleep, (seconds,)),
                ExecutableTask([sys.executable, "-c", code]),
                FunctionTask(time.sleep, (seconds,)),  # queued: the job has two cores
            ],
            key_prefix="placement/0",
            durable=True,
        )


def kill_in_process_scheduler(work: Path, seconds: float) -> dict[str, Any]:
    """SIGKILL the process holding the scheduler while both tasks run; watch what follows."""
    from tasks._task_ledger import RESULTS_FOLDER, key_digest, started_markers

    work.mkdir(parents=True)
    ledger = work / RESULTS_FOLDER
    child = subprocess.Popen(
        [sys.executable, __file__, "--child-batch", str(work), str(seconds)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    digests = {"function": key_digest("placement/0/0"), "executable": key_digest("placement/0/1")}
    try:
        markers = _wait(
            lambda: set(digests.values()) <= set(started_markers(ledger)),
            240,
            "both tasks to start on the worker job",
        )
        assert markers
        found = started_markers(ledger)
        started = {name: found[d] for name, d in digests.items()}
        time.sleep(seconds / 4)  # both well under way
        child.send_signal(signal.SIGKILL)
        killed_at = time.time()
        child.wait()
        jobs = sorted({str(m["job_id"]) for m in started.values()})
        watched = _watch_after_kill(ledger, jobs, digests, killed_at, seconds + 90)
    finally:
        if child.poll() is None:
            child.kill()
    watched["due"] = {
        name: marker["started_at"] + seconds - killed_at for name, marker in started.items()
    }
    watched["jobs"] = jobs
    watched["queued_started"] = key_digest("placement/0/2") in started_markers(ledger)
    return watched


# --- 2. cost: a scheduler in its own Slurm job, against today's ---------------------------


def _first_task() -> float:
    return time.time()


async def in_process_start(work: Path) -> dict[str, float]:
    """Today: SLURMCluster's scheduler in this process, one worker job, the first task."""
    import distributed

    from tasks._jobqueue import start_jobqueue_cluster  # the options today's executor uses

    site = _site()
    logs = work / "logs"
    logs.mkdir(parents=True)
    t0 = time.time()
    cluster = await start_jobqueue_cluster(site, site.backend, logs)
    up = time.time()
    try:
        cluster.scale(jobs=1)
        client = await distributed.Client(cluster, asynchronous=True)
        try:
            await client.wait_for_workers(1)
            connected = time.time()
            first = await client.submit(_first_task, pure=False)
        finally:
            await client.close()
    finally:
        await cluster.close()
    return {"scheduler": up - t0, "worker": connected - t0, "first_task": first - t0}


def _sbatch(script: str, work: Path, name: str) -> str:
    path = work / f"{name}.sh"
    path.write_text(script)
    done = subprocess.run(
        ["sbatch", "--parsable", str(path)], capture_output=True, text=True, check=True
    )
    return done.stdout.strip().split(";")[0]


def _job(name: str, work: Path, command: str) -> str:
    return (
        f"#!/bin/bash\n#SBATCH -J {name}\n#SBATCH -p debug\n#SBATCH -n 1\n#SBATCH -c 1\n"
        f"#SBATCH --mem=1G\n#SBATCH -t 00:10:00\n#SBATCH --no-requeue\n"
        f"#SBATCH --chdir={work}\n#SBATCH -o {work}/{name}-%j.out\n"
        f"export OMP_NUM_THREADS=1\nexec {command}\n"
    )


def submit_scheduler_job(work: Path) -> tuple[str, str, Path]:
    """sbatch a ``dask scheduler`` and a worker job naming its scheduler file at once."""
    work.mkdir(parents=True, exist_ok=True)
    file = work / "scheduler.json"
    python = sys.executable
    scheduler = _sbatch(
        _job(
            "placement-scheduler",
            work,
            f"{python} -m distributed.cli.dask_scheduler --host 127.0.0.1 --port 0 "
            f"--dashboard-address 127.0.0.1:0 --scheduler-file {file}",
        ),
        work,
        "scheduler",
    )
    worker = _sbatch(
        _job(
            "placement-worker",
            work,
            f"{python} -m distributed.cli.dask_worker --scheduler-file {file} "
            f"--name w-{scheduler} {' '.join(WORKER_FLAGS)}",
        ),
        work,
        "worker",
    )
    return scheduler, worker, file


async def scheduler_job_start(work: Path) -> dict[str, float]:
    """A scheduler in its own job: sbatch -> reachable -> worker connected -> first task."""
    import distributed

    t0 = time.time()
    scheduler, worker, file = submit_scheduler_job(work)
    try:
        await asyncio.to_thread(_wait, file.exists, 240, "the scheduler file")
        address = json.loads(file.read_text())["address"]
        client = await distributed.Client(address, asynchronous=True, timeout=60)
        reachable = time.time()
        try:
            await client.wait_for_workers(1)
            connected = time.time()
            first = await client.submit(_first_task, pure=False)
        finally:
            await client.close()
    finally:
        await asyncio.to_thread(subprocess.run, ["scancel", worker, scheduler], check=False)
    return {"scheduler": reachable - t0, "worker": connected - t0, "first_task": first - t0}


# --- 3. what it buys: the client dies, the scheduler in the allocation lives on -----------


async def _child_client(address: str, record: list[Any], seconds: float) -> None:
    """The flow-run process with the scheduler elsewhere: one recorded function task."""
    import distributed

    from tasks._dispatch import _call_recorded

    client = await distributed.Client(address, asynchronous=True)
    future = client.submit(_call_recorded, time.sleep, (seconds,), {}, tuple(record), pure=False)
    await future  # killed before it returns


def kill_client_of_scheduler_job(work: Path, seconds: float) -> dict[str, Any]:
    """SIGKILL the client process while its function task runs; the scheduler is in a job."""
    from tasks._task_ledger import RESULTS_FOLDER, TaskLedger, started_markers

    scheduler, worker, file = submit_scheduler_job(work)
    ledger = TaskLedger(work / RESULTS_FOLDER, "placement-token")
    ledger.fence()
    ref = ledger.ref("placement/1/0", 1)
    record = [ref.folder, ref.digest, ref.token, ref.attempt, ref.key, ref.durable]
    try:
        _wait(file.exists, 240, "the scheduler file")
        address = json.loads(file.read_text())["address"]
        child = subprocess.Popen(
            [sys.executable, __file__, "--child-client", address, json.dumps(record), str(seconds)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait(
                lambda: ref.digest in started_markers(ledger.folder),
                240,
                "the function task to start on the worker job",
            )
            started = started_markers(ledger.folder)[ref.digest]
            time.sleep(seconds / 4)
            child.send_signal(signal.SIGKILL)
            killed_at = time.time()
            child.wait()
        finally:
            if child.poll() is None:
                child.kill()
        watched = _watch_after_kill(
            ledger.folder, [worker], {"function": ref.digest}, killed_at, seconds + 30
        )
        watched["due"] = {"function": started["started_at"] + seconds - killed_at}
        watched["alive_after"] = {job: _job_state(job) for job in (scheduler, worker)}
    finally:
        subprocess.run(["scancel", worker, scheduler], check=False)
    return watched


# --- the report ---------------------------------------------------------------------------


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f})"


def _said(watched: dict[str, Any], name: str) -> str:
    found = watched["results"].get(name)
    due = watched["due"][name]
    if found is None:
        return f"no result in the ledger (it was due {due:+.1f} s after the kill)"
    at, result = found
    what = f"exit {result['exit_code']}" if "exit_code" in result else result.get("kind")
    return f"result in the ledger {at:+.1f} s after the kill (due {due:+.1f} s, {what})"


def _load() -> str:
    return f"load average {os.getloadavg()[0]:.2f} (2-core machine)"


async def main_async(args: argparse.Namespace) -> int:
    kills, repeats = (1, 2) if args.quick else (2, 4)
    seconds = args.task_seconds
    with slurm_scratch("unattended-bench-placement-", use_existing=args.use_existing) as scratch:
        print(f"before: {_load()}")
        for k in range(kills):
            watched = await asyncio.to_thread(
                kill_in_process_scheduler, scratch / f"kill-{k}", seconds
            )
            end = watched["job_end"]
            lived = f"{end:.1f} s" if end is not None else f"> {seconds + 90:.0f} s"
            print(
                f"1. scheduler in the flow-run process, SIGKILLed with {seconds:g} s tasks "
                f"in flight: worker job {','.join(watched['jobs'])} ended {lived} after; "
                f"function task: {_said(watched, 'function')}; executable task: "
                f"{_said(watched, 'executable')}; a queued task started after the kill: "
                f"{'yes' if watched['queued_started'] else 'no'}; {_load()}"
            )
        sides: dict[str, list[dict[str, float]]] = {"in-process": [], "scheduler job": []}
        for r in range(repeats):
            order = (
                ("in-process", "scheduler job") if r % 2 == 0 else ("scheduler job", "in-process")
            )
            for side in order:
                work = scratch / f"start-{side.replace(' ', '-')}-{r}"
                work.mkdir(parents=True)
                run = in_process_start if side == "in-process" else scheduler_job_start
                sides[side].append(await run(work))
        for side, runs in sides.items():
            print(
                f"2. {side}: scheduler reachable {_median([x['scheduler'] for x in runs])}; "
                f"worker connected {_median([x['worker'] for x in runs])}; first task "
                f"{_median([x['first_task'] for x in runs])} ({len(runs)} runs, alternated)"
            )
        ours = statistics.median(x["first_task"] for x in sides["scheduler job"])
        today = statistics.median(x["first_task"] for x in sides["in-process"])
        print(
            f"2. start -> first task: scheduler job {ours:.2f} s vs in-process {today:.2f} s "
            f"= {ours / today:.2f}x, +{ours - today:.2f} s; {_load()}"
        )
        for k in range(kills):
            watched = await asyncio.to_thread(
                kill_client_of_scheduler_job, scratch / f"buys-{k}", seconds
            )
            print(
                f"3. scheduler in its own job, the client SIGKILLed with a {seconds:g} s "
                f"function task in flight: function task: {_said(watched, 'function')}; "
                f"jobs still there after: {watched['alive_after']}; {_load()}"
            )
        print(f"after: {_load()}")
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-batch":
        asyncio.run(_child_batch(sys.argv[2], float(sys.argv[3])))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--child-client":
        asyncio.run(_child_client(sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4])))
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one kill each, two start-ups each")
    parser.add_argument(
        "--use-existing", action="store_true", help="use the Slurm SLURM_CONF names"
    )
    parser.add_argument(
        "--task-seconds", type=float, default=TASK_SECONDS, help="an in-flight task's length"
    )
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
