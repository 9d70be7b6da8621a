"""Fixtures for browser tests: a real Prefect server and headless Debian Chromium.

``prefect_api`` is the session's Prefect server from ``tests/conftest.py`` (its UI
serves the pages under test).
``chromium`` finds ``/usr/bin/chromium``; when it is missing it tries apt-get
(Playwright's own browser download does not work offline), and skips loudly only
if that fails. ``browser_page`` opens a fresh profile per test and closes it; it
trusts the server's certificate as a user does (docs/server.md): by the SPKI hash
``unattended server cert`` prints, passed as ``--ignore-certificate-errors-spki-list``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from flows._prefect._server import ServerHandle
from flows._prefect._tls import show_certificate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: apt_get

from apt_get import apt_install, install_command  # type: ignore[import-not-found]  # after the path

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
_APT_TIMEOUT = 240.0
_VIEWPORT = {"width": 1400, "height": 1000}  # what the docs and issue 24 measure


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Return Debian's chromium, installing it with apt-get if it is missing."""
    if not CHROMIUM.exists():
        failure = apt_install(["chromium"], _APT_TIMEOUT)
        if failure is not None or not CHROMIUM.exists():
            # apt_install's reason ends with the command that installs it by hand.
            why = (
                failure
                or f'no binary after install; install it with "{install_command(["chromium"])}"'
            )
            pytest.skip(
                f"BROWSER TESTS SKIPPED: {CHROMIUM} is missing and installing it failed: {why}"
            )
    return CHROMIUM


@pytest.fixture
def prefect_api(prefect_server: ServerHandle) -> ServerHandle:
    """Return the session's Prefect server (``tests/conftest.py``); its UI is what we drive.

    The root conftest also gives each test its own result storage folder.
    """
    return prefect_server


@pytest_asyncio.fixture
async def browser_page(
    chromium: Path, tmp_path: Path, prefect_api: ServerHandle
) -> AsyncIterator[Any]:
    """Yield a page of headless Chromium with a fresh profile; close it after."""
    assert prefect_api.cert_file is not None
    # Pinned, not "ignore every error": only the server's own key is accepted.
    spki = show_certificate(prefect_api.cert_file).spki_sha256
    async_api = pytest.importorskip(
        "playwright.async_api",
        reason="BROWSER TESTS SKIPPED: `pip install playwright` (the test extra needs it)",
    )
    async with async_api.async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=str(chromium),
            args=[*CHROMIUM_ARGS, f"--ignore-certificate-errors-spki-list={spki}"],
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
