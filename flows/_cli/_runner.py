"""The login node's runner as a process: start it, find it, stop it, serve in it.

One runner serves a state directory; it holds ``<state dir>/runner.lock`` for its
lifetime (``runner_alive`` probes it) and writes ``runner.serving`` once it polls
for runs (what a starting ``serve --detach``, ``up`` or ``run`` waits for). Imported
by the handlers only; ``serve_foreground`` imports Prefect, the rest does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from flows._paths import (
    PRIVATE_UMASK,
    append_private,
    python_argv,
    runner_dir,
    state_dir_from,
    write_private,
)
from flows._prefect._connect import connect
from policies import UnattendedError


def state_dir() -> Path:
    """Return this process's state directory (``UNATTENDED_HOME``, default ``~/.unattended``)."""
    return state_dir_from(None, os.environ)


def _runner_pid_file() -> Path:
    return state_dir() / "runner.pid"


def _runner_lock_file() -> Path:
    return state_dir() / "runner.lock"


def _runner_serving_file() -> Path:
    """The pid of the runner once it serves (``serve_foreground``); removed as it stops."""
    return state_dir() / "runner.serving"


def runner_log() -> Path:
    """Return the runner's log, where a detached runner writes (and says what it died of)."""
    return state_dir() / "runner.log"


class RunnerError(UnattendedError):
    """The runner of this state directory did not start serving, or stopped serving."""

    code = "internal"


# ``runner_alive`` probes the lock with a shared lock held for an instant; an exclusive
# attempt that meets a probe is asked again, while a runner holds it for its lifetime.
_LOCK_PATIENCE_SECONDS = 1.0


def _lock_runner(path: Path) -> int | None:
    """Take the runner's lock for this process's lifetime; None when another runner holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    # Budget: every 10 ms for _LOCK_PATIENCE_SECONDS (a runner that is stopping lets go).
    try:
        Retrying(
            retry=retry_if_exception_type(BlockingIOError),
            stop=stop_after_delay(_LOCK_PATIENCE_SECONDS),
            wait=wait_fixed(0.01),
        )(fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except RetryError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd  # kept open (and locked) until the process exits, however it exits


def nudge() -> None:
    """Wake this state directory's runner, so it picks up a new or resumed run now."""
    from flows._prefect._nudge import nudge_runner

    pid = runner_pid()
    if pid is not None:
        nudge_runner(pid)


def runner_pid() -> int | None:
    """Return the pid of the runner that serves this state directory, if one does."""
    return _runner_pid() if runner_alive() else None


def runner_alive() -> bool:
    """Return whether a runner holds this state directory's lock (it does for its lifetime)."""
    path = _runner_lock_file()
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's own shared lock
    return False


def _runner_pid() -> int | None:
    try:
        return int(_runner_lock_file().read_text().strip())
    except (OSError, ValueError):
        return None


def runner_serving() -> int | None:
    """Return the pid of this state directory's runner once it serves (polls), else None."""
    pid = runner_pid()
    if pid is None:
        return None
    try:
        said = int(_runner_serving_file().read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if said == pid else None


def runner_log_tail() -> str:
    """Return the last line the runner logged (what it died of, usually), or a placeholder."""
    try:
        with runner_log().open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 8192))
            lines = log.read().decode(errors="replace").splitlines()
    except OSError:
        return "(no runner log)"
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return last or "(the runner log is empty)"


def start_detached_runner(query_seconds: float = 1.0) -> int:
    """Start ``unattended serve`` in its own session; return its pid once it serves.

    The runner runs apart from the caller's folder and user site (``python_argv``)
    from its private folder under the state directory (``runner_dir``). Idempotent
    (cron, scrontab): a runner that holds the lock is left alone and its pid returned
    once it serves; two starts racing each other end with one runner, because the
    second one cannot take the lock and exits.

    Raises:
        RunnerError: The runner exited before it served (the message ends with
            the last line of its log), or did not serve within
            ``UNATTENDED_RUNNER_START_SECONDS`` (it is stopped then).
    """
    connect(start=False)
    process = None
    if not runner_alive():
        home = state_dir()
        with os.fdopen(append_private(runner_log()), "ab") as handle:
            process = subprocess.Popen(
                python_argv("-m", "flows._cli", "serve", "--query-seconds", str(query_seconds)),
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=dict(os.environ),
                cwd=runner_dir(home),
                start_new_session=True,
                umask=PRIVATE_UMASK,  # what its flow runs write under the state directory
            )
        write_private(_runner_pid_file(), str(process.pid))
    return _until_serving(process)


# How often a starting runner is looked at.
_START_POLL_SECONDS = 0.1


def _until_serving(process: subprocess.Popen[bytes] | None) -> int:
    """Return the serving runner's pid; raise ``RunnerError`` if none will serve."""
    from flows._settings import Settings

    seconds = Settings.from_env(os.environ).runner_start_seconds
    give_up = time.monotonic() + seconds
    while True:
        pid = runner_serving()
        if pid is not None:
            return pid
        exited = process.poll() if process is not None else None
        # No runner holds the lock and ours (if any) has exited: none will serve. Ours
        # exited while another holds it: it lost a race to that one, which is waited for.
        if (exited is not None or process is None) and not runner_alive():
            which = (
                f"the runner exited (status {exited})"
                if process is not None
                else "the runner another start began exited"
            )
            raise RunnerError(
                f"{which} before it served; the last line of {runner_log()}: {runner_log_tail()}",
                details={"log": str(runner_log()), "exit_status": exited},
            )
        if time.monotonic() >= give_up:
            if process is not None:
                _stop_started(process)
            raise RunnerError(
                f"the runner did not serve within {seconds:g} s (UNATTENDED_RUNNER_START_SECONDS)"
                f"{'; it was stopped' if process is not None else ''}; the last line of "
                f"{runner_log()}: {runner_log_tail()}",
                details={"log": str(runner_log()), "seconds": seconds},
            )
        time.sleep(_START_POLL_SECONDS)


def _stop_started(process: subprocess.Popen[bytes]) -> None:
    """Stop a runner this command started that never served: its whole process group."""
    for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace)
            return


def ensure_runner() -> None:
    """Start the background runner unless one already serves this state directory."""
    if not runner_alive():
        pid = start_detached_runner()
        print(f"started the runner in the background (pid {pid}); log: {runner_log()}")


def stop_runner() -> bool:
    """Stop the background runner (before the server: the other order hangs)."""
    path = _runner_pid_file()
    pid = _runner_pid()
    if not runner_alive() or pid is None:
        path.unlink(missing_ok=True)
        return False
    os.killpg(pid, signal.SIGTERM)
    # Done when the lock is free (the runner has exited), not when its pid is gone: an
    # exited runner stays a zombie until init reaps it, and the next `serve` needs the lock.
    if not _until_unlocked(20.0):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        _until_unlocked(10.0)
    path.unlink(missing_ok=True)
    return True


def _until_unlocked(seconds: float) -> bool:
    """Wait until no runner holds this state directory's lock; False if one still does."""
    give_up = time.monotonic() + seconds
    while runner_alive():
        if time.monotonic() >= give_up:
            return False
        time.sleep(0.05)
    return True


# Flow-run processes inherit the runner's environment. The surrogate's matrices are
# small; threaded BLAS on a shared login node only contends (2-4x slower measured).
_SINGLE_THREADED_BLAS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


# Printed to the runner's log once Prefect's event stream is connected.
LISTENING_LINE = "woken by Prefect's event stream when a run is resumed or scheduled"
# Printed to the runner's log once it polls for runs.
SERVING_LINE = "serving: the runner polls for due runs"


def serve_foreground(query_seconds: float) -> int:
    """Serve campaign runs until SIGTERM or Ctrl-C."""
    from flows._prefect._nudge import NUDGE_SIGNAL

    # A nudge before the runner listens (it imports for seconds) must not end it: the
    # signal's default action is to terminate. The command then submits by itself.
    signal.signal(NUDGE_SIGNAL, signal.SIG_IGN)
    connect(start=False)
    for variable in _SINGLE_THREADED_BLAS:
        os.environ.setdefault(variable, "1")
    from flows._prefect._service import CampaignService

    # Flow runs inherit it: telemetry, work folders and Prefect's own files stay private.
    os.umask(PRIVATE_UMASK)
    _leave_callers_folder()
    if _lock_runner(_runner_lock_file()) is None:
        print(f"a runner already serves {state_dir()} (pid {_runner_pid()}); nothing to do")
        return 0
    # Flow runs inherit it: a failpoint scoped to the runner kills the whole tree.
    os.environ["UNATTENDED_RUNNER_PID"] = str(os.getpid())
    path = _runner_pid_file()
    write_private(path, str(os.getpid()))
    print(f"serving campaign runs from {os.environ.get('PREFECT_API_URL')}", flush=True)
    serving = _runner_serving_file()

    def say_serving() -> None:
        # What a starting `serve --detach`, `up` or `run` waits for (``runner_serving``).
        write_private(serving, str(os.getpid()))
        print(SERVING_LINE, flush=True)

    try:
        asyncio.run(
            CampaignService(query_seconds=query_seconds).serve(
                on_listening=lambda: print(LISTENING_LINE, flush=True), on_serving=say_serving
            )
        )
    except KeyboardInterrupt:
        pass
    finally:
        for mine in (path, serving):
            with contextlib.suppress(OSError):
                if mine.read_text().strip() == str(os.getpid()):
                    mine.unlink()
    return 0


def _leave_callers_folder() -> None:
    """Work from the runner's private folder, with the caller's folder off ``sys.path``.

    A runner started by hand (``unattended serve`` in a shared folder) would otherwise
    hand that folder to what it starts: multiprocessing's forkserver and spawned flow
    runs put their working folder first on ``sys.path``, Prefect's ``python -m
    prefect.engine`` too, and ``python -m flows._cli`` put it there for this process.
    """
    try:
        caller = os.getcwd()
    except OSError:  # a folder removed since: nothing of it can be imported
        caller = ""
    os.chdir(runner_dir(state_dir()))
    # Only the first entry: where ``-m`` and ``-c`` put it. The same folder further on
    # came from the installation (an editable install's .pth) and stays.
    if sys.path and sys.path[0] in ("", ".", caller):
        del sys.path[0]
