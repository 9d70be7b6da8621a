"""The runner's lock: one runner a state directory, probes never turn one away, stop waits.

``runner.lock`` is held (``flock``) by the runner for its lifetime; ``runner_alive``
probes it with a shared lock held for an instant. Found as a flaky recovery test: a
runner started while ``serve --detach`` probed the lock (it polls until the runner
serves) met the probe, took it for another runner and exited, and nothing served.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flows._cli import _runner


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("UNATTENDED_HOME", str(tmp_path))
    return tmp_path


def _hold(path: Path, how: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, how | fcntl.LOCK_NB)
    return fd


def test_a_probe_does_not_turn_a_starting_runner_away(home: Path) -> None:
    lock = home / "runner.lock"
    probe = _hold(lock, fcntl.LOCK_SH)  # what runner_alive holds, stretched to 0.2 s
    threading.Timer(0.2, os.close, (probe,)).start()
    fd = _runner._lock_runner(lock)
    try:
        assert fd is not None
        assert _runner.runner_alive()
        assert lock.read_text() == str(os.getpid())
    finally:
        if fd is not None:
            os.close(fd)
    assert not _runner.runner_alive()


def test_a_runner_holding_the_lock_turns_a_second_one_away(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_runner, "_LOCK_PATIENCE_SECONDS", 0.2)
    lock = home / "runner.lock"
    held = _hold(lock, fcntl.LOCK_EX)
    try:
        started = time.monotonic()
        assert _runner._lock_runner(lock) is None
        assert time.monotonic() - started >= 0.2
    finally:
        os.close(held)


_SLOW_RUNNER = """
import os, signal, sys, time
from pathlib import Path
from flows._cli import _runner
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
fd = _runner._lock_runner(Path(sys.argv[1]))
assert fd is not None
print("serving", flush=True)
while not stopping:
    time.sleep(0.01)
time.sleep(0.5)  # a graceful shutdown takes a while
"""


def test_stop_returns_once_the_lock_is_free_so_the_next_runner_can_serve(home: Path) -> None:
    """``serve --stop`` then ``serve --detach`` (a restart script, cron) must end with a runner."""
    runner = subprocess.Popen(
        [sys.executable, "-c", _SLOW_RUNNER, str(home / "runner.lock")],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # stop_runner signals the runner's process group
    )
    try:
        assert runner.stdout is not None
        assert runner.stdout.readline().strip() == "serving"
        assert _runner.runner_alive()
        assert _runner.stop_runner()
        assert not _runner.runner_alive()
        fd = _runner._lock_runner(home / "runner.lock")
        assert fd is not None
        os.close(fd)
    finally:
        runner.kill()
        runner.wait()
