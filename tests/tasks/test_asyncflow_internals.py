"""asyncflow's internals are touched in one module, which checks the installed versions first."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from policies import InternalError
from tasks._asyncflow_internals import SUPPORTED, _release, check_version, check_versions

TASKS = Path(__file__).resolve().parents[2] / "tasks"
# Attributes of asyncflow's engine and backend (and asyncio's loop) that are not public API.
INTERNAL_ATTRIBUTES = {"components", "dependencies", "resolved", "_signal_handlers", "executor"}


class TestVersionCheck:
    def test_the_installed_versions_are_supported(self):
        check_versions()  # raises otherwise
        assert set(SUPPORTED) == {"radical.asyncflow", "rhapsody-py"}
        for name, (low, high) in SUPPORTED.items():  # read here as the check reads them
            assert low <= _release(metadata.version(name)) < high, name

    def test_the_check_reads_what_is_installed_and_refuses_another_version(self, tmp_path):
        """A process that finds radical.asyncflow 0.7.0 installed first refuses to start."""
        dist = tmp_path / "radical_asyncflow-0.7.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: radical.asyncflow\nVersion: 0.7.0\n"
        )
        script = (
            "import sys; sys.path.insert(0, sys.argv[1]); "
            "from tasks._asyncflow_internals import check_versions; check_versions()"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode != 0
        assert (
            "radical.asyncflow 0.7.0 is installed, but unattended touches its internals as "
            "they are in radical.asyncflow>=0.6,<0.7"
        ) in done.stderr

    @pytest.mark.parametrize("installed", ["0.7.0", "0.5.9", "1.0"])
    def test_a_version_outside_the_range_is_refused_naming_the_range(self, installed):
        with pytest.raises(InternalError, match=r"radical\.asyncflow>=0\.6,<0\.7") as caught:
            check_version("radical.asyncflow", installed)
        assert caught.value.details["installed"] == installed

    @pytest.mark.parametrize("installed", ["0.6.0", "0.6.12", "0.6.1rc2"])
    def test_a_version_inside_the_range_passes(self, installed):
        check_version("rhapsody-py", installed)


def test_no_other_module_of_tasks_touches_the_internals():
    offenders = []
    for path in sorted(TASKS.rglob("*.py")):
        if path.name == "_asyncflow_internals.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in INTERNAL_ATTRIBUTES:
                # The site config's own `backend.executor` field is ours, not asyncflow's.
                owner = node.value
                ours = isinstance(owner, ast.Name) and owner.id in {"backend", "spec"}
                if not ours:
                    offenders.append(f"{path.name}:{node.lineno}:{node.attr}")
    assert offenders == []
