"""RADICAL-Pilot on a Slurm cluster: the one module that knows its ways.

Written against radical.pilot 1.103 and psij-python 0.9 (``import_radical`` warns
about other versions). What this module designs around (measured on a private
Slurm 22.05, see ``ARCHITECTURE.md``):

* ``resource = "unattended.slurm"`` needs a resource config RADICAL-Pilot does not
  ship: ``write_resource_config`` writes one from the site's ``[scheduler]``
  (``slurm://localhost/`` job manager, ``SLURM`` resource manager, ``SRUN`` then
  ``FORK`` launch methods, the prologue and ``SLURM_CONF`` as pre-bootstrap lines,
  ``virtenv_mode = local``) under the campaign directory, and points
  ``RADICAL_CONFIG_USER_DIR`` there.
* RADICAL-Pilot writes its sessions into the current directory and its state
  under ``~/.radical``; PSI/J writes job scripts under ``~/.psij`` (a path it
  computes from ``HOME`` when imported, in RADICAL-Pilot's component processes).
  The session base and ``RADICAL_BASE`` go under the campaign directory, and
  ``HOME`` points there too while the session and its processes start.
* Its helper programs (``radical-pilot-bridge``, ...) are found on ``PATH``: this
  interpreter's ``bin`` is put first.
* ``radical.utils`` warns (and patches ``logging``'s locks) when imported after
  logging is configured, which the campaign always has: the warning is silenced.
* Prefect starts each flow run with multiprocessing's ``spawn`` method, which a
  spawned child keeps as its default; RADICAL-Pilot's proxy then fails to start its
  worker ("cannot pickle '_thread.lock' object"). The default is ``fork`` while a
  pilot lives in this process, and put back after.
* Each allocation is one pilot job (``PilotJobs``), watched by ``AllocationWatch``
  like dask-jobqueue's jobs. RADICAL-Pilot does not give its client the job id:
  ``squeue`` finds the job by its working directory, the pilot's sandbox. When the
  job ends RADICAL-Pilot fails (or cancels) the pilot's tasks; the dispatcher
  records those ``interrupted`` once ``squeue`` shows the job ended.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import multiprocessing
import os
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tasks._site import SiteConfig
from tasks._site_backends import RadicalPilotBackend
from tasks._slurm import SlurmQueryFailed, jobs_in_folder

TESTED_PILOT = ("1.103",)
#: The resource label whose config is written from the site's ``[scheduler]``.
SLURM_RESOURCE = "unattended.slurm"
_LOGGING_WARNING = "Import `radical` modules before `logging`"
#: How often ``PilotJobs`` asks ``squeue`` for a new pilot's job.
_FIND_POLL_SECONDS = 1.0
logger = logging.getLogger("unattended.tasks.radical")


def import_radical() -> Any:
    """Import RADICAL-Pilot and rhapsody's backend for it; return the backend class."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LOGGING_WARNING, category=UserWarning)
        pilot = importlib.import_module("radical.pilot")
        module = importlib.import_module("rhapsody.backends.execution.radical_pilot")
    version = str(getattr(pilot, "version", "?"))
    if not version.startswith(TESTED_PILOT):
        warnings.warn(
            f"radical.pilot {version} is untested here (written against {', '.join(TESTED_PILOT)})",
            RuntimeWarning,
            stacklevel=2,
        )
    return module.RadicalExecutionBackend


def resource_config(site: SiteConfig, spec: RadicalPilotBackend, root: Path) -> dict[str, Any]:
    """Return the RADICAL-Pilot resource config of a Slurm site (label ``unattended.slurm``)."""
    scheduler = site.scheduler
    bootstrap = [f"export PATH={Path(sys.executable).parent}:$PATH"]
    if os.environ.get("SLURM_CONF"):
        bootstrap.insert(0, f"export SLURM_CONF={os.environ['SLURM_CONF']}")
    bootstrap += list(scheduler.prologue)
    return {
        "slurm": {
            "description": f"Slurm, written by unattended for site {site.name}",
            "default_schema": "local",
            "schemas": {
                "local": {
                    "job_manager_endpoint": "slurm://localhost/",
                    "filesystem_endpoint": "file://localhost/",
                }
            },
            "default_queue": scheduler.queue or spec.queue or "",
            "resource_manager": "SLURM",
            "agent_config": "default",
            "agent_scheduler": "CONTINUOUS",
            "agent_spawner": "POPEN",
            "launch_methods": {"order": ["SRUN", "FORK"], "SRUN": {}, "FORK": {}},
            "pre_bootstrap_0": bootstrap,
            "default_remote_workdir": str(root / "sandbox"),
            "rp_version": "installed",
            "virtenv_mode": "local",
            "python_dist": "default",
            "cores_per_node": spec.cores_per_node or spec.cores,
            "gpus_per_node": spec.gpus,
        }
    }


def pilot_resources(site: SiteConfig, spec: RadicalPilotBackend) -> dict[str, Any]:
    """Return the pilot description: the backend's fields, else the site's ``[scheduler]``."""
    resources: dict[str, Any] = {
        "resource": spec.resource,
        "cores": spec.cores,
        "gpus": spec.gpus,
        "runtime": spec.runtime_minutes,
    }
    queue = spec.queue or site.scheduler.queue
    project = spec.project or site.scheduler.account
    if queue:
        resources["queue"] = queue
    if project:
        resources["project"] = project
    return resources


@contextmanager
def radical_home(site: SiteConfig, spec: RadicalPilotBackend, work_dir: str) -> Iterator[Path]:
    """Point RADICAL-Pilot's and PSI/J's folders at ``<work_dir>/radical`` while inside.

    Writes the ``unattended.slurm`` resource config and the session base there.
    Enter it before RADICAL-Pilot is imported (it reads some of these once); use
    ``home_for_children`` around starting the session. The environment is put
    back on exit.
    """
    root = (Path(work_dir) / "radical").resolve()
    configs = root / ".radical" / "pilot" / "configs"
    configs.mkdir(parents=True, exist_ok=True)
    if spec.resource == SLURM_RESOURCE:
        (configs / "resource_unattended.json").write_text(
            json.dumps(resource_config(site, spec, root), indent=1), encoding="utf-8"
        )
    (configs / "session_default.json").write_text(
        json.dumps({"base": str(root / "sessions")}), encoding="utf-8"
    )
    changes = {
        "RADICAL_CONFIG_USER_DIR": str(root),
        "RADICAL_BASE": str(root),
        "RADICAL_REPORT": "0",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    saved = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    start_method = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("fork", force=True)
    try:
        _psij_work_directory(root / ".psij" / "work")
        yield root
    finally:
        multiprocessing.set_start_method(start_method, force=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def home_for_children(root: Path) -> Iterator[None]:
    """Set ``HOME`` to ``root`` while RADICAL-Pilot starts its component processes.

    They also get ``SBATCH_NO_REQUEUE=1``: PSI/J submits pilots without
    ``--no-requeue``, and Slurm requeues a job whose node failed under the same id
    (seen on 3 nodes: the NODE_FAIL pilot went back to PENDING), so the campaign
    never saw it end. It relaunches the interrupted tasks in a new pilot instead.
    """
    changes = {"HOME": str(root), "SBATCH_NO_REQUEUE": "1"}
    saved = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _psij_work_directory(folder: Path) -> None:
    """Make PSI/J's default executor config write under ``folder``, not ``~/.psij``."""
    folder.mkdir(parents=True, exist_ok=True)
    psij = sys.modules.get("psij")
    if psij is None:
        return  # imported later, under the HOME of home_for_children
    config = getattr(psij, "JobExecutorConfig", None)
    if config is not None and getattr(config, "DEFAULT", None) is not None:
        config.DEFAULT_WORK_DIRECTORY = folder
        config.DEFAULT._work_directory = folder  # read when an executor is created


#: Printed first by every pilot task: where it ran (its stdout follows).
WHERE_MARKER = "#unattended-where"


# Written without "$", "`" or "\\": RADICAL-Pilot puts each argument in double quotes
# in its launch script, where the shell would expand them.
_WHERE_CODE = (
    "import base64, os, socket, subprocess, sys; "
    f"print('{WHERE_MARKER}', os.environ.get('SLURM_JOB_ID', ''), "
    "os.environ.get('SLURMD_NODENAME') or socket.gethostname(), "
    "flush=True); "
    "data = sys.argv[1]; "
    "done = subprocess.run(sys.argv[2:], input=base64.b64decode(data) if data else b''); "
    "sys.exit(done.returncode)"
)


def pilot_command(argv: list[str], stdin: bytes | None) -> list[str]:
    """Return the argv of a pilot task that reports its job and host, and feeds ``stdin``.

    RADICAL-Pilot tasks take no stdin: the bytes travel base64-encoded as an
    argument and a small Python wrapper (this interpreter) pipes them in.
    """
    import base64

    encoded = base64.b64encode(stdin).decode("ascii") if stdin else ""
    return [sys.executable, "-c", _WHERE_CODE, encoded, *argv]


def split_where(stdout: str) -> tuple[str | None, str | None, str]:
    """Return (job id, host, the program's stdout) from a pilot task's stdout."""
    first, _, rest = stdout.partition("\n")
    if not first.startswith(WHERE_MARKER):
        return None, None, stdout
    parts = first.split()
    job = parts[1] if len(parts) > 2 and parts[1] else None
    host = parts[-1] if len(parts) > 1 else None
    return job, host, rest


class PilotJobs:
    """Start the pilot of one allocation after another in one RADICAL-Pilot session.

    The first allocation is the pilot rhapsody's backend submitted when it
    started. ``submit`` after that takes the old pilot out of the task manager
    (cancelling it if it still runs), submits a new pilot of the same description
    and hands it to the task manager. RADICAL-Pilot does not tell its client the
    batch job id of a pilot (PSI/J keeps it in the launcher's process); the pilot
    job starts in the pilot's own sandbox (``--chdir``), so ``squeue`` finds it
    there (``tasks._slurm.jobs_in_folder``).
    """

    def __init__(
        self,
        backend: Any,
        resources: dict[str, Any],
        *,
        env: Mapping[str, str] | None = None,
        find_seconds: float = 300.0,
    ) -> None:
        self.backend = backend
        self.resources = dict(resources)
        self.env = dict(os.environ if env is None else env)
        self.find_seconds = find_seconds
        self._submitted = 0

    async def submit(self) -> list[str]:
        """Start the next allocation's pilot (the first one is started already); return its job."""
        backend = self.backend
        if self._submitted:
            await asyncio.to_thread(self._replace_pilot)
        self._submitted += 1
        return [await self._find_job(backend.resource_pilot)]

    def _replace_pilot(self) -> None:
        rp = importlib.import_module("radical.pilot")
        backend = self.backend
        old = backend.resource_pilot
        try:
            backend.task_manager.remove_pilots(old.uid)
            if old.state not in rp.FINAL:
                old.cancel()
        except Exception:  # the old pilot is gone either way: the new one matters
            logger.warning("releasing pilot %s failed", old.uid, exc_info=True)
        pilot = backend.pilot_manager.submit_pilots(rp.PilotDescription(dict(self.resources)))
        backend.task_manager.add_pilots(pilot)
        backend.resource_pilot = pilot

    async def _find_job(self, pilot: Any) -> str:
        rp = importlib.import_module("radical.pilot")
        deadline = time.monotonic() + self.find_seconds
        folder: str | None = None
        while time.monotonic() < deadline:
            sandbox = pilot.pilot_sandbox
            if sandbox and folder is None:
                folder = urlparse(str(sandbox)).path or str(sandbox)
            if folder is not None:
                try:
                    jobs = await asyncio.to_thread(jobs_in_folder, folder, env=self.env)
                except SlurmQueryFailed:  # the controller is away: ask again
                    jobs = []
                if jobs:
                    return jobs[-1]
            if pilot.state in rp.FINAL:
                break
            await asyncio.sleep(_FIND_POLL_SECONDS)
        raise RuntimeError(
            f"pilot {pilot.uid} ({pilot.state}): no batch job found in its sandbox "
            f"{folder or '(not known yet)'} within {self.find_seconds:.0f} s"
        )
