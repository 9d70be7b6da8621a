"""Shared test configuration: the run starts from a clean, isolated environment."""

from __future__ import annotations

import os

import pytest

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="large version; run with --long")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)
