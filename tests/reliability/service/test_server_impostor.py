"""The secret goes only to the owner's server: not to whoever takes its port when it dies.

A real server of a fresh state directory (basic auth on) and a real ``unattended
serve`` runner process. The server is SIGKILLed; another process (here a thread of
the test, as another local user would) listens on the freed port and records every
byte it receives, while the runner goes on polling and a command (``unattended
status``) is run. No request reaches the impostor with the secret; the command
fails saying why; the runner stays up and reconnects once the owner's server is
started again on the same port.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from flows._cli._service import LISTENING_LINE
from flows._prefect._server import ServerConfig, ServerHandle, client_env, start_server, stop_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240, func_only=True)]

IMPOSTOR_SECONDS = 8.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Impostor(threading.Thread):
    """Listen on ``port`` and keep every byte any client sends."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(64)
        self.listener.settimeout(0.2)
        self.received = bytearray()
        self.connections = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.settimeout(1.0)
            try:
                self.received += conn.recv(65536)
            except OSError:
                pass
            finally:
                conn.close()
        self.listener.close()


def _wait(condition, seconds: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _talks_to(pid: int, port: int) -> bool:
    """Return whether process ``pid`` has an established connection to ``port``."""
    try:
        sockets = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(s.raddr and s.raddr.port == port and s.status == "ESTABLISHED" for s in sockets)


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[tuple[ServerConfig, ServerHandle, dict[str, str]]]:
    """A server of a fresh state directory with auth on, and the environment of its owner."""
    port = _free_port()
    config = ServerConfig(state_dir=tmp_path / "home", port=port, auth=True)
    handle = start_server(config)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PREFECT_", "UNATTENDED_"))
    }
    env.update(client_env(handle))
    env.update({"UNATTENDED_HOME": str(config.state_dir), "UNATTENDED_SERVER_PORT": str(port)})
    try:
        yield config, handle, env
    finally:
        stop_server(config)


def test_no_credential_reaches_a_process_that_took_the_dead_servers_port(
    owner: tuple[ServerConfig, ServerHandle, dict[str, str]], tmp_path: Path
) -> None:
    config, handle, env = owner
    secret = handle.auth_string
    assert secret is not None
    log = tmp_path / "runner.log"
    with log.open("wb") as out:
        runner = subprocess.Popen(
            [sys.executable, "-m", "flows._cli", "serve", "--query-seconds", "0.5"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # Up and listening to Prefect's event stream: its runner, event emitter and watch
        # loop all talk to the server now.
        _wait(lambda: LISTENING_LINE in log.read_text(), 90, "the runner to be serving")
        os.killpg(handle.pid, signal.SIGKILL)
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(handle.pid).wait(timeout=30)  # reaped: it was started by this process

        impostor = Impostor(config.port)
        impostor.start()
        command = subprocess.run(
            [sys.executable, "-m", "flows._cli", "status"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        time.sleep(IMPOSTOR_SECONDS)  # the runner polls every 0.5 s meanwhile: a window, not a wait
        impostor.stop.set()
        impostor.join(5)

        token = base64.b64encode(secret.encode())
        assert b"authorization" not in bytes(impostor.received).lower()
        assert token not in impostor.received
        assert secret.encode() not in impostor.received
        assert impostor.connections == 0  # refused before connecting: nothing to read either
        assert command.returncode != 0
        assert "secret is not sent" in command.stderr + command.stdout
        assert runner.poll() is None, log.read_text()

        # The owner's server comes back on the same port: the runner reconnects by itself.
        restarted = start_server(config)
        _wait(lambda: _talks_to(runner.pid, config.port), 60, "the runner to reconnect")
        assert runner.poll() is None, log.read_text()
        assert restarted.pid != handle.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(runner.pid, signal.SIGTERM)
        try:
            runner.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait(timeout=30)
