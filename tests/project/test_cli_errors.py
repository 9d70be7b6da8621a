"""The CLI reports an error in one place: handlers raise, ``flows._cli.main`` prints and exits.

A handler that printed its own ``error:`` line and returned a code (``return fail(...)``)
bypassed the one map from errors to exit codes (``flows._cli._exit``); issue 46 moved
every such exit to a raised error that carries its code. These tests read the CLI's
source, so a new handler that does it again fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CLI = Path(__file__).resolve().parents[2] / "flows" / "_cli"
MODULES = sorted(CLI.glob("*.py"))
# The module that turns an error into what the user reads and the status it exits with.
SEAM = CLI / "_exit.py"
# The entry points that catch a command's error and hand it to the seam.
ENTRY_POINTS = {CLI / "__init__.py", CLI / "_direct.py"}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _called_names(tree: ast.AST) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name is not None:
                found.append((name, node.lineno))
    return found


def _module_ids() -> list[str]:
    return [path.name for path in MODULES]


@pytest.mark.parametrize("path", MODULES, ids=_module_ids())
def test_no_handler_prints_its_own_error_and_returns_a_code(path: Path) -> None:
    """No ``fail(...)`` (print, then return a code) in the CLI, nor a function by that name."""
    tree = _tree(path)
    calls = [line for name, line in _called_names(tree) if name == "fail"]
    defined = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "fail"
    ]
    assert (calls, defined) == ([], [])


@pytest.mark.parametrize("path", [p for p in MODULES if p != SEAM], ids=lambda p: p.name)
def test_only_the_seam_writes_an_error_line(path: Path) -> None:
    """The text ``error: `` that starts what the user reads appears in ``_exit.py`` only."""
    lines = [
        node.lineno
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.lstrip("\n").startswith("error: ")
    ]
    assert lines == []


def test_only_the_entry_points_report_an_error() -> None:
    """``report_error`` is called by ``main`` (and the direct runner's ``main``), nowhere else."""
    callers = {
        path
        for path in MODULES
        if any(name == "report_error" for name, _ in _called_names(_tree(path)))
    }
    assert callers == ENTRY_POINTS
