"""Shared fixtures: every test runs with a clean, isolated environment."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# Variables that would let a test reach the developer's real services or state.
_STRIPPED_PREFIXES = ("PREFECT_", "OTEL_", "UNATTENDED_", "OPENAI_")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", help="run the large reliability tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="large version; run with --long")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Strip variables that point at real services, so tests never read them."""
    import os

    for key in list(os.environ):
        if key.startswith(_STRIPPED_PREFIXES):
            monkeypatch.delenv(key)
    yield
