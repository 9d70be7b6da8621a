"""What the campaign knows about a Slurm allocation: id, nodes, times, state, how it ended.

From inside a job the environment says most of it (``SLURM_JOB_ID``,
``SLURM_JOB_NODELIST``, ``SLURM_JOB_START_TIME``/``SLURM_JOB_END_TIME``; the last two
only from Slurm 23.02 on, or from a ``TaskProlog`` that exports them). From outside,
``squeue`` lists a job while it is pending or running and, with ``-t all``, for
``MinJobAge`` seconds after it ended; a ``jobcomp/filetxt`` log keeps one line per
finished job for good. Every function here reads, none changes a job.

States and reasons are typed: ``AllocationState.end_reason`` is one of
``EndReason``, never a sentence to parse.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

#: How an allocation ended, in the campaign's words.
EndReason = Literal[
    "completed", "timeout", "cancelled", "node_fail", "preempted", "failed", "unknown"
]

#: Slurm job states that mean the job has not ended.
LIVE_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
     "SIGNALING", "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "STOPPED"}
)  # fmt: skip
_END_REASONS: dict[str, EndReason] = {
    "COMPLETED": "completed",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "CANCELLED": "cancelled",
    "NODE_FAIL": "node_fail",
    "BOOT_FAIL": "node_fail",
    "PREEMPTED": "preempted",
    "FAILED": "failed",
    "OUT_OF_MEMORY": "failed",
    "SPECIAL_EXIT": "failed",
    "REVOKED": "cancelled",
}
# squeue fields, '|'-separated: id, state, reason, submit, start, end, nodes, node count.
_SQUEUE_FORMAT = "%i|%T|%r|%V|%S|%e|%N|%D"
_SQUEUE_TIMEOUT = 30.0
#: What squeue says (exit 1) when the controller knows none of the jobs asked about:
#: an answer (they ended more than ``MinJobAge`` ago), not a failure.
_NO_SUCH_JOBS = "Invalid job id specified"


class SlurmQueryFailed(OSError):  # noqa: N818  # names what happened, like the taxonomy
    """A Slurm client got no answer from the controller: nothing is known about the jobs.

    ``squeue`` exits 1 with empty output while ``slurmctld`` is down or restarting
    ("Unable to contact slurm controller"), and after ``MessageTimeout`` when it hangs
    ("Socket timed out"). Such an answer says nothing about the jobs: they may run on.
    """

    def __init__(self, command: str, returncode: int | None, stderr: str) -> None:
        self.command = command
        self.returncode = returncode
        self.stderr = stderr.strip()[-400:]
        how = "timed out" if returncode is None else f"exited {returncode}"
        super().__init__(f"{command} {how}: {self.stderr or 'no message'}")


def _run_client(argv: list[str], env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client; a client that hangs past the timeout is a failed query.

    Raises:
        OSError: the client is not installed or cannot be run.
        SlurmQueryFailed: it did not finish within the timeout.
    """
    try:
        return subprocess.run(
            argv,
            env=dict(os.environ if env is None else env),
            capture_output=True,
            text=True,
            timeout=_SQUEUE_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmQueryFailed(argv[0], None, f"no answer within {_SQUEUE_TIMEOUT:.0f} s") from exc


def end_reason(state: str) -> EndReason:
    """Return how a job in Slurm state ``state`` ended (``unknown`` for any other state)."""
    # scontrol may print "CANCELLED by 0"; squeue prints the bare state.
    return _END_REASONS.get(state.split()[0].upper() if state else "", "unknown")


def _epoch(text: str | None) -> float | None:
    """Return epoch seconds of a Slurm time (local ISO without zone), or None."""
    if not text or text in {"N/A", "Unknown", "None", "(null)"}:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class AllocationState:
    """One Slurm job as the controller (or the job-completion log) last described it.

    ``reason`` is Slurm's own word for why a job waits (``Resources``, ``Priority``)
    or ended (``TimeLimit``); ``end_reason`` is ours, set once the job has ended.
    """

    job_id: str
    state: str
    reason: str | None = None
    nodes: tuple[str, ...] = ()
    node_count: int = 0
    submitted_at: float | None = None
    started_at: float | None = None
    ends_at: float | None = None

    @property
    def ended(self) -> bool:
        """True once the job is in a terminal state."""
        return self.state.upper() not in LIVE_STATES

    @property
    def running(self) -> bool:
        """True while the job holds its nodes."""
        return self.state.upper() in {"RUNNING", "COMPLETING", "CONFIGURING"}

    @property
    def end_reason(self) -> EndReason | None:
        """Return how the job ended, or None while it has not."""
        return end_reason(self.state) if self.ended else None

    def describe(self) -> str:
        """Return the queue line a person reads: ``job 12 PENDING (Resources)``."""
        why = f" ({self.reason})" if self.reason and self.reason != "None" else ""
        return f"job {self.job_id} {self.state}{why}"


def expand_nodelist(text: str, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Return host names of a Slurm node list (``nid[001-003]``); plain lists need no Slurm."""
    text = text.strip()
    if not text or text in {"(null)", "None", "N/A"}:
        return ()
    if "[" not in text:
        return tuple(part for part in text.split(",") if part)
    try:
        done = subprocess.run(
            ["scontrol", "show", "hostnames", text],
            env=dict(os.environ if env is None else env),
            capture_output=True,
            text=True,
            timeout=_SQUEUE_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return (text,)
    names = tuple(line.strip() for line in done.stdout.splitlines() if line.strip())
    return names or (text,)


def parse_squeue(output: str) -> dict[str, AllocationState]:
    """Parse ``squeue -o '%i|%T|%r|%V|%S|%e|%N|%D'`` lines into states by job id."""
    found: dict[str, AllocationState] = {}
    for line in output.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 8:
            continue
        job_id, state, reason, submitted, started, ends, nodes, count = parts
        found[job_id] = AllocationState(
            job_id=job_id,
            state=state,
            reason=reason or None,
            nodes=expand_nodelist(nodes) if state.upper() != "PENDING" else (),
            node_count=int(count) if count.isdigit() else 0,
            submitted_at=_epoch(submitted),
            started_at=_epoch(started) if state.upper() != "PENDING" else None,
            ends_at=_epoch(ends),
        )
    return found


def query_jobs(
    job_ids: Iterable[str], *, env: Mapping[str, str] | None = None
) -> dict[str, AllocationState]:
    """Ask ``squeue -t all`` about ``job_ids``; jobs the controller forgot are left out.

    Only an answer counts: exit status 0 (a job left out ended more than ``MinJobAge``
    ago), or exit 1 with "Invalid job id specified" (the controller knows none of
    them). Any other failure is no answer and raises: the jobs may well run on.

    Args:
        job_ids: Slurm job ids.
        env: Environment of the client (``SLURM_CONF``); ``None`` means ``os.environ``.

    Raises:
        SlurmQueryFailed: the controller did not answer (down, restarting, hung).
        OSError: ``squeue`` is not installed or cannot be run.
    """
    ids = [str(job_id) for job_id in job_ids]
    if not ids:
        return {}
    done = _run_client(
        ["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", _SQUEUE_FORMAT], env
    )
    return read_squeue_answer(done.returncode, done.stdout, done.stderr)


def read_squeue_answer(returncode: int, stdout: str, stderr: str) -> dict[str, AllocationState]:
    """Return the jobs a ``squeue`` run described; raise when it was not an answer.

    Raises:
        SlurmQueryFailed: ``squeue`` exited non-zero for another reason than jobs
            the controller does not know (it could not reach the controller).
    """
    if returncode == 0:
        return parse_squeue(stdout)
    if _NO_SUCH_JOBS in stderr:
        return {}
    raise SlurmQueryFailed("squeue", returncode, stderr)


def cancel_jobs(job_ids: Iterable[str], *, env: Mapping[str, str] | None = None) -> None:
    """``scancel`` the jobs (one call; jobs that already ended are left as they are).

    Raises:
        OSError: ``scancel`` is not installed or cannot be run.
    """
    ids = [str(job_id) for job_id in job_ids]
    if not ids:
        return
    subprocess.run(
        ["scancel", *ids],
        env=dict(os.environ if env is None else env),
        capture_output=True,
        text=True,
        timeout=_SQUEUE_TIMEOUT,
        check=False,
    )


def jobs_in_folder(
    folder: str | os.PathLike[str], *, env: Mapping[str, str] | None = None
) -> list[str]:
    """Return the ids of this user's jobs that run (or wait) in ``folder`` (``--chdir``).

    How a job submitted by another program (RADICAL-Pilot's PSI/J launcher) is
    found: it starts in a folder only that job uses.

    Raises:
        SlurmQueryFailed: the controller did not answer.
        OSError: ``squeue`` is not installed or cannot be run.
    """
    done = _run_client(["squeue", "-h", "-t", "all", "--me", "-o", "%i|%Z"], env)
    if done.returncode != 0:
        raise SlurmQueryFailed("squeue", done.returncode, done.stderr)
    wanted = os.path.realpath(folder)
    found = []
    for line in done.stdout.splitlines():
        job_id, _, where = line.strip().partition("|")
        if job_id and where and os.path.realpath(where) == wanted:
            found.append(job_id)
    return found


def query_job(job_id: str, *, env: Mapping[str, str] | None = None) -> AllocationState | None:
    """Return what ``squeue`` says about one job, or None when it is unknown there."""
    return query_jobs([job_id], env=env).get(str(job_id))


def parse_scontrol(output: str) -> AllocationState | None:
    """Parse one ``scontrol show job -o ID`` line (``Key=Value`` pairs)."""
    fields: dict[str, str] = {}
    for token in output.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    job_id = fields.get("JobId")
    if not job_id:
        return None
    state = fields.get("JobState", "UNKNOWN")
    return AllocationState(
        job_id=job_id,
        state=state,
        reason=fields.get("Reason"),
        nodes=expand_nodelist(fields.get("NodeList", "")),
        node_count=int(fields.get("NumNodes", "0").split("-")[0] or 0),
        submitted_at=_epoch(fields.get("SubmitTime")),
        started_at=_epoch(fields.get("StartTime")) if state != "PENDING" else None,
        ends_at=_epoch(fields.get("EndTime")),
    )


def show_job(job_id: str, *, env: Mapping[str, str] | None = None) -> AllocationState | None:
    """Return what ``scontrol show job -o`` says about one job, or None."""
    try:
        done = _run_client(["scontrol", "show", "job", "-o", str(job_id)], env)
    except SlurmQueryFailed:
        return None
    return parse_scontrol(done.stdout) if done.returncode == 0 else None


def read_jobcomp(path: str | os.PathLike[str], job_id: str) -> AllocationState | None:
    """Return the last line a ``jobcomp/filetxt`` log holds for ``job_id``, or None."""
    found: AllocationState | None = None
    try:
        with open(path, encoding="utf-8", errors="replace") as log:
            for line in log:
                if line.startswith(f"JobId={job_id} "):
                    parsed = parse_scontrol(line.replace("NodeCnt=", "NumNodes="))
                    if parsed is not None:
                        found = parsed
    except OSError:
        return None
    return found


@dataclass(frozen=True)
class JobEnvironment:
    """The Slurm job this process runs in, as its environment tells it."""

    job_id: str
    nodes: tuple[str, ...]
    started_at: float | None
    ends_at: float | None


def job_from_env(env: Mapping[str, str] | None = None) -> JobEnvironment | None:
    """Return the enclosing Slurm job from ``SLURM_JOB_ID`` and friends, or None outside one.

    ``SLURM_JOB_END_TIME`` comes from Slurm 23.02 or from a TaskProlog; without it
    ``ends_at`` is None and ``allocation_end`` asks ``squeue``.
    """
    source = os.environ if env is None else env
    job_id = source.get("SLURM_JOB_ID") or source.get("SLURM_JOBID")
    if not job_id:
        return None
    nodes = source.get("SLURM_JOB_NODELIST") or source.get("SLURM_NODELIST") or ""
    return JobEnvironment(
        job_id=job_id,
        nodes=tuple(part for part in nodes.split(",") if part and "[" not in part),
        started_at=_float(source.get("SLURM_JOB_START_TIME")),
        ends_at=_float(source.get("SLURM_JOB_END_TIME")),
    )


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def allocation_end(job_id: str, *, env: Mapping[str, str] | None = None) -> float | None:
    """Return when job ``job_id`` ends (epoch seconds): its environment, else ``squeue``."""
    inside = job_from_env(env)
    if inside is not None and inside.job_id == str(job_id) and inside.ends_at is not None:
        return inside.ends_at
    try:
        state = query_job(job_id, env=env)
    except SlurmQueryFailed:  # no answer now: the end is not known, not "never"
        return None
    if state is None:
        state = show_job(job_id, env=env)
    return None if state is None else state.ends_at


def where_am_i(env: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """Return this process's host name and Slurm job id (None outside a job).

    Called inside each task on a worker, so the result records where it ran.
    """
    source = os.environ if env is None else env
    # Several Slurm nodes may share a host: the node's Slurm name, as squeue prints it.
    node = source.get("SLURMD_NODENAME") or socket.gethostname()
    return node, source.get("SLURM_JOB_ID") or None


def describe_queue(states: Sequence[AllocationState]) -> str:
    """Return ``waiting in queue: job 12 PENDING (Resources)`` for the jobs still pending."""
    pending = [state for state in states if state.state.upper() == "PENDING"]
    if not pending:
        return ""
    return "waiting in queue: " + ", ".join(state.describe() for state in pending)


def jobcomp_path(conf: str | os.PathLike[str]) -> Path | None:
    """Return ``JobCompLoc`` of a ``slurm.conf`` whose ``JobCompType`` is filetxt, or None."""
    values: dict[str, str] = {}
    try:
        text = Path(conf).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.split("#", 1)[0].strip().partition("=")
        if sep:
            values[key.strip().lower()] = value.strip()
    if values.get("jobcomptype") != "jobcomp/filetxt" or not values.get("jobcomploc"):
        return None
    return Path(values["jobcomploc"])
