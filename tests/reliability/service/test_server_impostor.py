"""No credential reaches a process that took the port of the owner's dead server.

A real server of a fresh state directory (basic auth on, TLS with its own
certificate) is SIGKILLed. Another local user (a Unix account this test creates
when it runs as root; it skips loudly otherwise) binds the freed port with a
squatter that does what it can to read a secret: it speaks TLS with a certificate
of its own for 127.0.0.1 and records, per connection, whether a TLS ClientHello
came, whether a handshake succeeded and every byte it could read in clear.

* The owner's runner (a real ``unattended serve``) and a command (``unattended
  status``) keep trying the port: the squatter sees their connections, each one a
  ClientHello, and no handshake completes, so no HTTP byte (no ``Authorization``
  header) reaches it. The command fails saying the process is not the server; the
  runner stays up and reconnects once the owner's server is back.
* A co-approver following docs/server.md (their ``PREFECT_API_URL``, the credential
  they were given, a copy of the certificate in ``PREFECT_API_SSL_CERT_FILE``)
  sends the squatter nothing either, and ``unattended approvals`` fails with that
  message instead of answering "no approvals pending" for the squatter.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from flows._cli._runner import LISTENING_LINE
from flows._prefect._server import ServerConfig, ServerHandle, client_env, start_server, stop_server
from flows._prefect._tls import CertificatePaths, make_certificate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]

SQUATTER_USER = "unattended-squatter"
# Stdlib only, readable by every user (the project's venv may live under a private home).
SYSTEM_PYTHON = Path("/usr/bin/python3")
NOT_THE_SERVER = "did not prove it is the Prefect server"

SQUATTER = r"""
import json, os, signal, socket, ssl, sys, threading

port, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
lock = threading.Lock()

def say(**event):
    with lock:
        print(json.dumps(event), flush=True)

context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(64)
listener.settimeout(0.2)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
say(event="listening", uid=os.getuid())

def take(conn):
    record = {"event": "connection", "client_hello": False, "handshake": False, "clear": ""}
    try:
        conn.settimeout(5)
        first = conn.recv(5, socket.MSG_PEEK)
        record["client_hello"] = first[:1] == b"\x16" and first[1:2] == b"\x03"
        if not record["client_hello"]:
            record["clear"] += conn.recv(65536).decode("latin-1")  # plain HTTP, as it came
            return
        try:
            tls = context.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"
            return
        record["handshake"] = True
        record["clear"] += tls.recv(65536).decode("latin-1")  # what a fooled client sends
    except OSError as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
        say(**record)

while not stop.is_set():
    try:
        conn, _ = listener.accept()
    except TimeoutError:
        continue
    threading.Thread(target=take, args=(conn,), daemon=True).start()
listener.close()
say(event="stopped")
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _other_user(name: str) -> tuple[int, int]:
    """Return the uid and gid of local account ``name``, creating it (root only)."""
    if os.geteuid() != 0:
        pytest.skip(
            f"IMPOSTOR TEST SKIPPED: the squatter must run as another Unix user ({name}); "
            "creating one needs root (run the test as root, or in the CI container)"
        )
    if not SYSTEM_PYTHON.exists() or shutil.which("setpriv") is None:
        pytest.skip(f"IMPOSTOR TEST SKIPPED: needs {SYSTEM_PYTHON} and setpriv (util-linux)")
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode not in (0, 9):  # 9: the account exists already
        pytest.skip(f"IMPOSTOR TEST SKIPPED: useradd {name} failed: {made.stderr.strip()}")
    found = subprocess.run(["id", "-u", name], capture_output=True, text=True, check=True)
    group = subprocess.run(["id", "-g", name], capture_output=True, text=True, check=True)
    return int(found.stdout), int(group.stdout)


@dataclass
class Squatter:
    """A process of another user on the dead server's port, and what it saw."""

    process: subprocess.Popen[str]
    events: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    seen: list[dict[str, Any]] = field(default_factory=list)

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.events.put(json.loads(line))

    def wait_for(self, condition: Callable[[list[dict[str, Any]]], bool], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not condition(self.seen):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the squatter did not see what was expected: {self.seen}")
            with contextlib.suppress(queue.Empty):
                self.seen.append(self.events.get(timeout=left))

    @property
    def connections(self) -> list[dict[str, Any]]:
        return [event for event in self.seen if event["event"] == "connection"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        while not self.events.empty():
            self.seen.append(self.events.get())


@contextlib.contextmanager
def squatter_on(port: int) -> Iterator[Squatter]:
    """Run the squatter as another user on ``port`` with a certificate of its own."""
    uid, gid = _other_user(SQUATTER_USER)
    folder = Path(tempfile.mkdtemp(prefix="squatter-"))
    try:
        os.chmod(folder, 0o755)  # the other user reads its script and certificate here
        paths = CertificatePaths(folder / "tls")
        make_certificate(paths, "127.0.0.1")  # a valid certificate for 127.0.0.1, not the pin
        os.chmod(paths.folder, 0o755)
        os.chmod(paths.key, 0o644)
        script = folder / "squatter.py"
        script.write_text(SQUATTER)
        os.chmod(script, 0o644)
        process = subprocess.Popen(
            [
                "setpriv",
                f"--reuid={uid}",
                f"--regid={gid}",
                "--clear-groups",
                "--",
                str(SYSTEM_PYTHON),
                "-I",
                str(script),
                str(port),
                str(paths.cert),
                str(paths.key),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=folder,
        )
        squatter = Squatter(process)
        threading.Thread(target=squatter.read, daemon=True).start()
        try:
            squatter.wait_for(lambda seen: any(e["event"] == "listening" for e in seen), 30)
            listening = next(e for e in squatter.seen if e["event"] == "listening")
            assert listening["uid"] == uid != os.getuid()
            yield squatter
        finally:
            squatter.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _assert_nothing_readable_reached(squatter: Squatter, *secrets: str) -> None:
    """Every connection was a TLS ClientHello whose handshake failed; nothing came in clear."""
    connections = squatter.connections
    assert connections, "no client tried the port: the test shows nothing"
    assert all(c["client_hello"] for c in connections), connections
    assert not any(c["handshake"] for c in connections), connections
    clear = "".join(c["clear"] for c in connections)
    assert clear == ""  # no HTTP byte at all: no request line, no Authorization header
    for secret in secrets:
        assert secret not in json.dumps(squatter.seen)


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
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


def _kill_server(handle: ServerHandle) -> None:
    os.killpg(handle.pid, signal.SIGKILL)
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(handle.pid).wait(timeout=30)  # reaped: it was started by this process


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


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flows._cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_runner_and_a_command_send_nothing_to_a_process_on_the_dead_servers_port(
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
        _kill_server(handle)
        with squatter_on(config.port) as squatter:
            command = _cli(env, "status")
            # The runner keeps trying (it looks every second or two): more than the command's one.
            squatter.wait_for(lambda seen: len([e for e in seen if "client_hello" in e]) >= 3, 60)
        _assert_nothing_readable_reached(squatter, secret)
        assert command.returncode != 0
        assert NOT_THE_SERVER in command.stderr, command.stderr
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


def _co_approver_env(
    tmp_path: Path, handle: ServerHandle, credential: str, cert_copy: Path | None
) -> dict[str, str]:
    """The shell of a co-approver set up as docs/server.md says (their own home, no state)."""
    home = tmp_path / "co-approver"
    home.mkdir(exist_ok=True)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PREFECT_", "UNATTENDED_"))
    }
    env.update(
        {
            "HOME": str(home),
            "PREFECT_API_URL": handle.api_url,
            "PREFECT_API_AUTH_STRING": credential,
        }
    )
    if cert_copy is not None:
        env["PREFECT_API_SSL_CERT_FILE"] = str(cert_copy)
    return env


def test_the_co_approver_recipe_sends_nothing_to_a_squatter_and_says_why(
    owner: tuple[ServerConfig, ServerHandle, dict[str, str]], tmp_path: Path
) -> None:
    config, handle, _ = owner
    credential = handle.auth_string  # what the owner handed over
    assert credential is not None
    cert_copy = tmp_path / "owner-server.pem"
    shutil.copy(config.tls.cert, cert_copy)
    env = _co_approver_env(tmp_path, handle, credential, cert_copy)
    # The recipe works against the owner's server ...
    working = _cli(env, "approvals")
    assert working.returncode == 0, working.stderr
    assert "no approvals pending" in working.stdout

    _kill_server(handle)
    with squatter_on(config.port) as squatter:
        answered = _cli(env, "approvals")
        squatter.wait_for(lambda seen: any("client_hello" in e for e in seen), 30)
    # ... and against a squatter it sends nothing and fails saying so.
    _assert_nothing_readable_reached(squatter, credential)
    assert answered.returncode != 0
    assert "no approvals pending" not in answered.stdout.lower()
    assert NOT_THE_SERVER in answered.stderr, answered.stderr
    assert str(cert_copy) in answered.stderr  # names the certificate it pinned


def test_a_co_approver_without_the_certificate_is_refused_by_the_real_server(
    owner: tuple[ServerConfig, ServerHandle, dict[str, str]], tmp_path: Path
) -> None:
    _, handle, _ = owner
    assert handle.auth_string is not None
    env = _co_approver_env(tmp_path, handle, handle.auth_string, None)
    answered = _cli(env, "approvals")
    assert answered.returncode != 0
    assert NOT_THE_SERVER in answered.stderr
    assert "set PREFECT_API_SSL_CERT_FILE" in answered.stderr
