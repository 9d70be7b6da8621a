"""The embedded Prefect server runs only the services the project uses.

Each service Prefect runs is a loop against its database; on SQLite every extra
writer is one more chance for a UI Resume to meet "database is locked". The ones
the project never needs are off in the server's environment (``UNUSED_SERVICES``);
a variable the operator sets wins.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows._prefect._rest import request
from flows._prefect._server import ServerConfig, ServerHandle
from flows._prefect._server_env import UNUSED_SERVICES, server_env

SERVICE_OF = {
    "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "scheduler",
    "PREFECT_SERVER_SERVICES_PAUSE_EXPIRATIONS_ENABLED": "pause_expirations",
    "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "triggers",
    "PREFECT_SERVER_SERVICES_CLEANUP_RECONCILER_ENABLED": "cleanup_reconciler",
}
KEPT = (
    "late_runs",
    "cancellation_cleanup",
    "foreman",
    "repossessor",
    "task_run_recorder",
    "event_persister",
)


class TestServerEnvironment:
    def test_the_unused_services_are_off(self, tmp_path: Path) -> None:
        env = server_env(ServerConfig(state_dir=tmp_path), {})
        assert {key: env[key] for key in UNUSED_SERVICES} == dict.fromkeys(SERVICE_OF, "false")

    def test_a_service_the_operator_turns_on_stays_on(self, tmp_path: Path) -> None:
        base = {"PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "true"}
        env = server_env(ServerConfig(state_dir=tmp_path), base)
        assert env["PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED"] == "true"
        assert env["PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED"] == "false"

    def test_prefect_reads_each_variable_as_its_service_switch(self, tmp_path: Path) -> None:
        """A renamed setting in a Prefect upgrade would leave its service on: caught here."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env |= server_env(ServerConfig(state_dir=tmp_path), {})
        code = (
            "from prefect.settings import get_current_settings\n"
            "services = get_current_settings().server.services\n"
            f"for name in {sorted(SERVICE_OF.values()) + list(KEPT)!r}:\n"
            "    print(name, getattr(services, name).enabled)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr[-2000:]
        enabled = dict(line.split() for line in done.stdout.splitlines())
        assert enabled == {
            **dict.fromkeys(SERVICE_OF.values(), "False"),
            **dict.fromkeys(KEPT, "True"),
        }


@pytest.mark.integration
def test_the_running_server_reports_the_services_off(prefect_server: ServerHandle) -> None:
    """The session's server (started by ``start_server``) says so in its own settings."""
    settings = request(os.environ, "GET", "admin/settings")
    services = settings["server"]["services"]
    assert {name: services[name]["enabled"] for name in SERVICE_OF.values()} == dict.fromkeys(
        SERVICE_OF.values(), False
    )
    assert all(services[name]["enabled"] for name in KEPT)
