"""Dask workers as batch jobs through dask-jobqueue: the one module that knows its ways.

Written against dask-jobqueue 0.8-0.9 and distributed 2024-2026 (it sets
SpecCluster's private worker counter ``_i``); ``import_jobqueue`` warns about other
dask-jobqueue versions. What this module designs around (measured with a
private Slurm 22.05, see ``ARCHITECTURE.md``):

* Importing dask-jobqueue copies its ``jobqueue.yaml`` into ``~/.config/dask``
  (``dask.config.ensure_file``). The import here points that copy at a temporary
  folder, removed at once: nothing is written into the user's home.
* Without ``log_directory`` every job writes ``slurm-%j.out`` into the current
  directory. Logs go to the site's log folder (under the campaign directory), and
  each job starts there (``--chdir``).
* A worker job that ends (walltime, ``scancel``, node failure) is not replaced:
  Dask quietly reschedules its tasks and they wait for a worker that never comes.
  ``AllocationWatch`` (``tasks._allocations``) notices the job ended; the next
  allocation is ``WorkerJobs.submit``: ``scale(jobs=0)`` then ``scale(jobs=n)``.
* A job Slurm ended while its node lives on (``slurmd`` died: ``NODE_FAIL``) keeps
  its worker connected, running what it runs and taking new tasks, and
  ``scale(jobs=0)`` does not retire it (SpecCluster passes worker *names* where
  the scheduler's ``retire_workers`` reads addresses). ``WorkerJobs.submit``
  retires the old jobs' workers itself first: the process group of each
  executable they run is killed, then the scheduler removes and closes them, so a
  relaunched task never runs beside, or on, the copy the ended job was running.
* One job of several ending alone (its node failed) leaves the others running:
  ``WorkerJobs.retire_jobs`` retires its workers the same way, and Dask gives
  their tasks to the workers of the jobs still alive (``AllocationWatch.on_job_ended``).
* Jobs are submitted with ``--no-requeue``: after a node failure the campaign
  relaunches the interrupted tasks itself; a requeued job would keep its id and
  hide that it ended.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Collection
from pathlib import Path
from typing import Any

from policies import SiteInvalid
from tasks._executables import refuse_new_executables
from tasks._site import SiteConfig
from tasks._site_backends import DaskBackend
from tasks._site_slurm import sbatch_refusal

TESTED_JOBQUEUE = ("0.8", "0.9")
_CLUSTER_CLASSES = {
    "slurm": "SLURMCluster",
    "pbs": "PBSCluster",
    "sge": "SGECluster",
    "lsf": "LSFCluster",
}


def import_jobqueue() -> Any:
    """Import dask_jobqueue without letting it write ``~/.config/dask/jobqueue.yaml``."""
    loaded = sys.modules.get("dask_jobqueue")
    if loaded is not None:
        return loaded
    import dask.config

    saved = dask.config.PATH
    with tempfile.TemporaryDirectory(prefix="unattended-dask-config-") as scratch:
        # ensure_file() reads this module global at call time; DASK_CONFIG would
        # only count if set before dask itself was first imported.
        dask.config.PATH = scratch
        try:
            module = importlib.import_module("dask_jobqueue")
        finally:
            dask.config.PATH = saved
    version = getattr(module, "__version__", "?")
    if not str(version).startswith(TESTED_JOBQUEUE):
        warnings.warn(
            f"dask-jobqueue {version} is untested here (written against "
            f"{', '.join(TESTED_JOBQUEUE)}); worker jobs may not be tracked correctly",
            RuntimeWarning,
            stacklevel=2,
        )
    return module


def log_directory(site: SiteConfig, work_dir: str | os.PathLike[str]) -> Path:
    """Return where job scripts' output goes: the site's folder, relative to ``work_dir``."""
    configured = site.scheduler.log_directory
    folder = Path(configured) if configured else Path("slurm-logs")
    if not folder.is_absolute():
        folder = Path(work_dir) / folder
    folder.mkdir(parents=True, exist_ok=True)
    return folder.resolve()


def cluster_options(site: SiteConfig, spec: DaskBackend, logs: Path) -> dict[str, Any]:
    """Return every option of the jobqueue cluster, explicitly (no user config is read)."""
    assert spec.jobqueue is not None
    jobqueue = spec.jobqueue
    scheduler = site.scheduler
    directives = list(jobqueue.job_extra_directives)
    if jobqueue.system == "slurm":
        directives += ["--no-requeue", f"--chdir={logs}"]
        if scheduler.qos:
            directives.append(f"--qos={scheduler.qos}")
    listen = site.listen
    dashboard = f"[{listen}]:0" if ":" in listen else f"{listen}:0"
    scheduler_options: dict[str, Any] = {"dashboard_address": dashboard}
    if jobqueue.interface is None:
        # Without an interface the scheduler would listen on every address.
        scheduler_options["host"] = listen
    options: dict[str, Any] = {
        "cores": jobqueue.cores,
        "memory": jobqueue.memory,
        "processes": jobqueue.processes,
        "job_name": f"unattended-{site.name}",
        "job_extra_directives": directives,
        "job_script_prologue": list(scheduler.prologue),
        "log_directory": str(logs),
        "python": jobqueue.python or sys.executable,
        "scheduler_options": scheduler_options,
        "asynchronous": True,
    }
    if jobqueue.interface:
        options["interface"] = jobqueue.interface
    if scheduler.account:
        options["account"] = scheduler.account
    if scheduler.queue:
        options["queue"] = scheduler.queue
    if scheduler.walltime:
        options["walltime"] = scheduler.walltime
    return options


async def start_jobqueue_cluster(site: SiteConfig, spec: DaskBackend, logs: Path) -> Any:
    """Start the jobqueue cluster's scheduler (no jobs yet: ``submit_jobs`` starts them)."""
    assert spec.jobqueue is not None
    module = import_jobqueue()
    cluster_class = getattr(module, _CLUSTER_CLASSES[spec.jobqueue.system])
    return await cluster_class(**cluster_options(site, spec, logs))


def kill_task_groups(dask_worker: Any = None) -> int:
    """Kill the process group of every child of this process that leads its own; return how many.

    Runs on a Dask worker (Linux ``/proc``): executables run there in their own
    session (``run_executable_blocking``), a thread waiting for each, so neither
    cancelling the Dask task nor closing the worker stops them. The worker
    (``dask_worker``, passed by Dask's ``run``) is paused first: otherwise the
    thread freed by a killed executable starts the next task the worker holds,
    whose executable would outlive the worker's removal (seen on 3 nodes: a task
    completed there and again where Dask rescheduled it). A task already taken may
    still be spawning its executable, after the scan below: no executable starts here
    any more (``refuse_new_executables``; a full suite run saw it once with the pause alone).
    """
    if dask_worker is not None:
        from distributed.core import Status

        dask_worker.status = Status.paused  # starts no further task
        refuse_new_executables()
    me = os.getpid()
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parent, group = int(fields[1]), int(fields[2])
        if parent == me and group == int(entry):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
                killed += 1
    return killed


async def retire_on_scheduler(names: Collection[str], dask_scheduler: Any) -> list[str]:
    """Kill the executables of the workers named ``names``, then remove and close them.

    Runs on the scheduler (``run_function``). A job of several worker processes
    names them ``<name>-<k>``. A worker that cannot be reached is removed all the
    same. Returns the addresses removed.
    """
    from distributed.protocol.pickle import dumps

    wanted = set(names)
    addresses = [
        address
        for address, state in dask_scheduler.workers.items()
        if str(state.name) in wanted or str(state.name).rsplit("-", 1)[0] in wanted
    ]
    if not addresses:
        return []
    run = dumps(kill_task_groups)  # type: ignore[no-untyped-call]  # untyped upstream
    await dask_scheduler.broadcast(
        msg={"op": "run", "function": run, "wait": True},
        workers=addresses,
        on_error="ignore",
    )
    for address in addresses:
        await dask_scheduler.remove_worker(
            address, stimulus_id=f"unattended-retire-{time.time()}", close=True
        )
    return addresses


class WorkerJobs:
    """Start the jobs of one allocation after another on one jobqueue cluster.

    ``submit`` is ``scale(jobs=0)``, awaited (the old jobs are forgotten, any still
    queued or running cancelled), then ``scale(jobs=n)``, awaited (each new job
    submitted). SpecCluster names workers from a counter it advances only on a
    clash with the *current* spec, so after ``scale(0)`` it would reuse
    ``SLURMCluster-0``; its lost-worker timer (15 s after the old worker left) then
    found a worker of that name not yet connected and cancelled the NEW job. The
    counter is moved past every name ever used instead.
    """

    def __init__(self, cluster: Any, jobs: int, *, site: str = "the site") -> None:
        self.cluster = cluster
        self.jobs = jobs
        self.site = site
        self._used = 0

    async def submit(self) -> list[str]:
        """Replace the cluster's jobs by ``jobs`` new ones; return their batch job ids.

        The old jobs' workers are retired first (see the module docstring): a job
        Slurm ended on a node that lives on must not run the relaunched tasks.
        """
        cluster = self.cluster
        if cluster.worker_spec:
            await self._retire(list(cluster.worker_spec))
        cluster.scale(jobs=0)
        await cluster
        cluster._i = max(int(getattr(cluster, "_i", 0)), self._used)  # see the class docstring
        cluster.scale(jobs=self.jobs)
        try:
            await cluster
        except Exception as exc:
            refused = sbatch_refusal(exc)
            if refused is None:
                raise
            field, words = refused
            raise SiteInvalid(
                f"{self.site}: field '{field}': Slurm refused the allocation's job: {words}",
                details={"file": self.site, "field": field, "slurm": words},
            ) from None
        names = list(cluster.worker_spec)
        self._used = int(getattr(cluster, "_i", 0)) + len(names)
        ids = [getattr(cluster.workers.get(name), "job_id", None) for name in names]
        missing = [name for name, job_id in zip(names, ids, strict=True) if not job_id]
        if missing:
            raise RuntimeError(f"jobqueue submitted no job for workers {', '.join(missing)}")
        return [str(job_id) for job_id in ids]

    async def retire_jobs(self, records: Collection[Any]) -> None:
        """Retire the workers of these jobs (``AllocationRecord``s) that ended among peers.

        Their tasks go back to Dask, which runs them on the jobs still alive: the
        relaunch stays in the same allocation.
        """
        ended = {str(record.job_id) for record in records}
        names = [
            name
            for name, job in self.cluster.workers.items()
            if str(getattr(job, "job_id", None)) in ended
        ]
        if names:
            await self._retire(names)

    async def _retire(self, names: list[str]) -> None:
        from distributed.protocol.pickle import dumps

        function = dumps(retire_on_scheduler)  # type: ignore[no-untyped-call]  # untyped upstream
        args = dumps((names,))  # type: ignore[no-untyped-call]  # untyped upstream
        reply = await self.cluster.scheduler_comm.run_function(
            function=function, args=args, wait=True
        )
        if not isinstance(reply, dict) or reply.get("status") != "OK":
            raise RuntimeError(f"retiring the workers {', '.join(names)} failed: {reply!r}")
