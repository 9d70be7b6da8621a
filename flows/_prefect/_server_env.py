"""The environment the local Prefect server process runs with.

``server_env`` gives the server its own ``PREFECT_HOME`` under the state directory,
its listening address, database, TLS key and certificate, the basic-auth secret, the
UI pointed at the right API URL, analytics off, and the Prefect services the project
never needs off (``UNUSED_SERVICES``). ``flows._prefect._server`` starts the process
with it; what a client needs to reach the server is ``client_env`` there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from flows._prefect._tls import SERVER_CERT_VARIABLE, SERVER_KEY_VARIABLE

if TYPE_CHECKING:
    from flows._prefect._server import ServerConfig

__all__ = ["UNUSED_SERVICES", "server_env"]

# Prefect server services this project never needs, turned off in the server's
# environment. Each is a loop of its own against Prefect's database; on SQLite every
# transaction that also writes is one more chance for a 503 "database is locked" on
# a UI Resume, and on 2 cores every loop takes CPU from the API. Kept on: late runs
# (the UI shows a run nobody takes as Late), cancellation cleanup (a run stuck in
# Cancelling ends Cancelled; a cancelled run's task runs end), the foreman
# (deployments read Not Ready when no runner polls), the repossessor (expired
# deployment-concurrency leases: ONE_RUN_AT_A_TIME), the task-run recorder (the
# UI's view of a round's steps) and the event persister (the UI's event feed).
# A variable set in the environment of ``unattended server start`` wins.
UNUSED_SERVICES: Mapping[str, str] = {
    "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": (
        "runs from deployment schedules: campaign deployments have none; runs are "
        "created by submit and the runner's watchdog"
    ),
    "PREFECT_SERVER_SERVICES_PAUSE_EXPIRATIONS_ENABLED": (
        "fails runs paused past a Prefect timeout: suspends pass none (approval "
        "deadlines are the runner's, recorded with the request)"
    ),
    "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": (
        "automations and their actions: the project creates none; its notices and "
        "orphan detection are its own"
    ),
    "PREFECT_SERVER_SERVICES_CLEANUP_RECONCILER_ENABLED": (
        "workers' cleanup leases: no workers or work pools, a runner serves the runs"
    ),
}


def server_env(
    config: ServerConfig, base_env: Mapping[str, str], *, auth: str | None = None
) -> dict[str, str]:
    """Return the environment the server process runs with (``auth``: ``user:secret``)."""
    env = {
        k: v
        for k, v in base_env.items()
        if not k.startswith("PREFECT_") and k not in (SERVER_CERT_VARIABLE, SERVER_KEY_VARIABLE)
    }
    env.update(
        {
            "PREFECT_HOME": str(config.prefect_home),
            "PREFECT_SERVER_API_HOST": config.host,
            "PREFECT_SERVER_API_PORT": str(config.port),
            # The UI calls this URL from the browser; left alone it says port 4200.
            "PREFECT_UI_API_URL": config.api_url,
            "PREFECT_UI_URL": config.ui_url,
            "PREFECT_API_URL": config.api_url,
            "PREFECT_SERVER_DATABASE_CONNECTION_URL": config.connection_url(),
            # uvicorn serves TLS with these (flows._prefect._server_main); code in the
            # server that calls its own API as a client pins the same certificate.
            SERVER_CERT_VARIABLE: str(config.tls.cert),
            SERVER_KEY_VARIABLE: str(config.tls.key),
            "PREFECT_API_SSL_CERT_FILE": str(config.tls.cert),
            "PREFECT_LOCAL_STORAGE_PATH": str(config.storage_path),
            # No network on a login node: analytics would only time out.
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
            # Prefect copies its UI into the installation (site-packages/prefect/server/
            # ui_build) on first start: with a shared install, the first user's copy
            # (0700 under our umask) stopped every other user's server. A copy per state
            # directory is private and ours.
            "PREFECT_SERVER_UI_STATIC_DIRECTORY": str(config.prefect_home / "ui"),
            "DO_NOT_TRACK": "1",
        }
    )
    for variable in UNUSED_SERVICES:
        env[variable] = base_env.get(variable, "false")
    if auth is not None:
        env["PREFECT_SERVER_API_AUTH_STRING"] = auth
        # With this set, /ui-settings says auth "BASIC" and the UI asks for the secret.
        # Code in the server process that calls PREFECT_API_URL as a client needs it too.
        env["PREFECT_API_AUTH_STRING"] = auth
    return env
