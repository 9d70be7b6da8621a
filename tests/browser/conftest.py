"""Fixtures for browser tests: a real Prefect server and headless Debian Chromium.

``ui_server`` starts ONE Prefect server per session (free port on 127.0.0.1, own
PREFECT_HOME, SQLite), points this process at it and stops it by PID at the end.
``chromium`` finds ``/usr/bin/chromium``; when it is missing it tries apt-get
(Playwright's own browser download does not work offline), and skips loudly only
if that fails. ``browser_page`` opens a fresh profile per test and closes it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from flows._server import ServerConfig, ServerHandle, client_env, start_server, stop_server

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
_SERVER_START_TIMEOUT = 180.0  # ~12 s idle; over 90 s at a load average of 14 on 2 cores
_APT_TIMEOUT = 240.0
_VIEWPORT = {"width": 1280, "height": 900}


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _apply_env(updates: dict[str, str]) -> dict[str, str | None]:
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


def _refresh_prefect_settings() -> None:
    # Prefect read its settings at import (collection time); make it read them again.
    import prefect.context

    prefect.context.refresh_global_settings_context()


def _apt_install_chromium() -> str | None:
    """Try to install Debian's chromium; return why it failed, or None."""
    prefix: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            return "not root and no sudo"
        prefix = ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        try:
            done = subprocess.run(
                prefix + argv, env=env, capture_output=True, timeout=_APT_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{' '.join(argv)}: {type(exc).__name__}"
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
            return f"{' '.join(argv)} exited {done.returncode}: {' '.join(tail)}"
    return None


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Return Debian's chromium, installing it with apt-get if it is missing."""
    if not CHROMIUM.exists():
        failure = _apt_install_chromium()
        if failure is not None or not CHROMIUM.exists():
            pytest.skip(
                f"BROWSER TESTS SKIPPED: {CHROMIUM} is missing and installing it failed "
                f"({failure or 'no binary after install'}); run "
                "`apt-get update && apt-get install -y chromium`"
            )
    return CHROMIUM


@pytest.fixture(scope="session")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """Start one real Prefect server (SQLite, UI on) for the session; point Prefect at it."""
    config = ServerConfig(port=free_port(), state_dir=tmp_path_factory.mktemp("prefect-ui"))
    handle = start_server(config, timeout=_SERVER_START_TIMEOUT)
    saved = _apply_env(client_env(handle))
    try:
        yield handle
    finally:
        _restore_env(saved)
        stop_server(config)


@pytest.fixture
def prefect_api(ui_server: ServerHandle, tmp_path: Path) -> Iterator[ServerHandle]:
    """Give the test its own result storage (flow-run processes inherit it)."""
    saved = _apply_env({"PREFECT_LOCAL_STORAGE_PATH": str(tmp_path / "prefect-results")})
    try:
        yield ui_server
    finally:
        _restore_env(saved)


@pytest_asyncio.fixture
async def browser_page(chromium: Path, tmp_path: Path) -> AsyncIterator[Any]:
    """Yield a page of headless Chromium with a fresh profile; close it after."""
    async_api = pytest.importorskip(
        "playwright.async_api",
        reason="BROWSER TESTS SKIPPED: `pip install playwright` (the test extra needs it)",
    )
    async with async_api.async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=str(chromium),
            args=list(CHROMIUM_ARGS),
            headless=True,
            viewport=_VIEWPORT,
        )
        try:
            yield context.pages[0] if context.pages else await context.new_page()
        finally:
            await context.close()


@pytest.fixture
def screenshot_dir(tmp_path: Path) -> Path:
    """Return where screenshots go: ``$SCREENSHOTS_DIR`` or the test's tmp dir."""
    chosen = os.environ.get("SCREENSHOTS_DIR")
    target = Path(chosen) if chosen else tmp_path / "screenshots"
    target.mkdir(parents=True, exist_ok=True)
    return target
