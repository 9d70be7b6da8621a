"""Results that outlive the campaign's process: one file per task key on the shared filesystem.

On a site whose workers are batch jobs (dask-jobqueue, a pilot) the Dask scheduler
lives in the campaign's process: when that process dies (a login-node reboot, a
SIGKILL), the workers lose their scheduler at once; the tasks they were running
finish (a worker's process lives until they return: benchmarks/scheduler_placement.py)
with nobody to hear them. So every task on the allocation reports to a folder under the
campaign directory (``task-results/``), which the next run reads before it launches
anything:

* ``started-<host>.jsonl``: a line per task started on that host: its digest,
  which executor run (``token``) and attempt, in which Slurm job, on which node
  and host, as which pid (the latest for a digest is the one a run reads before
  it launches the task again);
* ``<digest>.result``: what it produced, written atomically (temporary name in the
  same folder, fsync, rename) by the task's wrapper on the worker; for an
  executable, a supervisor process in the task's own session
  (``tasks/_task_supervisor.py``), which outlives the worker;
* ``fence``: the executor run that may start tasks now. A new run writes its token
  first; a worker of a dead run then starts nothing more (its running tasks finish
  and report).

``digest`` is a hash of the task's durable key: ``<batch prefix>/<index>`` for a
simulation batch (its prefix is content-addressed by the batch key), so the same
task of a continued campaign finds its earlier result.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks._slurm import SlurmQueryFailed, query_jobs
from tasks._task_supervisor import journal_name

#: The folder under the campaign directory.
RESULTS_FOLDER = "task-results"


@dataclass(frozen=True)
class TaskRef:
    """What a task's wrapper on the worker needs to report: folder, key digest, run, attempt."""

    folder: str
    digest: str
    token: str
    attempt: int
    key: str = ""
    #: Whether the result is kept for a continuation (a durable key), or only the marker.
    durable: bool = True

    def shipped(self) -> tuple[str, str, str, int, str, bool]:
        """Return this reference as the plain tuple shipped to where the task runs."""
        return (self.folder, self.digest, self.token, self.attempt, self.key, self.durable)


def key_digest(key: str) -> str:
    """Return the file name stem of a durable task key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:40]


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _parse_marker(line: bytes) -> dict[str, Any] | None:
    """Return one journal line's marker; a line glued to a fragment a crash cut short too."""
    for start in (0, line.rfind(b"{")):
        try:
            data = json.loads(line[start:])
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("digest"), str):
            return data
    return None


class _Journals:
    """The started markers of a ledger folder, by digest, read incrementally."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._offsets: dict[str, int] = {}
        self.by_digest: dict[str, list[dict[str, Any]]] = {}

    def refresh(self) -> dict[str, list[dict[str, Any]]]:
        """Read what was appended since the last look (whole lines only) and return the index."""
        for path in sorted(self.folder.glob(journal_name("*"))):
            offset = self._offsets.get(path.name, 0)
            try:
                with open(path, "rb") as journal:
                    journal.seek(offset)
                    data = journal.read()
            except OSError:
                continue
            whole = data.rfind(b"\n") + 1  # a line still being written waits for the next look
            for line in data[:whole].splitlines():
                marker = _parse_marker(line)
                if marker is not None:
                    self.by_digest.setdefault(marker["digest"], []).append(marker)
            self._offsets[path.name] = offset + whole
        return self.by_digest

    def latest(self, digest: str) -> dict[str, Any] | None:
        """Return the marker of the last start of task ``digest``, or None."""
        return _latest(self.refresh().get(digest, []))


def _latest(markers: list[dict[str, Any]]) -> dict[str, Any] | None:
    return max(markers, key=lambda m: float(m.get("started_at") or 0.0)) if markers else None


def _supervisor_alive(marker: Mapping[str, Any]) -> bool:
    """True when the marker's pid is a live task wrapper on this host."""
    if marker.get("host") != socket.gethostname() or not isinstance(marker.get("pid"), int):
        return False
    try:
        command = Path(f"/proc/{marker['pid']}/cmdline").read_bytes()
    except OSError:
        return False
    return b"_task_supervisor" in command


class TaskLedger:
    """The campaign's ``task-results`` folder, as one executor run uses it."""

    def __init__(self, folder: str | os.PathLike[str], token: str) -> None:
        self.folder = Path(folder)
        self.token = token
        self.folder.mkdir(parents=True, exist_ok=True)
        self._journals = _Journals(self.folder)

    def fence(self) -> None:
        """Make this run the one whose tasks may start (workers of earlier runs start none)."""
        temporary = self.folder / f".fence.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as out:  # the token, nothing else
            out.write(self.token)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.folder / "fence")

    def ref(self, key: str, attempt: int, *, durable: bool = True) -> TaskRef:
        """Return what the wrapper of attempt ``attempt`` of task ``key`` reports with.

        A task whose key is not ``durable`` (no later run would find it) leaves only its
        started marker: where it ran, for the record of an interruption.
        """
        return TaskRef(str(self.folder), key_digest(key), self.token, attempt, key, durable)

    def result(self, key: str) -> dict[str, Any] | None:
        """Return the recorded result of task ``key``, or None (also when it was fenced out)."""
        found = _read(self.folder / f"{key_digest(key)}.result")
        return None if found is None or found.get("kind") == "fenced" else found

    def started_by(self, ref: TaskRef) -> dict[str, Any] | None:
        """Return the marker of the attempt ``ref`` names, or None if it never started."""
        for marker in self._journals.refresh().get(ref.digest, ()):
            if marker.get("token") == ref.token and marker.get("attempt") == ref.attempt:
                return marker
        return None

    def started_elsewhere(self, key: str) -> list[dict[str, Any]]:
        """Return the marker an earlier run left for task ``key`` (none, or one)."""
        marker = self._journals.latest(key_digest(key))
        return [] if marker is None or marker.get("token") == self.token else [marker]

    async def settle(
        self, key: str, *, env: Mapping[str, str], poll_seconds: float
    ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """Return task ``key``'s result from an earlier run, waiting while it still runs.

        Returns ``(result, lost)``: the result when one is (or becomes) recorded;
        otherwise the markers of earlier runs whose task is gone without one (its
        job ended as Slurm says, and no wrapper of it lives on), which the caller
        relaunches. A marker whose job Slurm cannot be asked about counts as alive.
        """
        while True:
            recorded = _read(self.folder / f"{key_digest(key)}.result")
            if recorded is not None:
                # A task a fence refused never ran: not lost, just not run yet.
                return (None, []) if recorded.get("kind") == "fenced" else (recorded, [])
            markers = self.started_elsewhere(key)
            if not markers:
                return None, []
            if not await self._any_alive(markers, env):
                found = self.result(key)  # written between the two looks
                return found, ([] if found is not None else markers)
            await asyncio.sleep(poll_seconds)

    async def _any_alive(self, markers: list[dict[str, Any]], env: Mapping[str, str]) -> bool:
        if any(_supervisor_alive(m) for m in markers):
            return True
        jobs = sorted({str(m["job_id"]) for m in markers if m.get("job_id")})
        if not jobs:
            return False
        try:
            states = await asyncio.to_thread(query_jobs, jobs, env=env)
        except SlurmQueryFailed:
            return True  # no answer is not an end
        return any(state is not None and not state.ended for state in states.values())


def started_markers(folder: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Return the marker of each task's latest start in the ledger at ``folder``, by digest."""
    found = _Journals(Path(folder)).refresh().items()
    return {digest: marker for digest, markers in found if (marker := _latest(markers))}


def jobs_with_open_tasks(folder: str | os.PathLike[str]) -> set[str]:
    """Return the Slurm jobs the ledger at ``folder`` says run tasks with no result yet."""
    path = Path(folder)
    busy = set()
    for digest, marker in started_markers(path).items():
        if not marker.get("job_id"):
            continue
        if not (path / f"{digest}.result").exists():
            busy.add(str(marker["job_id"]))
    return busy
