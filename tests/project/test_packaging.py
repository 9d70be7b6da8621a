"""The wheel carries every top-level package and each imports from it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("acceptance", "policies", "tasks", "flows")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=110,
    )
    (built,) = out.glob("unattended-*.whl")
    return built


@pytest.mark.timeout(240)
class TestWheel:
    def test_wheel_holds_every_package(self, wheel):
        names = zipfile.ZipFile(wheel).namelist()
        for package in PACKAGES:
            assert f"{package}/__init__.py" in names

    def test_wheel_declares_the_console_script(self, wheel):
        names = zipfile.ZipFile(wheel).namelist()
        (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
        text = zipfile.ZipFile(wheel).read(entry_points).decode()
        assert "unattended = flows._cli:main" in text

    def test_each_package_imports_from_the_wheel(self, wheel, tmp_path):
        zipfile.ZipFile(wheel).extractall(tmp_path / "site")
        env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
        for package in PACKAGES:
            code = f"import {package}; print({package}.__file__)"
            out = subprocess.run(
                [sys.executable, "-c", code],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            assert out.stdout.strip().startswith(str(tmp_path / "site")), package
