"""Basic authentication on the local Prefect server: the secret file, clients, and a real 401."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from flows._cli import main
from flows._prefect._connect import connect
from flows._prefect._server import (
    AUTH_USER,
    ServerConfig,
    ServerError,
    ServerHandle,
    auth_string,
    client_env,
    server_status,
)
from flows._prefect._server_env import server_env

pytestmark = pytest.mark.timeout(120, func_only=True)


def _handle(auth: str | None) -> ServerHandle:
    return ServerHandle(
        pid=1,
        api_url="http://127.0.0.1:4300/api",
        ui_url="http://127.0.0.1:4300",
        prefect_home=Path("/s/prefect"),
        storage_path=Path("/s/prefect/storage"),
        log_path=Path("/s/prefect/server.log"),
        database="sqlite",
        auth_string=auth,
    )


def _session_config(handle: ServerHandle) -> ServerConfig:
    port = urlsplit(handle.api_url).port
    assert port is not None
    return ServerConfig(state_dir=handle.prefect_home.parent, port=port)


class TestTheSecretFile:
    def test_is_generated_once_readable_by_its_owner_only(self, tmp_path: Path) -> None:
        config = ServerConfig(state_dir=tmp_path)
        first = auth_string(config)
        assert first.startswith(f"{AUTH_USER}:")
        assert len(first.partition(":")[2]) >= 40  # 32 random bytes, base64
        assert config.auth_path.stat().st_mode & 0o777 == 0o600
        assert auth_string(config) == first  # kept: co-approvers' copies stay valid

    def test_a_file_others_can_read_is_refused_naming_the_fix(self, tmp_path: Path) -> None:
        config = ServerConfig(state_dir=tmp_path)
        auth_string(config)
        config.auth_path.chmod(0o644)
        with pytest.raises(PermissionError, match=r"chmod 600 .*api-auth"):
            auth_string(config)

    def test_the_handle_never_shows_the_secret_in_its_repr(self) -> None:
        assert "s3cret" not in repr(_handle("unattended:s3cret"))


class TestEnvironments:
    def test_the_server_requires_the_secret(self, tmp_path: Path) -> None:
        env = server_env(ServerConfig(state_dir=tmp_path), {}, auth="unattended:s3cret")
        assert env["PREFECT_SERVER_API_AUTH_STRING"] == "unattended:s3cret"

    def test_clients_send_the_secret(self) -> None:
        assert client_env(_handle("unattended:s3cret"))["PREFECT_API_AUTH_STRING"] == (
            "unattended:s3cret"
        )

    def test_a_server_without_auth_gets_no_secret(self) -> None:
        assert "PREFECT_API_AUTH_STRING" not in client_env(_handle(None))

    def test_a_pid_file_from_before_auth_means_a_server_without_auth(self, tmp_path: Path) -> None:
        """The upgrade path: a server started by an older version keeps being used as it is."""
        config = ServerConfig(state_dir=tmp_path)
        config.prefect_home.mkdir(parents=True)
        started = psutil.Process(os.getpid()).create_time()
        config.pid_path.write_text(json.dumps({"pid": os.getpid(), "create_time": started}))
        handle = server_status(config, probe_timeout=0.1).handle
        assert handle is not None
        assert handle.auth_string is None
        assert not config.auth_path.exists()


class TestConnect:
    def test_an_api_key_beside_an_auth_string_is_refused(self) -> None:
        env = {
            "PREFECT_API_URL": "http://127.0.0.1:1/api",
            "PREFECT_API_KEY": "pnu_x",
            "PREFECT_API_AUTH_STRING": "a:b",
        }
        with pytest.raises(ServerError, match="unset PREFECT_API_KEY"):
            connect(env)

    @pytest.mark.integration
    def test_the_local_server_s_secret_is_found_and_an_api_key_dropped(
        self, prefect_server: ServerHandle
    ) -> None:
        port = urlsplit(prefect_server.api_url).port
        env = {
            "UNATTENDED_HOME": str(prefect_server.prefect_home.parent),
            "UNATTENDED_SERVER_PORT": str(port),
            "PREFECT_API_KEY": "pnu_x",
        }
        connect(env)
        assert env["PREFECT_API_AUTH_STRING"] == prefect_server.auth_string
        assert "PREFECT_API_KEY" not in env


@pytest.mark.integration
class TestTheRealServer:
    def test_an_api_call_without_credentials_gets_401(self, prefect_server: ServerHandle) -> None:
        response = httpx.post(
            f"{prefect_server.api_url}/flow_runs/filter",
            json={},
            timeout=30,
            verify=prefect_server.verify(),
        )
        assert response.status_code == httpx.codes.UNAUTHORIZED

    def test_an_api_call_with_a_wrong_secret_gets_401(self, prefect_server: ServerHandle) -> None:
        response = httpx.post(
            f"{prefect_server.api_url}/flow_runs/filter",
            json={},
            auth=(AUTH_USER, "guessed"),
            timeout=30,
            verify=prefect_server.verify(),
        )
        assert response.status_code == httpx.codes.UNAUTHORIZED

    def test_an_api_call_with_the_secret_is_served(self, prefect_server: ServerHandle) -> None:
        response = httpx.post(
            f"{prefect_server.api_url}/flow_runs/filter",
            json={},
            auth=prefect_server.basic_auth,
            timeout=30,
            verify=prefect_server.verify(),
        )
        assert response.status_code == httpx.codes.OK

    def test_the_ui_is_told_to_ask_for_the_secret(self, prefect_server: ServerHandle) -> None:
        settings = httpx.get(
            f"{prefect_server.ui_url}/ui-settings", timeout=10, verify=prefect_server.verify()
        ).json()
        assert settings["auth"] == "BASIC"

    def test_status_says_auth_is_on_without_printing_the_secret(
        self,
        prefect_server: ServerHandle,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        config = _session_config(prefect_server)
        monkeypatch.setenv("UNATTENDED_HOME", str(config.state_dir))
        monkeypatch.setenv("UNATTENDED_SERVER_PORT", str(config.port))
        assert main(["server", "status"]) == 0
        out = capsys.readouterr().out
        assert f"auth:     basic; secret in {config.auth_path}" in out
        assert prefect_server.basic_auth is not None
        assert prefect_server.basic_auth[1] not in out
