"""``unattended up``: the one cron line that brings back whatever is missing.

Through the real command line, with its own server (it is killed and started
again; the session's server is left alone): after a reboot (everything killed)
``up`` alone starts the server, then the runner; run again it does nothing; each
time it exits 0.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from flows._prefect._server import ServerHandle, client_env, load_server_config, running_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]

PROJECT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LoginNode:
    """A shell on a login node whose state directory is ``home``."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("UNATTENDED_", "PREFECT_")) and k != "DO_NOT_TRACK"
        }
        self.env |= {
            "UNATTENDED_HOME": str(home),
            "UNATTENDED_SERVER_HOST": "127.0.0.1",
            "UNATTENDED_SERVER_PORT": str(_free_port()),
        }

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flows._cli", *args],
            cwd=PROJECT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )

    def server_pid(self) -> int | None:
        handle = running_server(load_server_config(self.env))
        return handle.pid if handle is not None else None

    def runner_pid(self) -> int | None:
        """Return the live runner's pid (its lock file is rewritten as it starts: read again)."""
        lock = self.home / "runner.lock"
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError, ValueError, psutil.Error):
                pid = int(lock.read_text().strip())
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    return pid
            if not lock.exists() or time.monotonic() > deadline:
                return None
            time.sleep(0.1)

    def kill_everything(self) -> None:
        """What a reboot does: every process gone at once, no clean stop."""
        for pid in (self.runner_pid(), self.server_pid()):
            if pid is None:
                continue
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(pid)
                family = [root, *root.children(recursive=True)]
                for process in family:
                    with contextlib.suppress(psutil.Error):
                        process.send_signal(signal.SIGKILL)
                psutil.wait_procs(family, timeout=30)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[LoginNode]:
    login = LoginNode(tmp_path / "home")
    try:
        yield login
    finally:
        login.kill_everything()  # a reboot again: nothing here needs a clean stop


class TestUp:
    def test_after_a_reboot_up_alone_brings_back_the_server_then_the_runner(
        self, node: LoginNode
    ) -> None:
        first = node.cli("up")
        assert first.returncode == 0, first.stderr
        assert "Prefect server started" in first.stdout
        assert "runner started in the background" in first.stdout
        server, runner = node.server_pid(), node.runner_pid()
        assert server is not None
        assert runner is not None

        again = node.cli("up")
        assert again.returncode == 0, again.stderr
        assert "Prefect server already running" in again.stdout
        assert f"runner already serving (pid {runner})" in again.stdout
        assert (node.server_pid(), node.runner_pid()) == (server, runner)

        node.kill_everything()
        assert node.server_pid() is None
        assert not psutil.pid_exists(runner)

        back = node.cli("up")
        assert back.returncode == 0, back.stderr
        assert "Prefect server started" in back.stdout
        assert "runner started in the background" in back.stdout
        assert node.server_pid() not in (None, server)
        assert node.runner_pid() not in (None, runner)
        assert node.cli("server", "status").returncode == 0

    def test_serve_detach_with_a_runner_up_says_so_and_starts_nothing(
        self, node: LoginNode, prefect_server: ServerHandle
    ) -> None:
        # The session's server: this is about the runner (the test above starts servers).
        node.env |= client_env(prefect_server)
        assert node.cli("serve", "--detach").returncode == 0
        runner = node.runner_pid()
        assert runner is not None

        detached = node.cli("serve", "--detach")

        assert detached.returncode == 0, detached.stderr
        assert f"a runner already serves this state directory (pid {runner})" in detached.stdout
        assert "started" not in detached.stdout.replace("nothing started", "")
        assert node.runner_pid() == runner
