"""Send the server secret only to the server this state directory started.

The local Prefect server listens on 127.0.0.1:PORT. When it dies, the port is free
for any local user, and Prefect's clients keep sending ``Authorization: Basic
<secret>`` to whatever answers there: a runner left up would hand the secret to
the first process that binds the port. So before credentials go to the local
server's address, ``check_peer`` makes sure the process listening there is the
one whose PID (and start time) this state directory's server record names:

* the recorded server process is alive and is the one recorded (same start time);
  while it lives it holds the listening socket, and Linux lets no other user bind
  the same address (``SO_REUSEPORT`` needs the same uid);
* on first use, and whenever that process changed (a restart), the listening
  socket on the port is found among the server's (or its children's) sockets.

Otherwise nothing is sent: the command fails with what to do, and a runner's
Prefect client sees a connection error, so it waits and retries, as for a server
that is down, until the right server is back.

The check applies to requests that carry credentials to the local server's
``host:port``; a remote server (``PREFECT_API_URL`` elsewhere) is authenticated by
TLS, not here. ``guard_prefect_clients`` puts the check in front of every httpx client
(Prefect's included) and every websocket connection (events, logs) in this process. This
module touches Prefect's and websockets' internals (written against Prefect 3.9 and
websockets 16): other versions are refused with a warning and left unguarded.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import psutil

from flows._prefect._server import SERVER_PID_FILE, ServerError, same_process

LOOPBACK: Final = frozenset({"127.0.0.1", "localhost", "::1"})
SUPPORTED_PREFECT: Final = ("3.9.",)

_log = logging.getLogger(__name__)


class PeerRefusedError(ServerError):
    """The process at the local server's address is not this state directory's server."""


@dataclass(frozen=True)
class _Verified:
    pid: int
    mark: Mapping[str, Any]  # the PID file's record: what identifies the process


_lock = threading.Lock()
# The server's PID file -> the server process found listening at its address.
_verified: dict[str, _Verified] = {}


def _same_process(known: _Verified) -> bool:
    return same_process(known.pid, known.mark)


def _listens(pid: int, port: int) -> bool:
    """Return whether ``pid`` (or one of its descendants) has a listening socket on ``port``."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return False
    for process in family:
        try:
            sockets = process.net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(
            s.status == psutil.CONN_LISTEN and s.laddr and s.laddr.port == port for s in sockets
        ):
            return True
    return False


def _record(pid_file: str) -> tuple[_Verified | None, int | None]:
    """Return the server process the PID file names (None unless it still runs), and its port."""
    try:
        data = json.loads(Path(pid_file).read_text(encoding="utf-8"))
        known = _Verified(int(data["pid"]), dict(data))
        port = int(data["port"]) if data.get("port") is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return None, None
    return (known if _same_process(known) else None), port


def verify_server(pid_file: str, host: str, port: int) -> None:
    """Raise ``PeerRefusedError`` unless the server ``pid_file`` records listens on ``port``."""
    with _lock:
        known = _verified.get(pid_file)
    if known is not None and _same_process(known):
        return
    where = f"{host}:{port}"
    found, _ = _record(pid_file)
    if found is None:
        raise PeerRefusedError(
            f"the Prefect server this state directory started is not running, so the server "
            f"secret is not sent to whatever listens on {where} now; start it with "
            "'unattended server start' (a runner waits for it by itself)",
            details={"pid_file": pid_file, "port": port},
        )
    if not _listens(found.pid, port):
        raise PeerRefusedError(
            f"the process listening on {where} is not the Prefect server this state directory "
            f"started (pid {found.pid}), so the server secret is not sent there; stop that "
            "process or choose another port (UNATTENDED_SERVER_PORT), then 'unattended server "
            "stop' and 'unattended server start'",
            details={"pid_file": pid_file, "port": port, "pid": found.pid},
        )
    with _lock:
        _verified[pid_file] = found


def check_peer(url: str, env: Mapping[str, str] | None = None) -> None:
    """Refuse (``PeerRefusedError``) to send credentials to ``url`` unless our server is there.

    A no-op when no secret is configured, when this process was not pointed at a
    server of ours (``SERVER_PID_FILE`` unset: a server given by ``PREFECT_API_URL``),
    or when ``url`` is not that server's loopback address.
    """
    environment = os.environ if env is None else env
    pid_file = environment.get(SERVER_PID_FILE)
    if not pid_file or not environment.get("PREFECT_API_AUTH_STRING"):
        return
    parts = urlsplit(url)
    if parts.hostname not in LOOPBACK:
        return
    port = parts.port or (443 if parts.scheme in ("https", "wss") else 80)
    with _lock:
        cached = pid_file in _verified
    if not cached:
        _, recorded = _record(pid_file)
        if recorded is not None and recorded != port:
            return  # not our server's address: its clients do not point there
    verify_server(pid_file, parts.hostname or "", port)


def forget_verified() -> None:
    """Drop what was verified (tests; a server restarted in-process)."""
    with _lock:
        _verified.clear()


_installed = False


def guard_prefect_clients() -> None:
    """Put ``check_peer`` in front of Prefect's HTTP clients and all websocket connections."""
    global _installed
    if _installed:
        return
    import prefect
    import websockets.asyncio.client as ws_client

    if not prefect.__version__.startswith(SUPPORTED_PREFECT) or not hasattr(
        ws_client.connect, "create_connection"
    ):
        _log.warning(
            "Prefect %s: the server-secret guard is written for Prefect 3.9 and websockets "
            "16; requests are not checked",
            prefect.__version__,
        )
        return
    import httpx

    def checked(request: httpx.Request) -> None:
        if "authorization" not in request.headers:
            return
        try:
            check_peer(str(request.url))
        except PeerRefusedError as exc:
            # A connection error to Prefect's client: it retries, and a runner waits.
            raise httpx.ConnectError(exc.message, request=request) from exc

    # httpx's own clients, not Prefect's subclasses: Prefect also sends through
    # ``super().send`` (its CSRF token request), and those calls must be checked too.
    async_send = httpx.AsyncClient.send
    sync_send = httpx.Client.send

    async def guarded_async_send(self: Any, request: httpx.Request, *args: Any, **kw: Any) -> Any:
        checked(request)
        return await async_send(self, request, *args, **kw)

    def guarded_sync_send(self: Any, request: httpx.Request, *args: Any, **kw: Any) -> Any:
        checked(request)
        return sync_send(self, request, *args, **kw)

    create_connection = ws_client.connect.create_connection

    async def guarded_create_connection(self: Any) -> Any:
        # Every (re)connection of every websocket client; the handshake carries the secret.
        uri = str(self.uri).replace("ws://", "http://", 1).replace("wss://", "https://", 1)
        try:
            check_peer(uri)
        except PeerRefusedError as exc:
            # As a refused connection: websocket clients retry it like a server that is down.
            raise ConnectionRefusedError(exc.message) from exc
        return await create_connection(self)

    httpx.AsyncClient.send = guarded_async_send  # type: ignore[method-assign]
    httpx.Client.send = guarded_sync_send  # type: ignore[method-assign]
    ws_client.connect.create_connection = guarded_create_connection  # type: ignore[method-assign]
    _installed = True
