"""Point this process at a Prefect server before Prefect is imported.

``PREFECT_API_URL`` in the environment wins (a shared server, PostgreSQL behind
it). Otherwise the local server of the state directory is used, and started when
``start`` is set. Prefect reads its settings when imported, so callers connect
first and import ``flows._service`` (and with it Prefect) after.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

from flows._server import (
    ServerConfig,
    ServerError,
    client_env,
    load_server_config,
    server_status,
    start_server,
)


def connect(env: MutableMapping[str, str] | None = None, *, start: bool = False) -> str:
    """Return the API URL this process uses, setting ``env`` (``os.environ``) for it.

    Raises:
        ServerError: No server is configured or running (and ``start`` is off).
    """
    environment = os.environ if env is None else env
    if environment.get("PREFECT_API_URL"):
        environment.setdefault("PREFECT_SERVER_ALLOW_EPHEMERAL_MODE", "false")
        return environment["PREFECT_API_URL"]
    config: ServerConfig = load_server_config(environment)
    status = server_status(config)
    handle = status.handle
    if handle is None:
        if not start:
            raise ServerError(
                "no Prefect server is running for this state directory; "
                "start one with 'unattended server start' (or set PREFECT_API_URL)",
                details={"state_dir": str(config.state_dir)},
            )
        print(
            f"starting the local Prefect server on {config.api_url} ...",
            file=sys.stderr,
            flush=True,
        )
        handle = start_server(config)
    environment.update(client_env(handle))
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
