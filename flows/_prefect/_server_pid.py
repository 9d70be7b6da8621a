"""Which process is the local Prefect server: its PID file, and stopping its process group.

The PID file names the server's process with a mark (``process_mark``) that neither a
recycled PID nor a clock step fools, so a PID file whose process is gone, or is now
another's, is never taken for our server (``live_record`` drops it). The server runs
in a session of its own, so one signal reaches its whole process group
(``stop_group``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from flows._paths import write_private

__all__ = ["live_record", "process_mark", "same_process", "stop_group", "write_pid_file"]


def _boot_id() -> str:
    """Return this boot's id (Linux), or '' where the system has none to read."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def process_mark(pid: int) -> dict[str, Any]:
    """Return what identifies process ``pid`` in a PID file, whatever the clock does later.

    ``create_time`` is wall-clock time: a clock step (NTP, a virtual machine resumed or
    forked; 14 s seen here) moves it for every running process, and a server taken for
    dead would never be spoken to again. ``started`` (seconds from boot to the process's
    start) and ``boot_id`` do not move.
    """
    created = psutil.Process(pid).create_time()
    return {"create_time": created, "started": created - psutil.boot_time(), "boot_id": _boot_id()}


def same_process(pid: int, record: Mapping[str, Any]) -> bool:
    """Return whether ``pid`` is still the live process ``record`` (a ``process_mark``) names.

    A recycled PID belongs to a process started at another moment (or in another boot);
    a PID file written before ``started`` existed is compared by ``create_time``.
    """
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        created = float(process.create_time())
        if "started" in record:
            since_boot = created - psutil.boot_time()
            return (
                abs(since_boot - float(record["started"])) < 1.0
                and str(record.get("boot_id", "")) == _boot_id()
            )
        return abs(created - float(record["create_time"])) < 1.0
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def write_pid_file(path: Path, pid: int, **fields: Any) -> None:
    """Write ``path`` (0600): ``pid``, its ``process_mark`` and ``fields`` (never a secret)."""
    write_private(path, json.dumps({"pid": pid, **process_mark(pid), **fields}))


def live_record(path: Path) -> dict[str, Any] | None:
    """Return the PID file's record if its process is still the one it names, else clean up."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        pid = int(record["pid"])
        float(record["create_time"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)
        return None
    if same_process(pid, record):
        return dict(record)
    with contextlib.suppress(psutil.Error, ChildProcessError):
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            psutil.Process(pid).wait(timeout=0)  # reap our own zombie (another's: no effect)
    path.unlink(missing_ok=True)
    return None


def _signal_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def stop_group(pid: int, grace_seconds: float) -> None:
    """SIGTERM the process group led by ``pid``, SIGKILL it after ``grace_seconds``."""
    _signal_group(pid, signal.SIGTERM)
    with contextlib.suppress(psutil.NoSuchProcess):
        try:
            # Also reaps the process when we are its parent (a test session).
            psutil.Process(pid).wait(timeout=grace_seconds)
        except psutil.TimeoutExpired:
            _signal_group(pid, signal.SIGKILL)
            psutil.Process(pid).wait(timeout=10)
    # Children that outlived the leader (a uvicorn worker) still hold the group.
    _signal_group(pid, signal.SIGKILL)
