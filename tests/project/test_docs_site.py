"""The documentation site builds in strict mode, with the reference generated from docstrings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the site once (about 10 s) into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return out


class TestDocsSite:
    def test_builds_strict_with_every_nav_page(self, site: Path):
        assert (site / "index.html").is_file()
        pages = ("acceptance", "policies", "campaigns", "provenance", "telemetry", "approvals")
        for page in pages:
            assert (site / page / "index.html").is_file(), page

    def test_the_reference_is_generated_from_docstrings(self, site: Path):
        expected = {
            "acceptance": "acceptance.accept",
            "policies": "policies.classify",
            "tasks": "tasks.AllocationExecutor",
            "flows": "flows._engine._approval.approval_deadline",
        }
        for page, anchor in expected.items():
            html = (site / "reference" / page / "index.html").read_text()
            assert f'id="{anchor}"' in html, f"{page}: {anchor} not rendered"

    def test_the_quickstart_is_the_home_page(self, site: Path):
        html = (site / "index.html").read_text()
        assert "unattended run examples/demo/campaign.toml" in html
