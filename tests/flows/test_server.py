"""The local Prefect server: config loading, PID-file status, stop, start and the CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from flows._cli import main
from flows._prefect._server import (
    ServerConfig,
    ServerError,
    ServerHandle,
    _write_pid_file,
    client_env,
    flow_run_ui_url,
    load_server_config,
    redact_url,
    server_status,
    start_server,
    stop_server,
)
from flows._prefect._server_pid import process_mark
from policies import SpecInvalid

# The session's server start is bounded by start_server's own timeout; 120 s is per test.
pytestmark = pytest.mark.timeout(120, func_only=True)


def _session_config(handle: ServerHandle) -> ServerConfig:
    port = urlsplit(handle.api_url).port
    assert port is not None
    return ServerConfig(state_dir=handle.prefect_home.parent, port=port)


def _spawn_group(code: str) -> subprocess.Popen[bytes]:
    """Start a Python process leading its own process group, as the server does."""
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


class TestLoadServerConfig:
    def test_defaults_live_under_home(self) -> None:
        config = load_server_config({"HOME": "/home/ana"})
        assert (config.host, config.port) == ("127.0.0.1", 4200)
        assert config.prefect_home == Path("/home/ana/.unattended/prefect")
        assert config.connection_url() == (
            "sqlite+aiosqlite:////home/ana/.unattended/prefect/prefect.db"
        )

    def test_unattended_home_wins_over_home(self) -> None:
        config = load_server_config({"HOME": "/home/ana", "UNATTENDED_HOME": "/scratch/u"})
        assert config.state_dir == Path("/scratch/u")

    def test_given_options_win_and_missing_ones_fall_through(self) -> None:
        env = {"HOME": "/h", "UNATTENDED_SERVER_PORT": "4300"}
        config = load_server_config(env, port=4400, database_url=None)
        assert config.port == 4400
        assert config.database_url is None

    def test_a_bad_port_names_the_variable_and_field(self) -> None:
        with pytest.raises(
            SpecInvalid, match=r"port \(environment variable UNATTENDED_SERVER_PORT"
        ):
            load_server_config({"HOME": "/h", "UNATTENDED_SERVER_PORT": "70000"})

    def test_a_non_asyncpg_database_url_is_refused_without_echoing_it(self) -> None:
        url = "postgresql+psycopg://ana:s3cret@db/prefect"
        with pytest.raises(SpecInvalid, match="database_url") as caught:
            load_server_config({"HOME": "/h"}, database_url=url)
        assert "s3cret" not in str(caught.value)
        assert caught.value.details == {"field": "database_url", "source": "option database_url"}

    def test_the_printable_database_label_masks_the_password(self) -> None:
        config = ServerConfig(database_url="postgresql+asyncpg://ana:s3cret@db:5432/prefect")
        assert config.database_label() == "postgresql+asyncpg://ana:***@db:5432/prefect"


class TestRedactUrl:
    @pytest.mark.parametrize(
        ("url", "expected"),
        [
            ("postgresql+asyncpg://u:p@h/d", "postgresql+asyncpg://u:***@h/d"),
            ("postgresql+asyncpg://u@h/d", "postgresql+asyncpg://u@h/d"),
            ("sqlite+aiosqlite:////a/b@c.db", "sqlite+aiosqlite:////a/b@c.db"),
        ],
    )
    def test_only_a_password_is_masked(self, url: str, expected: str) -> None:
        assert redact_url(url) == expected


class TestClientEnv:
    def test_points_clients_at_the_server_and_forbids_ephemeral_mode(self) -> None:
        handle = ServerHandle(
            pid=1,
            api_url="http://127.0.0.1:4300/api",
            ui_url="http://127.0.0.1:4300",
            prefect_home=Path("/s/prefect"),
            storage_path=Path("/s/prefect/storage"),
            log_path=Path("/s/prefect/server.log"),
            database="sqlite",
        )
        env = client_env(handle)
        assert env["PREFECT_API_URL"] == "http://127.0.0.1:4300/api"
        assert env["PREFECT_LOCAL_STORAGE_PATH"] == "/s/prefect/storage"
        assert env["PREFECT_SERVER_ALLOW_EPHEMERAL_MODE"] == "false"
        assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"


class TestFlowRunUiUrl:
    def test_links_the_v2_run_page(self) -> None:
        url = flow_run_ui_url("http://127.0.0.1:4200/", "abc")
        assert url == "http://127.0.0.1:4200/v2/runs/flow-run/abc"


class TestServerStatus:
    def test_no_pid_file_means_not_running(self, tmp_path: Path) -> None:
        assert not server_status(ServerConfig(state_dir=tmp_path)).running

    def test_a_pid_file_of_a_dead_process_is_removed(self, tmp_path: Path) -> None:
        config = ServerConfig(state_dir=tmp_path)
        config.prefect_home.mkdir(parents=True)
        finished = subprocess.Popen(["true"])
        started = psutil.Process(finished.pid).create_time()
        finished.wait()
        config.pid_path.write_text(json.dumps({"pid": finished.pid, "create_time": started}))
        assert not server_status(config).running
        assert not config.pid_path.exists()

    def test_a_recycled_pid_is_not_taken_for_the_server(self, tmp_path: Path) -> None:
        config = ServerConfig(state_dir=tmp_path)
        config.prefect_home.mkdir(parents=True)
        started = psutil.Process(os.getpid()).create_time()
        config.pid_path.write_text(json.dumps({"pid": os.getpid(), "create_time": started - 60}))
        assert not server_status(config).running
        assert not config.pid_path.exists()

    def test_a_clock_step_leaves_the_running_server_its_own(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # NTP, or a virtual machine resumed: the wall clock jumps and every running
        # process's create_time moves with the boot time (14 s seen on this machine).
        # Before, the PID file was removed and the live server taken for dead.
        from flows._prefect import _server_pid

        config = ServerConfig(state_dir=tmp_path)
        config.prefect_home.mkdir(parents=True)
        config.pid_path.write_text(json.dumps({"pid": os.getpid(), **process_mark(os.getpid())}))
        boot, created = psutil.boot_time(), psutil.Process(os.getpid()).create_time()
        monkeypatch.setattr(_server_pid.psutil, "boot_time", lambda: boot + 14.0)
        monkeypatch.setattr(_server_pid.psutil.Process, "create_time", lambda self: created + 14.0)
        assert server_status(config).running
        assert config.pid_path.exists()

    def test_a_pid_file_of_another_boot_is_not_taken_for_the_server(self, tmp_path: Path) -> None:
        config = ServerConfig(state_dir=tmp_path)
        config.prefect_home.mkdir(parents=True)
        record = {**process_mark(os.getpid()), "boot_id": "a-boot-before-the-last-reboot"}
        config.pid_path.write_text(json.dumps({"pid": os.getpid(), **record}))
        assert not server_status(config).running
        assert not config.pid_path.exists()

    def test_an_unreadable_pid_file_is_removed(self, tmp_path: Path) -> None:
        config = ServerConfig(state_dir=tmp_path)
        config.prefect_home.mkdir(parents=True)
        config.pid_path.write_text("not json")
        assert not server_status(config).running
        assert not config.pid_path.exists()


class TestStopServer:
    def test_sigterm_stops_the_whole_process_group(self, tmp_path: Path) -> None:
        config = ServerConfig(state_dir=tmp_path)
        config.prefect_home.mkdir(parents=True)
        leader = _spawn_group(
            "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
        )
        _write_pid_file(config, leader.pid)
        children = _wait_for_children(leader.pid)

        assert stop_server(config) is True
        assert leader.poll() is not None
        assert all(_gone(child) for child in children)
        assert not config.pid_path.exists()

    def test_sigkill_follows_when_sigterm_is_ignored(self, tmp_path: Path) -> None:
        config = ServerConfig(state_dir=tmp_path, stop_grace_seconds=0.5)
        config.prefect_home.mkdir(parents=True)
        stubborn = _spawn_group(
            textwrap.dedent(
                """
                import signal, sys, time
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                time.sleep(60)
                """
            )
        )
        _write_pid_file(config, stubborn.pid)
        process = psutil.Process(stubborn.pid)

        assert stop_server(config) is True
        assert _gone(process)

    def test_stopping_when_nothing_runs_reports_false(self, tmp_path: Path) -> None:
        assert stop_server(ServerConfig(state_dir=tmp_path)) is False


def _gone(process: psutil.Process) -> bool:
    """Return whether ``process`` exited (a zombie waiting for init to reap it counts)."""
    try:
        process.wait(timeout=5)
    except psutil.TimeoutExpired:
        return bool(process.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
    return True


def _wait_for_children(pid: int) -> list[psutil.Process]:
    leader = psutil.Process(pid)
    for _ in range(100):
        children: list[psutil.Process] = leader.children(recursive=True)
        if children:
            return children
        psutil.wait_procs([leader], timeout=0.05)
    raise AssertionError("the test process never started its child")


class TestStartServer:
    def test_a_port_in_use_is_a_clear_error_before_anything_starts(self, tmp_path: Path) -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            config = ServerConfig(state_dir=tmp_path, port=port)
            with pytest.raises(ServerError, match=f"port {port} on 127.0.0.1 is already in use"):
                start_server(config)
        assert not config.pid_path.exists()

    @pytest.mark.integration
    def test_a_second_start_for_the_same_state_dir_is_refused(
        self, prefect_server: ServerHandle
    ) -> None:
        with pytest.raises(ServerError, match=f"already runs .*pid {prefect_server.pid}"):
            start_server(_session_config(prefect_server))

    @pytest.mark.integration
    def test_status_reports_the_running_server_as_healthy(
        self, prefect_server: ServerHandle
    ) -> None:
        status = server_status(_session_config(prefect_server))
        assert status.healthy
        assert status.handle == prefect_server

    @pytest.mark.integration
    def test_the_ui_is_told_the_right_api_url(self, prefect_server: ServerHandle) -> None:
        settings = httpx.get(
            f"{prefect_server.ui_url}/ui-settings", timeout=10, verify=prefect_server.verify()
        ).json()
        assert settings["api_url"] == prefect_server.api_url
        # flow_run_ui_url links /v2/...: the default UI must be the v2 bundle at /v2.
        assert (settings["default_ui"], settings["v2_base_url"]) == ("v2", "/v2")


class TestServerCli:
    def test_help_does_not_import_prefect(self) -> None:
        code = (
            "import sys\n"
            "from flows._cli import main\n"
            "try:\n    main(['server', 'start', '--help'])\n"
            "except SystemExit:\n    pass\n"
            "print('prefect' in sys.modules)\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        assert result.stdout.splitlines()[-1] == "False"

    def test_status_exits_1_when_not_running(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setenv("UNATTENDED_HOME", str(tmp_path))
        assert main(["server", "status"]) == 1
        assert "not running" in capsys.readouterr().out

    def test_a_bad_database_url_exits_2_naming_the_option(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setenv("UNATTENDED_HOME", str(tmp_path))
        assert main(["server", "start", "--database-url", "mysql://x"]) == 2
        assert "database_url (option database_url)" in capsys.readouterr().err

    def test_start_on_a_taken_port_exits_1_with_the_reason(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setenv("UNATTENDED_HOME", str(tmp_path))
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            assert main(["server", "start", "--port", str(port)]) == 1
        assert f"error: port {port} on 127.0.0.1 is already in use" in capsys.readouterr().err

    def test_stop_when_nothing_runs_exits_0(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setenv("UNATTENDED_HOME", str(tmp_path))
        assert main(["server", "stop"]) == 0
        assert "was not running" in capsys.readouterr().out

    @pytest.mark.integration
    def test_status_prints_urls_pid_and_database(
        self,
        prefect_server: ServerHandle,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        monkeypatch.setenv("UNATTENDED_HOME", str(prefect_server.prefect_home.parent))
        assert main(["server", "status"]) == 0
        out = capsys.readouterr().out
        for expected in (prefect_server.api_url, prefect_server.ui_url, str(prefect_server.pid)):
            assert expected in out
        assert prefect_server.database in out
