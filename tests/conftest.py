"""Shared test configuration: the run starts from a clean, isolated environment."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows._prefect._server import ServerConfig, ServerHandle, client_env, start_server, stop_server

# Variables that would let a test reach the developer's real services or state.
# They are stripped once, when the run starts; session fixtures (a Prefect server
# started for the tests, say) then set their own, and tests use monkeypatch.
_STRIPPED_PREFIXES = ("PREFECT_", "OTEL_", "UNATTENDED_", "OPENAI_")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", help="run the large reliability tests")


def pytest_configure(config: pytest.Config) -> None:
    for key in list(os.environ):
        if key.startswith(_STRIPPED_PREFIXES):
            del os.environ[key]


# Stripped again around EVERY test (monkeypatch): a developer's Slurm allocation or
# unattended settings must not change a result, and a test that sets one (monkeypatch)
# never leaks it into the next. Variables a fixture set through ``_apply_env`` stay.
_PER_TEST_PREFIXES = ("UNATTENDED_", "SLURM_")
_FIXTURE_ENV: set[str] = set()


# A terminal's geometry is the developer's too: the CLI prints 200 columns when piped
# unless COLUMNS says otherwise, and an xdist worker's environment has COLUMNS=80.
_TERMINAL = ("COLUMNS", "LINES")


@pytest.fixture(autouse=True)
def _no_allocation_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove ``UNATTENDED_*``, ``SLURM_*`` and the terminal size from this test's environment."""
    for key in list(os.environ):
        if (key.startswith(_PER_TEST_PREFIXES) and key not in _FIXTURE_ENV) or key in _TERMINAL:
            monkeypatch.delenv(key)


# The suite runs on pytest-xdist workers (``-n auto``, pyproject.toml); each worker is its
# own session. A test file runs whole on one worker (its module fixtures are built once),
# and so does every file under a folder whose tests share a costly session fixture: one
# private Slurm (and RADICAL-Pilot's venv), one Chromium. Those folders are collected
# first, so the longest unit starts first instead of ending the run alone.
# (xdist's own ``--dist loadgroup`` reads marks through ``item._nodeid``, which pytest 9
# no longer has, so the grouping is this scheduler's.)
_SHARED_SESSION_FOLDERS = ("tests/slurm/", "tests/browser/")


def _work_unit(nodeid: str) -> str:
    """Return the unit of work a test belongs to: its shared folder, else its file."""
    path = nodeid.split("::", 1)[0]
    return next((f for f in _SHARED_SESSION_FOLDERS if path.startswith(f)), path)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Schedule whole work units (``_work_unit``) in collection order (``--dist loadfile``)."""
    if config.getvalue("dist") != "loadfile":
        return None  # another mode asked for on the command line is xdist's
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    config.option.loadscopereorder = False  # the shared folders are collected first
    return WorkUnitScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _work_unit(item.nodeid) not in _SHARED_SESSION_FOLDERS)
    _skip_long(config, items)


def _skip_long(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="large version; run with --long")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


class OTelCapture:
    """The SDK's in-memory span and log exporters, installed as the global providers."""

    def __init__(self) -> None:
        from opentelemetry import _logs, trace
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import (
            InMemoryLogRecordExporter,
            SimpleLogRecordProcessor,
        )
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.spans_exporter = InMemorySpanExporter()
        self.logs_exporter = InMemoryLogRecordExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans_exporter))
        logger_provider = LoggerProvider()
        logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs_exporter))
        trace.set_tracer_provider(tracer_provider)
        _logs.set_logger_provider(logger_provider)

    def spans(self):  # -> tuple[ReadableSpan, ...]
        return self.spans_exporter.get_finished_spans()

    def logs(self):  # -> tuple[ReadableLogRecord, ...]
        return self.logs_exporter.get_finished_logs()

    def clear(self) -> None:
        self.spans_exporter.clear()
        self.logs_exporter.clear()


_otel_capture: OTelCapture | None = None


@pytest.fixture
def otel() -> OTelCapture:
    """Capture spans and log records with the SDK (global providers can be set only once)."""
    global _otel_capture
    if _otel_capture is None:
        _otel_capture = OTelCapture()
    _otel_capture.clear()
    return _otel_capture


# ---------------------------------------------------------------------------------------
# A real Prefect server for the tests that need one.
#
# ``prefect_server`` starts ONE server per session on 127.0.0.1 (free port, own
# PREFECT_HOME, SQLite) with ``flows._prefect._server.start_server``, points this process at it
# through ``os.environ`` and Prefect's settings, and stops it by PID at the end. Every
# test that uses it gets its own result-storage folder, so a cached (``INPUTS``) task
# result never leaks from one test into another. ``prefect_postgres_server`` does the
# same on a fresh database of the machine's PostgreSQL (127.0.0.1:5432, trust auth).
# ---------------------------------------------------------------------------------------

_SERVER_START_TIMEOUT = 180.0  # ~12 s idle; 90 s seen with several test sessions on 2 cores
_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _refresh_prefect_settings() -> None:
    # Prefect reads its settings once, when first imported (during collection,
    # before this fixture runs); make it read the environment again.
    import prefect.context

    prefect.context.refresh_global_settings_context()


def _apply_env(updates: dict[str, str]) -> dict[str, str | None]:
    _FIXTURE_ENV.update(updates)  # kept by _no_allocation_env in every test
    saved = {key: os.environ.get(key) for key in updates}
    os.environ.update(updates)
    _refresh_prefect_settings()
    return saved


def _restore_env(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _refresh_prefect_settings()


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """Start one real Prefect server (SQLite) for the session and point Prefect at it."""
    # Auth on, as `unattended server start` does: every test client must send the secret.
    config = ServerConfig(
        port=free_port(), state_dir=tmp_path_factory.mktemp("prefect-server"), auth=True
    )
    handle = start_server(config, timeout=_SERVER_START_TIMEOUT)
    saved = _apply_env(client_env(handle))
    try:
        yield handle
    finally:
        _restore_env(saved)
        stop_server(config)


@pytest.fixture(autouse=True)
def _per_test_result_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    """Give each test that uses ``prefect_server`` its own result storage folder."""
    if "prefect_server" not in request.fixturenames:
        yield
        return
    # Set in os.environ too: flow-run processes the runner spawns inherit it.
    saved = _apply_env({"PREFECT_LOCAL_STORAGE_PATH": str(tmp_path / "prefect-results")})
    try:
        yield
    finally:
        _restore_env(saved)


@pytest.fixture(scope="session")
def prefect_postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """Start a Prefect server on a fresh PostgreSQL database; drop the database after."""
    psycopg = pytest.importorskip("psycopg")
    database = f"unattended_test_prefect_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(_PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError:
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
    with admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    config = ServerConfig(
        port=free_port(),
        state_dir=tmp_path_factory.mktemp("prefect-pg-server"),
        database_url=f"postgresql+asyncpg://postgres@127.0.0.1:5432/{database}",
    )
    try:
        yield start_server(config, timeout=_SERVER_START_TIMEOUT)
    finally:
        stop_server(config)
        with psycopg.connect(_PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


@pytest.fixture
def prefect_postgres_api(
    prefect_postgres_server: ServerHandle, tmp_path: Path
) -> Iterator[ServerHandle]:
    """Point this process (and processes it spawns) at the PostgreSQL-backed server."""
    env = client_env(prefect_postgres_server)
    env["PREFECT_LOCAL_STORAGE_PATH"] = str(tmp_path / "prefect-results")
    saved = _apply_env(env)
    try:
        yield prefect_postgres_server
    finally:
        _restore_env(saved)
