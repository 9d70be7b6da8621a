"""Retries go through one library (tenacity): no new hand-written retry loop (AST).

A loop is a hand-written retry when it sleeps (``time.sleep``, ``asyncio.sleep``, an
injected ``sleep``) and also counts attempts (``for attempt in ...``), grows its wait
(``delay *= 2``, ``2 ** n``), or tries something until it works (a ``try`` that leaves
the loop on success, or an ``except`` that goes round again). A poll that waits for a
condition at a fixed pace (``while not done: sleep(...)``) is not one and is left alone.

Two loops predate the helper in modules being reworked elsewhere; they are named
(by function, so moving them between modules keeps them known) until converted.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("acceptance", "policies", "tasks", "flows")
# Function -> why its hand-written retry stays for now (convert it, then drop the line).
KNOWN: dict[str, str] = {}
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _same_scope(node: ast.AST) -> Iterator[ast.AST]:
    """Walk below ``node`` without entering nested functions or classes."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        if isinstance(child, _SCOPES):
            continue
        yield child
        stack.extend(ast.iter_child_nodes(child))


def _sleeps(loop: ast.AST) -> bool:
    for node in _same_scope(loop):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name.endswith("sleep"):
                return True
    return False


def _grows(node: ast.AST) -> bool:
    """Return whether ``node`` grows a wait: ``x *= k``, ``x = min(x * k, ...)``, ``k ** n``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return True
    if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mult):
        return True
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        if isinstance(target, ast.Name):
            return any(
                isinstance(part, ast.BinOp)
                and isinstance(part.op, ast.Mult)
                and any(
                    isinstance(side, ast.Name) and side.id == target.id
                    for side in (part.left, part.right)
                )
                for part in ast.walk(node.value)
            )
    return False


def _until_it_works(node: ast.AST) -> bool:
    """Return whether ``node`` is a ``try`` that leaves the loop on success or goes round again."""
    if not isinstance(node, ast.Try) or not node.handlers:
        return False
    leaves = any(
        isinstance(inner, ast.Break | ast.Return)
        for statement in node.body
        for inner in (statement, *_same_scope(statement))
    )
    again = any(
        isinstance(inner, ast.Continue)
        for handler in node.handlers
        for inner in _same_scope(handler)
    )
    return leaves or again


def retry_loop(loop: ast.For | ast.AsyncFor | ast.While) -> str | None:
    """Return why ``loop`` is a hand-written retry, or None."""
    if not _sleeps(loop):
        return None
    if isinstance(loop, ast.For | ast.AsyncFor):
        target = ast.unparse(loop.target).lower()
        if any(word in target for word in ("attempt", "retr", "tries")):
            return "counts attempts"
    for node in _same_scope(loop):
        if _grows(node):
            return "grows its wait"
        if _until_it_works(node):
            return "tries until it works"
    return None


def retry_loops(source: str) -> list[tuple[str, int, str]]:
    """Return (enclosing function, line, why) for each hand-written retry in ``source``."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = function
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = child.name
            elif isinstance(child, _LOOPS) and (why := retry_loop(child)):
                found.append((function, child.lineno, why))
            visit(child, name)

    visit(ast.parse(source), "<module>")
    return found


def _project_loops() -> list[tuple[str, str, int, str]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for function, line, why in retry_loops(path.read_text(encoding="utf-8")):
                found.append((str(path.relative_to(ROOT)), function, line, why))
    return found


class TestRetryLoops:
    def test_no_hand_written_retry_loop_outside_the_known_ones(self) -> None:
        new = [
            f"{path}:{line} in {function}: {why} (use tenacity)"
            for path, function, line, why in _project_loops()
            if function not in KNOWN
        ]
        assert new == []

    def test_each_known_loop_is_still_there(self) -> None:
        """Once a known loop is converted, its line in KNOWN goes too."""
        assert sorted({function for _, function, _, _ in _project_loops()}) == sorted(KNOWN)


# What the old loops looked like (before tenacity), and polls that are not retries.
_RETRIES = {
    "counts attempts": """
        def upgrade_when_free():
            for attempt in range(5):
                try:
                    return upgrade()
                except OSError:
                    time.sleep(0.05 * 2**attempt)
    """,
    "backoff": """
        async def wait_for_server():
            delay = 0.5
            while not await answers():
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
    """,
    "exponential sleep": """
        async def run(self):
            while outcome is None:
                outcome = await self.attempt()
                delay = min(self.backoff * 2 ** (attempt - 1), 300.0)
                await asyncio.sleep(delay)
    """,
    "until it works": """
        async def announce():
            while True:
                try:
                    await poll_now(runner)
                    break
                except Exception:
                    await asyncio.sleep(1.0)
    """,
    "injected sleep": """
        async def serve(self):
            while True:
                pause = delay * (0.5 + random.random())
                if not await self.run():
                    return
                await self._sleep(pause)
                delay *= 2
    """,
}
_POLLS = {
    "wait for a state": """
        def wait():
            while campaign_status() in STILL_GOING and time.monotonic() < deadline:
                time.sleep(0.05)
    """,
    "periodic watch": """
        async def watch():
            while not stopping:
                try:
                    await sweep()
                except Exception as exc:
                    log(exc)
                await asyncio.sleep(seconds)
    """,
    "retry without sleeping": """
        def pages():
            for attempt in range(3):
                read()
    """,
}


class TestTheDetector:
    @pytest.mark.parametrize("name", sorted(_RETRIES))
    def test_it_finds_a_hand_written_retry(self, name: str) -> None:
        assert len(retry_loops(textwrap.dedent(_RETRIES[name]))) == 1

    @pytest.mark.parametrize("name", sorted(_POLLS))
    def test_it_leaves_a_poll_alone(self, name: str) -> None:
        assert retry_loops(textwrap.dedent(_POLLS[name])) == []
