"""The code stays lint- and type-clean (ruff's rule set, mypy --strict on the core packages)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout[-4000:]


@pytest.mark.timeout(600)
def test_mypy_finds_nothing():
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "acceptance", "policies", "tasks", "flows"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout[-4000:]
