"""Run a local Prefect server on the login node: start, status, stop, client env.

The server is Prefect's app as ``prefect server start`` serves it, behind a retry
of its busy-database answers (``flows._prefect._server_main``), in its own session
(so one signal stops its whole process group), with its own ``PREFECT_HOME`` under
the state dir,
analytics off (there is no network on a login node) and the UI pointed at the
right API URL. A PID file records which process is ours, with its start time,
so a recycled PID is never mistaken for the server.

Basic authentication is on by default: the server gets
``PREFECT_SERVER_API_AUTH_STRING`` and every client ``PREFECT_API_AUTH_STRING``,
both read from ``<state_dir>/prefect/api-auth`` (0600, generated on the first
start and kept, so co-approvers' copies stay valid across restarts). A server
started without it (``auth = false``, or by an older version whose PID file
does not say) is used without credentials.

The server speaks HTTPS with the state directory's own certificate
(``flows._prefect._tls``), and every client pins it (``PREFECT_API_SSL_CERT_FILE``):
the secret goes to no process but the one holding the key. A server started by a
version without TLS (its PID file does not say ``tls``) is spoken to over HTTP until
it is restarted.

The server process's environment is ``flows._prefect._server_env``; its PID file and
stopping its process group, ``flows._prefect._server_pid``.

Nothing here imports Prefect: the CLI's ``server status`` stays fast.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import ssl
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from flows._paths import (
    PRIVATE_UMASK,
    append_private,
    private_dir,
    python_argv,
    read_private_file,
    write_private_file,
)
from flows._prefect._server_env import server_env
from flows._prefect._server_pid import live_record, stop_group, write_pid_file
from flows._prefect._tls import CertificatePaths, client_context, ensure_certificate
from flows._settings import Settings
from policies import SpecInvalid, UnattendedError

# The settings (flows._settings) the loader reads, by server field.
SETTING_FOR: Mapping[str, str] = {
    "state_dir": "home",
    "host": "server_host",
    "port": "server_port",
    "database_url": "prefect_database_url",
    "auth": "server_auth",
}

# The user half of the basic-auth string; the secret half is generated.
AUTH_USER = "unattended"

_SQLITE_SCHEME = "sqlite+aiosqlite://"
_POSTGRES_SCHEME = "postgresql+asyncpg://"
_HEALTH_POLL_SECONDS = 0.2


class ServerError(UnattendedError):
    """The local Prefect server could not be started, reached or stopped."""

    code = "internal"


class ServerConfig(BaseModel):
    """Where and how the local Prefect server runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        max_length=253,
        description="Address the API and UI listen on; keep 127.0.0.1 and tunnel with ssh.",
    )
    port: int = Field(default=4200, ge=1, le=65535, description="TCP port of the API and UI.")
    state_dir: Path = Field(
        default_factory=lambda: Path.home() / ".unattended",
        description="Root of unattended's state; Prefect's home is <state_dir>/prefect.",
    )
    database_url: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        description=(
            "Prefect's database: None for SQLite at <state_dir>/prefect/prefect.db, or a "
            "postgresql+asyncpg:// URL (needed when many campaigns share one server)."
        ),
    )
    auth: bool = Field(
        default=True,
        description=(
            "Require basic authentication (the secret in <state_dir>/prefect/api-auth) for "
            "every API call and the UI; off only where the port is private to you."
        ),
    )
    stop_grace_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="How long stop waits after SIGTERM before it sends SIGKILL.",
    )

    @field_validator("database_url")
    @classmethod
    def _known_driver(cls, value: str | None) -> str | None:
        if value is None or value.startswith((_SQLITE_SCHEME, _POSTGRES_SCHEME)):
            return value
        # Prefect's server talks to PostgreSQL through asyncpg only; psycopg URLs fail late.
        raise ValueError(
            f"must start with {_POSTGRES_SCHEME!r} (or {_SQLITE_SCHEME!r}); "
            "other drivers do not work with the Prefect server"
        )

    @property
    def prefect_home(self) -> Path:
        """Return Prefect's home folder (profiles, UI build, SQLite database)."""
        return self.state_dir / "prefect"

    @property
    def storage_path(self) -> Path:
        """Return the folder where flow and task results are persisted."""
        return self.prefect_home / "storage"

    @property
    def log_path(self) -> Path:
        """Return the server's log file."""
        return self.prefect_home / "server.log"

    @property
    def pid_path(self) -> Path:
        """Return the PID file that marks a running server."""
        return self.prefect_home / "server.pid"

    @property
    def auth_path(self) -> Path:
        """Return the 0600 file holding the server's ``user:secret`` basic-auth string."""
        return self.prefect_home / "api-auth"

    @property
    def tls(self) -> CertificatePaths:
        """Return where the server's TLS key (0600) and certificate (0644) live."""
        return CertificatePaths(self.prefect_home / "tls")

    @property
    def api_url(self) -> str:
        """Return the API URL clients use."""
        return f"{self.ui_url}/api"

    @property
    def ui_url(self) -> str:
        """Return the UI's URL."""
        return _base_url(self.host, self.port, tls=True)

    def connection_url(self) -> str:
        """Return the database URL the server uses (may hold a password: do not print)."""
        if self.database_url is not None:
            return self.database_url
        return f"{_SQLITE_SCHEME}/{self.prefect_home / 'prefect.db'}"

    def database_label(self) -> str:
        """Return the database URL with any password masked, safe to print."""
        return redact_url(self.connection_url())


@dataclass(frozen=True)
class ServerHandle:
    """A running (or just spawned) server: its PID and where to reach it."""

    pid: int
    api_url: str
    ui_url: str
    prefect_home: Path
    storage_path: Path
    log_path: Path
    database: str  # redacted: safe to print
    # ``user:secret`` when the server requires basic auth; never printed or logged.
    auth_string: str | None = dataclasses.field(default=None, repr=False)
    # The certificate clients pin; None for a server started without TLS (an older version).
    cert_file: Path | None = None

    def verify(self) -> ssl.SSLContext | bool:
        """Return what an HTTP client verifies the server with (httpx's ``verify=``).

        A TLS context trusting this server's certificate only; True (the system's CAs,
        unused over plain HTTP) for a server started without TLS.
        """
        return True if self.cert_file is None else client_context(self.cert_file)

    @property
    def basic_auth(self) -> tuple[str, str] | None:
        """Return ``(user, secret)`` for an HTTP client (``httpx``'s ``auth=``), or None."""
        if self.auth_string is None:
            return None
        user, _, secret = self.auth_string.partition(":")
        return user, secret


@dataclass(frozen=True)
class ServerStatus:
    """What ``server_status`` found: a handle if our process runs, and its health."""

    handle: ServerHandle | None
    healthy: bool

    @property
    def running(self) -> bool:
        """Return whether the server process is alive."""
        return self.handle is not None


def load_server_config(env: Mapping[str, str], **overrides: Any) -> ServerConfig:
    """Build a ``ServerConfig`` from ``env`` (see ``SETTING_FOR``) and explicit overrides.

    Overrides win over the environment; ``None`` overrides are ignored so CLI
    options that were not given fall through. Raises ``SpecInvalid`` naming the
    variable (or option) and field when a value is bad.
    """
    values: dict[str, Any] = {}
    source: dict[str, str] = {}
    settings = Settings.from_env(env)
    variables = Settings.variables()
    for field, setting in SETTING_FOR.items():
        value = getattr(settings, setting)
        if value is not None:
            values[field] = value
            source[field] = f"environment variable {variables[setting]}"
    if "state_dir" not in values and env.get("HOME"):
        values["state_dir"] = Path(env["HOME"]) / ".unattended"
    for field, value in overrides.items():
        if value is not None:
            values[field] = value
            source[field] = f"option {field}"
    try:
        config = ServerConfig(**values)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "?"
        where = source.get(field, "server config")
        # Only the field and pydantic's message: the value may be a URL with a password.
        raise SpecInvalid(
            f"invalid server config: {field} ({where}): {error['msg']}",
            details={"field": field, "source": where},
        ) from None
    return config.model_copy(update={"state_dir": config.state_dir.expanduser()})


def redact_url(url: str) -> str:
    """Return ``url`` with the password of its user-info part replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    userinfo, _, hostpart = rest.partition("@")
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}@{hostpart}"


def flow_run_ui_url(ui_url: str, flow_run_id: object) -> str:
    """Return the flow-run page of the (default, v2) UI, where Resume lives."""
    # Prefect logs ``/runs/flow-run/<id>``, which opens the legacy UI.
    return f"{ui_url.rstrip('/')}/v2/runs/flow-run/{flow_run_id}"


def auth_string(config: ServerConfig) -> str:
    """Return the server's ``user:secret``, generating and storing it (0600) the first time.

    Raises:
        PermissionError: The file exists but others can read it (``chmod 600`` it).
    """
    try:
        return read_private_file(config.auth_path)
    except FileNotFoundError:
        pass
    value = f"{AUTH_USER}:{secrets.token_urlsafe(32)}"
    write_private_file(config.auth_path, value + "\n")
    return value


def client_env(handle: ServerHandle) -> dict[str, str]:
    """Return the variables a client, runner or flow-run process needs for ``handle``.

    With auth on this includes ``PREFECT_API_AUTH_STRING``: keep the result out of
    logs and command lines (the environment of a process is private to its user).
    """
    env = {
        "PREFECT_API_URL": handle.api_url,
        "PREFECT_UI_URL": handle.ui_url,
        "PREFECT_HOME": str(handle.prefect_home),
        "PREFECT_LOCAL_STORAGE_PATH": str(handle.storage_path),
        # A client that lost its API URL must fail, not quietly start a throwaway server.
        "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "false",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
    }
    if handle.cert_file is not None:
        # The only CA trusted for the API (Prefect's HTTP client and websockets, _rest):
        # a process on the port without the server's key fails the handshake before
        # any header, the secret included, is sent. Verification stays on.
        env["PREFECT_API_SSL_CERT_FILE"] = str(handle.cert_file)
        env["PREFECT_API_TLS_INSECURE_SKIP_VERIFY"] = "false"
    if handle.auth_string is not None:
        env["PREFECT_API_AUTH_STRING"] = handle.auth_string
    return env


def start_server(
    config: ServerConfig,
    *,
    wait: bool = True,
    timeout: float = 60.0,
    base_env: Mapping[str, str] | None = None,
) -> ServerHandle:
    """Start the Prefect server detached and, if ``wait``, until ``/health`` answers.

    Raises ``ServerError`` if our server already runs, the port is taken, the
    process exits early, or it is not healthy within ``timeout`` seconds (then
    it is stopped again). The log is ``config.log_path``.
    """
    status = server_status(config)
    if status.handle is not None:
        raise ServerError(
            f"a server already runs for this state dir (pid {status.handle.pid})",
            details={"pid": status.handle.pid, "pid_file": str(config.pid_path)},
        )
    _check_port_free(config.host, config.port)
    for folder in (config.prefect_home, config.storage_path):
        private_dir(folder)
    auth = auth_string(config) if config.auth else None
    ensure_certificate(config.tls, config.host)
    env = server_env(config, os.environ if base_env is None else base_env, auth=auth)
    # Prefect's app and uvicorn, as `prefect server start` runs them, behind a retry of
    # the busy-database 503 answers (flows._prefect._server_main).
    command = python_argv("-m", "flows._prefect._server_main")  # not the caller's folder
    with os.fdopen(append_private(config.log_path), "ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=config.prefect_home,
            start_new_session=True,  # own process group: stop signals all of it
            umask=PRIVATE_UMASK,  # its database, UI build and memo files stay private
        )
    _write_pid_file(config, process.pid)
    handle = _handle(config, process.pid, auth, tls=True)
    if wait:
        try:
            _wait_healthy(handle, process, timeout)
        except BaseException:
            stop_server(config)
            raise
    return handle


def server_status(config: ServerConfig, *, probe_timeout: float = 2.0) -> ServerStatus:
    """Return whether our server runs and answers ``/health``; drop a stale PID file."""
    handle = running_server(config)
    if handle is None:
        return ServerStatus(handle=None, healthy=False)
    return ServerStatus(handle=handle, healthy=_is_healthy(handle, probe_timeout))


def running_server(config: ServerConfig) -> ServerHandle | None:
    """Return our server's handle if its process runs (no ``/health`` round trip)."""
    record = live_record(config.pid_path)
    if record is None:
        return None
    started = _as_started(config, record)
    # A PID file without "auth" was written by a version that never turned auth on;
    # one without "tls" by a version whose server spoke plain HTTP.
    auth = auth_string(started) if record.get("auth") else None
    return _handle(started, int(record["pid"]), auth, tls=bool(record.get("tls")))


def stop_server(config: ServerConfig) -> bool:
    """Stop our server: SIGTERM its process group, SIGKILL after the grace; True if it ran."""
    record = live_record(config.pid_path)
    if record is None:
        return False
    stop_group(int(record["pid"]), config.stop_grace_seconds)
    config.pid_path.unlink(missing_ok=True)
    return True


def _base_url(host: str, port: int, *, tls: bool) -> str:
    where = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{where}:{port}"


def _handle(config: ServerConfig, pid: int, auth: str | None, *, tls: bool) -> ServerHandle:
    ui_url = _base_url(config.host, config.port, tls=tls)
    return ServerHandle(
        pid=pid,
        api_url=f"{ui_url}/api",
        ui_url=ui_url,
        prefect_home=config.prefect_home,
        storage_path=config.storage_path,
        log_path=config.log_path,
        database=config.database_label(),
        auth_string=auth,
        cert_file=config.tls.cert if tls else None,
    )


def _as_started(config: ServerConfig, record: Mapping[str, Any]) -> ServerConfig:
    """Return ``config`` with the host, port and database the running server was given."""
    updates = {k: record[k] for k in ("host", "port", "database_url") if k in record}
    return config.model_copy(update=updates)


def _check_port_free(host: str, port: int) -> None:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise ServerError(f"cannot resolve server host {host!r}", details={"host": host}) from None
    family, socktype, proto, _, address = infos[0]
    with socket.socket(family, socktype, proto) as probe:
        # Same option uvicorn sets, so a port in TIME_WAIT is not reported as taken.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError:
            raise ServerError(
                f"port {port} on {host} is already in use; pick another with --port",
                details={"host": host, "port": port},
            ) from None


def _write_pid_file(config: ServerConfig, pid: int) -> None:
    # The password-free label only: the PID file must not hold a secret.
    write_pid_file(
        config.pid_path,
        pid,
        host=config.host,
        port=config.port,
        database_url=config.database_label(),
        auth=config.auth,  # whether; the secret itself stays in its own file
        tls=True,  # the server speaks HTTPS with <prefect home>/tls/server.pem
    )


def _is_healthy(handle: ServerHandle, timeout: float) -> bool:
    """Return whether our server answers ``/health`` (over TLS: only the key's holder can)."""
    import httpx  # here: with its command line it costs 0.1-0.3 s, and connect() never probes

    try:
        response = httpx.get(f"{handle.api_url}/health", timeout=timeout, verify=handle.verify())
    except httpx.HTTPError:
        return False
    return response.status_code == httpx.codes.OK


def _wait_healthy(handle: ServerHandle, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerError(
                f"the Prefect server exited with code {process.returncode} while starting; "
                f"see {handle.log_path}",
                details={"returncode": process.returncode, "log": str(handle.log_path)},
            )
        if _is_healthy(handle, timeout=1.0):
            return
        time.sleep(_HEALTH_POLL_SECONDS)
    raise ServerError(
        f"the Prefect server did not answer {handle.api_url}/health within {timeout:g} s; "
        f"see {handle.log_path}",
        details={"timeout": timeout, "log": str(handle.log_path)},
    )
