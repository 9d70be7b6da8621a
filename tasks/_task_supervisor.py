"""Run one executable task on the allocation; leave its result where a continuation reads it.

Started as ``python -I -S <this file> FOLDER DIGEST TOKEN ATTEMPT KEY -- ARGV...``
(``tasks._executables.supervised_argv``): by a Dask worker (``run_executable_blocking``
with a ledger) in the task's own session, so it outlives the worker, and by a
RADICAL-Pilot task (``tasks._dispatch_pilot``) under the pilot's agent. When the
campaign's process dies, Dask's scheduler dies with it, its workers close once their
running tasks return, and a task's executable would finish with nobody to hear it (or
be killed with its job); a pilot's agent loses its client. This program waits for the
executable and writes the result.

1. A line of ``started-<host>.jsonl`` says the task started: its digest, run, attempt,
   Slurm job, node, host, pid (``mark_started``).
2. ``FOLDER/fence`` names the executor run that may start tasks; another run's
   token there means a newer run of the campaign took over: the program is not
   started (exit ``FENCED``). Read before step 1 too: fenced by then, nothing is
   written; fenced between the marker and this read, the result says ``fenced``
   (``claim_start``).
3. The program runs (stdin passed on); its exit code, stdout and stderr's tail go
   to ``DIGEST.result`` atomically (a temporary name in the same folder, fsync,
   rename), then to this program's own stdout/stderr, and
   this program ends as the program did.

With ``--marker-only`` in place of ``--`` (a task whose result no later run looks
for) only step 1 is done, and this program then becomes the program (``exec``): the
marker says where an interrupted task ran.

Standard library only (started with ``-S``): one Python start per task.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

#: Exit status of a task refused because a newer run fenced the folder (EX_TEMPFAIL).
FENCED = 75
#: In place of ``--``: write the started marker only, then become the program.
MARKER_ONLY = "--marker-only"
STDERR_TAIL = 2048


def write_atomically(folder: str, name: str, data: dict[str, object], *, sync: bool) -> None:
    """Write ``data`` as JSON to ``folder/name``: temporary name, (fsync,) rename."""
    final = os.path.join(folder, name)
    temporary = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump(data, out)
        if sync:
            out.flush()
            os.fsync(out.fileno())
    # The rename is atomic; the folder is not fsync'd: what must survive is the death
    # of the campaign's process, and a result's content is on disk before its name.
    os.replace(temporary, final)


#: Open journals of this process, by path (a worker appends to one for every task).
_JOURNALS: dict[str, int] = {}
_JOURNALS_LOCK = threading.Lock()


def journal_name(host: str) -> str:
    """Return the file name of ``host``'s started-marker journal in a ledger folder."""
    return f"started-{host}.jsonl"


def mark_started(folder: str, digest: str, marker: dict[str, object]) -> None:
    """Append the started marker of task ``digest`` as one line of this host's journal.

    One ``write`` to a file opened ``O_APPEND`` (kept open by a long-lived worker): on
    this machine's disk creating a file and renaming it costs ~1 ms, the append ~13 us,
    and the marker is on every task's path. The processes of one host share its
    journal; an append of one line is not interleaved with another's on a local or
    parallel filesystem, and a reader skips a line a crash cut short. Not fsync'd,
    like the file it replaces: what must survive is the campaign's process, not the node.
    """
    line = json.dumps({"digest": digest, **marker}, separators=(",", ":")) + "\n"
    path = os.path.join(folder, journal_name(str(marker.get("host") or socket.gethostname())))
    with _JOURNALS_LOCK:
        fd = _JOURNALS.get(path)
        if fd is None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            _JOURNALS[path] = fd
    os.write(fd, line.encode("utf-8"))


def fenced_out(folder: str, token: str) -> bool:
    """True when the folder's fence names another run than ``token``."""
    try:
        with open(os.path.join(folder, "fence"), encoding="utf-8") as fence:
            return fence.read().strip() != token
    except FileNotFoundError:
        return False


def claim_start(folder: str, digest: str, token: str, marker: dict[str, object]) -> bool:
    """Write a task's started marker unless a newer run fenced the folder; True: it may start.

    The fence is read before the marker and again after it. Fenced before: nothing
    is written, so what the newer run recorded of this task (a pilot's agent may
    start a queued task of a dead run after the continuation ran it) stays. Fenced
    between the two reads: a newer run may have seen the marker and wait for it, so
    the result says ``fenced`` (not run, not lost).
    """
    if fenced_out(folder, token):
        return False
    mark_started(folder, digest, marker)
    if fenced_out(folder, token):
        write_atomically(folder, f"{digest}.result", {**marker, "kind": "fenced"}, sync=True)
        return False
    return True


def where() -> dict[str, object]:
    """Return the Slurm job, node, host and pid of this process."""
    return {
        "job_id": os.environ.get("SLURM_JOB_ID") or None,
        "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def main(argv: list[str]) -> int:
    """Run the task named on the command line; return its exit status."""
    folder, digest, token, attempt, key, mode = argv[:6]  # mode: "--" or MARKER_ONLY
    program = argv[6:]
    started = time.time()
    here = where()
    marker = {"key": key, "token": token, "attempt": int(attempt), "started_at": started, **here}
    if mode == MARKER_ONLY:
        mark_started(folder, digest, marker)
        os.execvp(program[0], program)  # noqa: S606  # the task's own argv, as Popen below
    if not claim_start(folder, digest, token, marker):
        sys.stderr.write("not started: a newer run of the campaign took over its tasks\n")
        return FENCED
    child = subprocess.Popen(program, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # A timeout or a retired worker kills this whole process group: no result then.
    out, err = child.communicate()
    result = {
        **marker,
        "kind": "exec",
        "exit_code": child.returncode,
        "stdout": out.decode("utf-8", errors="replace"),
        "stderr_tail": err.decode("utf-8", errors="replace")[-STDERR_TAIL:],
        "runtime": time.time() - started,
    }
    write_atomically(folder, f"{digest}.result", result, sync=True)
    sys.stdout.buffer.write(out)
    sys.stdout.flush()
    sys.stderr.buffer.write(err[-STDERR_TAIL * 4 :])
    sys.stderr.flush()
    if child.returncode < 0:  # killed by a signal: end the same way
        signal.signal(-child.returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -child.returncode)
    return child.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
