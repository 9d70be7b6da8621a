"""Point this process at a Prefect server before Prefect is imported.

``PREFECT_API_URL`` in the environment wins (a shared server, PostgreSQL behind
it). Otherwise the local server of the state directory is used, and started when
``start`` is set. Prefect reads its settings when imported, so callers connect
first and import ``flows._prefect._service`` (and with it Prefect) after.

The local server's basic-auth secret comes with its client variables
(``PREFECT_API_AUTH_STRING``), so every command, the runner it starts and the
flow-run processes the runner spawns are authenticated without being told.
``PREFECT_API_KEY`` (Prefect Cloud's bearer key) is dropped then: beside an auth
string some of Prefect's clients send the key and get 401. So does the server's
certificate (``PREFECT_API_SSL_CERT_FILE``): every client pins it, so the secret
goes to no process but the server holding its key (``flows._prefect._tls``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, MutableMapping

from flows._prefect._server import (
    ServerConfig,
    ServerError,
    client_env,
    load_server_config,
    running_server,
    start_server,
)
from flows._settings import Settings


def connect(
    env: MutableMapping[str, str] | None = None,
    *,
    start: bool = False,
    announce: Callable[[str], None] | None = None,
) -> str:
    """Return the API URL this process uses, setting ``env`` (``os.environ``) for it.

    ``announce`` is told when a local server is being started (it takes seconds).

    Raises:
        ServerError: No server is configured or running (and ``start`` is off).
    """
    environment = os.environ if env is None else env
    if environment.get("PREFECT_API_URL"):
        if environment.get("PREFECT_API_KEY") and environment.get("PREFECT_API_AUTH_STRING"):
            raise ServerError(
                "both PREFECT_API_KEY and PREFECT_API_AUTH_STRING are set; a self-hosted "
                "server with basic auth answers 401 to the key: unset PREFECT_API_KEY",
                details={"variables": ["PREFECT_API_KEY", "PREFECT_API_AUTH_STRING"]},
            )
        environment.setdefault("PREFECT_SERVER_ALLOW_EPHEMERAL_MODE", "false")
        return environment["PREFECT_API_URL"]
    config: ServerConfig = load_server_config(environment)
    # Whether it answers shows in the first request; a /health probe here costs a round trip.
    handle = running_server(config)
    if handle is None:
        if not start:
            raise ServerError(
                f"no Prefect server is running for this state directory ({config.state_dir}); "
                "'unattended up' starts it and the runner (or set PREFECT_API_URL to use "
                "another server)",
                details={"state_dir": str(config.state_dir)},
            )
        if announce is not None:
            announce(f"starting the local Prefect server on {config.api_url} ...")
        handle = start_server(config, timeout=Settings.from_env(environment).server_start_seconds)
    variables = client_env(handle)
    if "PREFECT_API_AUTH_STRING" in variables:
        environment.pop("PREFECT_API_KEY", None)
    else:
        # A server without auth: a secret left over from an earlier server must not linger.
        environment.pop("PREFECT_API_AUTH_STRING", None)
    if "PREFECT_API_SSL_CERT_FILE" not in variables:
        # A server started without TLS (an older version): no other server's pin applies.
        environment.pop("PREFECT_API_SSL_CERT_FILE", None)
    environment.update(variables)
    _refresh_prefect_settings()
    return handle.api_url


def ui_url(env: MutableMapping[str, str] | None = None) -> str:
    """Return the UI's base URL for links."""
    environment = os.environ if env is None else env
    if environment.get("PREFECT_UI_URL"):
        return environment["PREFECT_UI_URL"]
    api = environment.get("PREFECT_API_URL", "")
    return api[: -len("/api")] if api.endswith("/api") else api


def _refresh_prefect_settings() -> None:
    # If Prefect was imported already, make it read the environment again.
    if "prefect.context" in sys.modules:
        import prefect.context

        prefect.context.refresh_global_settings_context()
