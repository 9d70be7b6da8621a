"""Ask Slurm whether a site's partition, account and QoS exist, and read its refusals.

``unattended check`` calls ``slurm_site_problems`` where Slurm's commands are
installed: ``sinfo`` lists the partitions, ``sacctmgr`` the accounts and QoS (only
where accounting runs: without ``slurmdbd`` Slurm neither knows nor enforces them,
and nothing is said), and ``sbatch --test-only`` asks the controller whether a job of
the site's shape would be accepted, without submitting it. Each problem names the
site's field.

``sbatch_refusal`` turns the error dask-jobqueue raises when ``sbatch`` refuses a job
(its whole command line, stdout and stderr in one string) into Slurm's own words and
the field they are about.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

from tasks._site import SiteConfig
from tasks._site_backends import DaskBackend, RadicalPilotBackend

_TIMEOUT = 30.0
#: Words of Slurm's refusals, and the site field each one is about.
_FIELD_OF = (
    ("partition", "scheduler.partition"),
    ("account", "scheduler.account"),
    ("qos", "scheduler.qos"),
    ("time limit", "scheduler.walltime"),
    ("memory", "backend.jobqueue.memory"),
    ("node configuration", "backend.jobqueue"),
)


def _client(argv: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str] | None:
    """Run a Slurm client; None when it cannot be run or hangs (nothing is known then)."""
    try:
        return subprocess.run(
            argv, env=dict(env), capture_output=True, text=True, timeout=_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def field_of(message: str) -> str:
    """Return the site field a Slurm refusal is about (``scheduler`` when it names none)."""
    lowered = message.lower()
    for words, field in _FIELD_OF:
        if words in lowered:
            return field
    return "scheduler"


def slurm_words(text: str) -> str:
    """Return the lines of a Slurm client's output that say what is wrong."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [
        line
        for line in lines
        if "error" in line.lower() or "failure" in line.lower() or "invalid" in line.lower()
    ]
    return "; ".join(errors or lines[-2:])


def _listed(argv: list[str], env: Mapping[str, str]) -> set[str] | None:
    """Return the names a listing command prints, one a line; None when it did not answer."""
    done = _client(argv, env)
    if done is None or done.returncode != 0:
        return None
    return {line.strip().rstrip("*") for line in done.stdout.splitlines() if line.strip()}


def _job_shape(site: SiteConfig) -> list[str]:
    """Return the ``sbatch`` options of one of the site's jobs (partition, account, size)."""
    scheduler = site.scheduler
    options = []
    if scheduler.queue:
        options.append(f"--partition={scheduler.queue}")
    if scheduler.account:
        options.append(f"--account={scheduler.account}")
    if scheduler.qos:
        options.append(f"--qos={scheduler.qos}")
    if scheduler.walltime:
        options.append(f"--time={scheduler.walltime}")
    backend = site.backend
    if isinstance(backend, DaskBackend) and backend.jobqueue is not None:
        options.append(f"--cpus-per-task={backend.jobqueue.cores}")
        memory = backend.jobqueue.memory.upper().replace("B", "").replace("I", "")
        options.append(f"--mem={memory}")
    if isinstance(backend, RadicalPilotBackend):
        options.append(f"--ntasks={backend.cores}")
    return options


def slurm_site_problems(site: SiteConfig, env: Mapping[str, str]) -> list[tuple[str, str]]:
    """Ask this machine's Slurm about the site; return ``(field, problem)`` pairs.

    Nothing is asked (and nothing is wrong) where the site's scheduler is not Slurm,
    Slurm's commands are not installed, or ``sinfo`` gets no answer (no cluster is
    configured here, or its controller is away): the first job's refusal then says
    it at run time (``sbatch_refusal``).
    """
    if site.scheduler.system != "slurm":
        return []
    path = env.get("PATH", os.defpath)
    if shutil.which("sbatch", path=path) is None or shutil.which("sinfo", path=path) is None:
        return []
    partitions = _listed(["sinfo", "-h", "-o", "%R"], env)
    if partitions is None:  # no cluster configured here, or its controller is away
        return []
    scheduler = site.scheduler
    problems: list[tuple[str, str]] = []
    if scheduler.queue and scheduler.queue not in partitions:
        known = ", ".join(sorted(partitions)) or "none"
        problems.append(
            (
                "scheduler.partition",
                f"Slurm has no partition {scheduler.queue!r} (sinfo lists: {known})",
            )
        )
    for value, field, kind in (
        (scheduler.account, "scheduler.account", "account"),
        (scheduler.qos, "scheduler.qos", "qos"),
    ):
        if not value or not shutil.which("sacctmgr", path=path):
            continue
        names = _listed(["sacctmgr", "-nP", "show", kind, "format=name"], env)
        if names is not None and value.lower() not in {n.lower() for n in names}:
            problems.append((field, f"Slurm's accounting has no {kind} {value!r} (sacctmgr)"))
    done = _client(["sbatch", "--test-only", *_job_shape(site), "--wrap", "true"], env)
    if done is not None and done.returncode != 0:
        words = slurm_words(done.stderr + "\n" + done.stdout)
        field = field_of(words)
        if field not in {f for f, _ in problems}:
            problems.append((field, f"sbatch --test-only refuses the site's job: {words}"))
    return problems


def sbatch_refusal(error: BaseException) -> tuple[str, str] | None:
    """Return ``(field, Slurm's words)`` when ``error`` is ``sbatch`` refusing a job, else None.

    dask-jobqueue raises ``RuntimeError("Command exited with non-zero exit code ...
    stderr: ...")`` with the whole job script; only the stderr lines are Slurm's.
    """
    text = str(error)
    if "sbatch" not in text or "non-zero exit code" not in text:
        return None
    _, _, stderr = text.partition("stderr:")
    words = slurm_words(stderr or text)
    return field_of(words), words
