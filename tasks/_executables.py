"""Run executables in their own process group, and kill the whole group on timeout.

asyncflow's executable tasks ignore ``max_workers``, take no stdin, join argv
into a shell string by default and keep running when cancelled; a simulation
that forks leaves grandchildren behind. So executables run here: each in a new
session (``start_new_session=True``), and a timeout or a cancellation ends the
WHOLE group (SIGTERM, then SIGKILL after a grace period).

``run_executable`` runs on this process's event loop (local sites);
``run_executable_blocking`` is the same contract for a worker thread or a Dask
worker, where it is shipped as a plain function.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from tasks import _child_watcher
from tasks._results import STDERR_TAIL_CHARS, ExecutableTask
from tasks._task_supervisor import MARKER_ONLY, mark_started, where


def node_name() -> str:
    """Return the node this process runs on: Slurm's name for it inside a job, else the host.

    Several Slurm nodes may share one host (``slurmd -N``); ``SLURMD_NODENAME`` is the
    name ``squeue`` and ``sinfo`` use, which on most clusters is the short host name.
    """
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


#: The wrapper that records an executable task's start and result on the allocation.
SUPERVISOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_task_supervisor.py")

#: File descriptors one running executable may hold: three pipes while spawning
#: (both ends), the exec-error pipe and a pidfd.
FDS_PER_EXECUTABLE = 8
#: Descriptors kept free for everything else (logs, sockets, the database).
FD_HEADROOM = 64
_READ_CHUNK = 65_536


class SpawnFailed(Exception):  # noqa: N818  # a fact about the task, reported as its record
    """The program could not be started (not found, not executable, bad cwd)."""

    def __init__(self, program: str, cause: OSError) -> None:
        super().__init__(f"cannot start {program!r}: {type(cause).__name__}: {cause.strerror}")


@dataclass(frozen=True)
class ExecOutcome:
    """What one run of an executable produced."""

    exit_code: int | None
    stdout: str
    stderr_tail: str
    timed_out: bool
    runtime: float
    host: str


def executable_slots(requested: int) -> int:
    """Return how many executables may run at once under the open-files limit.

    10k executables at once failed with "Too many open files" under asyncflow;
    the bound is computed from ``RLIMIT_NOFILE`` minus what is already open.
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return requested
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 32
    free = soft - in_use - FD_HEADROOM
    return max(1, min(requested, free // FDS_PER_EXECUTABLE))


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to a process group; return False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        # A member changed its credentials; nothing more we may do to it.
        return False
    return True


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


async def _read_all(stream: asyncio.StreamReader | None) -> bytes:
    if stream is None:
        return b""
    return await stream.read()


async def _read_tail(stream: asyncio.StreamReader | None) -> bytes:
    """Read a stream to its end, keeping only the last few KB (stderr can be huge)."""
    if stream is None:
        return b""
    kept = b""
    limit = STDERR_TAIL_CHARS * 4
    while chunk := await stream.read(_READ_CHUNK):
        kept = (kept + chunk)[-limit:]
    return kept


async def _feed(proc: asyncio.subprocess.Process, data: bytes | None) -> None:
    if proc.stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            proc.stdin.write(data)
            await proc.stdin.drain()
        proc.stdin.close()
        await proc.stdin.wait_closed()


async def _end_group(proc: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM the group, wait ``grace`` for the leader, then SIGKILL the group."""
    if _signal_group(proc.pid, signal.SIGTERM):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), grace)
    # Members other than the leader may have ignored SIGTERM: the group goes too.
    _signal_group(proc.pid, signal.SIGKILL)
    await proc.wait()


async def run_executable(
    task: ExecutableTask, *, time_limit: float | None, grace: float
) -> ExecOutcome:
    """Run ``task`` in a new session on this event loop and return what it produced.

    A timeout ends the whole process group; so does cancelling the caller.
    """
    _child_watcher.install()  # a pidfd on this loop per child, not a thread (Python 3.11)
    started = time.perf_counter()
    spawn = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *task.argv,
            stdin=subprocess.PIPE if task.stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=task.env,
            cwd=task.cwd,
            start_new_session=True,
        )
    )
    try:
        proc = await asyncio.shield(spawn)
    except asyncio.CancelledError:
        # Cancelled while asyncio was still wiring up a child that already runs
        # (it may have forked its own children): finish, then end the group.
        await asyncio.wait({spawn})
        if not spawn.cancelled() and spawn.exception() is None:
            _signal_group(spawn.result().pid, signal.SIGKILL)
        raise
    except OSError as exc:
        raise SpawnFailed(task.argv[0], exc) from None
    stdout_reader = asyncio.ensure_future(_read_all(proc.stdout))
    stderr_reader = asyncio.ensure_future(_read_tail(proc.stderr))
    feeder = asyncio.ensure_future(_feed(proc, task.stdin))
    io: list[asyncio.Future[Any]] = [stdout_reader, stderr_reader, feeder]
    leader = asyncio.ensure_future(proc.wait())
    timed_out = False
    try:
        done, _ = await asyncio.wait({leader}, timeout=time_limit)
        if leader not in done:
            timed_out = True
            await _end_group(proc, grace)
        # The leader is gone. Members it left behind holding our pipes get a
        # grace period, then the group is killed so the task can finish.
        _, pending = await asyncio.wait(io, timeout=max(grace, 0.5))
        if pending:
            _signal_group(proc.pid, signal.SIGKILL)
            _, pending = await asyncio.wait(pending, timeout=1.0)
            for reader in pending:  # a member escaped the group with our pipe
                reader.cancel()
    except BaseException:
        # Cancelled (or the loop is going down): nothing of the task may outlive us.
        _signal_group(proc.pid, signal.SIGKILL)
        for pending_io in (*io, leader):
            pending_io.cancel()
        raise
    stdout = b"" if stdout_reader.cancelled() else stdout_reader.result()
    stderr = b"" if stderr_reader.cancelled() else stderr_reader.result()
    return ExecOutcome(
        exit_code=proc.returncode,
        stdout=_decode(stdout),
        stderr_tail=_decode(stderr)[-STDERR_TAIL_CHARS:],
        timed_out=timed_out,
        runtime=time.perf_counter() - started,
        host=node_name(),
    )


# A Dask worker being retired (its job ended while the node lives on) must start no
# executable after its running ones are killed: ``refuse_new_executables`` (called
# there by ``tasks._jobqueue.kill_task_groups``) sets this under the spawn lock, so an
# executable is either started before it (a session leader by then: the kill finds it)
# or never.
_SPAWN_LOCK = threading.Lock()
_refusing = False


def refuse_new_executables() -> None:
    """From now on this process starts no executable (a retiring Dask worker)."""
    global _refusing
    with _SPAWN_LOCK:
        _refusing = True


def supervised_argv(argv: list[str], record: tuple[str, str, str, int, str, bool]) -> list[str]:
    """Return ``argv`` run under ``tasks/_task_supervisor.py`` with a ledger ``record``.

    ``record`` is a ``TaskRef`` as shipped (folder, digest, token, attempt, key,
    durable). A durable task's supervisor checks the fence and records the result;
    otherwise it writes only the started marker and becomes the program.
    """
    folder, digest, token, attempt, key, durable = record
    mode = "--" if durable else MARKER_ONLY
    return [sys.executable, "-I", "-S", SUPERVISOR, folder, digest, token, str(attempt), key,
            mode, *argv]  # fmt: skip


def run_executable_blocking(
    argv: list[str],
    stdin: bytes | None,
    env: dict[str, str] | None,
    cwd: str | None,
    time_limit: float | None,
    grace: float,
    record: tuple[str, str, str, int, str, bool] | None = None,
) -> ExecOutcome:
    """Run an executable from a worker thread or a Dask worker, same contract as above.

    With a durable ``record`` (a ``TaskRef``'s folder, digest, token, attempt, key)
    the program runs under ``tasks/_task_supervisor.py``, in the same session, which
    writes its started marker and its result to the campaign's ``task-results``
    folder and outlives this worker (``tasks._task_ledger``); otherwise only the
    marker is written, here.
    """
    started = time.perf_counter()
    if record is not None:
        folder, digest, token, attempt, key, durable = record
        if durable:
            argv = supervised_argv(argv, record)
        else:  # only where it ran, written here: no Python started for it
            marker = {"key": key, "token": token, "attempt": attempt,
                      "started_at": time.time(), **where()}  # fmt: skip
            mark_started(folder, digest, marker)
    with _SPAWN_LOCK:
        if _refusing:
            # As if started and killed at once, like the executables running here.
            return ExecOutcome(
                exit_code=-signal.SIGKILL,
                stdout="",
                stderr_tail="not started: this worker is being retired",
                timed_out=False,
                runtime=0.0,
                host=node_name(),
            )
        # Popen returns once the child has exec'd, so after its setsid: a group leader.
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    timed_out = False
    try:
        out, err = proc.communicate(stdin, timeout=time_limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        if _signal_group(proc.pid, signal.SIGTERM):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        _signal_group(proc.pid, signal.SIGKILL)
        try:
            out, err = proc.communicate(timeout=max(grace, 1.0))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = b"", b""
    except BaseException:
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    out, err = out or b"", err or b""
    return ExecOutcome(
        exit_code=proc.wait(),
        stdout=_decode(out),
        stderr_tail=_decode(err[-STDERR_TAIL_CHARS * 4 :])[-STDERR_TAIL_CHARS:],
        timed_out=timed_out,
        runtime=time.perf_counter() - started,
        host=node_name(),
    )
