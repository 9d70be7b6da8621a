"""The seams inside the project, read from the source (AST) so a lazy import counts too.

- ``flows._prefect`` is the only place that imports Prefect; the round engine
  (``flows._engine``) never does, and neither do ``acceptance``, ``policies``,
  ``tasks``.
- ``flows._cli`` is the only place in ``flows`` that prints.
- Every module of ``flows`` belongs to one named layer (``LAYERS``), and what it
  imports, followed transitively, stays in its own layer or the layers it may use:
  the foundations use nothing, the store never reaches the spec, the engine, the
  report or the crate; the engine never reaches the Prefect wing or the CLI; the CLI
  may use everything.
- ``flows`` reaches ``acceptance``, ``policies`` and ``tasks`` through their public
  names only.
- No import cycle between modules, anywhere.

Imports under ``if TYPE_CHECKING:`` are left out: they never run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("acceptance", "policies", "tasks", "flows")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "_migrations" in path.parts:  # Alembic revisions run inside Alembic
                continue
            found[_module_name(path)] = path
    return found


SOURCES = _sources()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Walk ``tree``, skipping the bodies of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _lazy_submodules(module: str, node: ast.AST) -> set[str]:
    """Return the submodules a ``lazy_loader.attach(..., submod_attrs={...})`` call loads."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "attach"
    ):
        return set()
    for keyword in node.keywords:
        if keyword.arg == "submod_attrs" and isinstance(keyword.value, ast.Dict):
            return {
                f"{module}.{key.value}"
                for key in keyword.value.keys
                if isinstance(key, ast.Constant) and isinstance(key.value, str)
            }
    return set()


def _imports(module: str) -> set[str]:
    """Return what ``module`` imports at run time (``from a import b``: ``a.b`` if a module).

    A package whose names load on first use (``lazy_loader.attach``) imports the
    submodules it names: using one of its names runs them.
    """
    tree = ast.parse(SOURCES[module].read_text())
    found: set[str] = set()
    for node in _runtime_nodes(tree):
        found |= _lazy_submodules(module, node)
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in SOURCES else node.module)
    return found


IMPORTS = {module: _imports(module) for module in SOURCES}


def _offenders(modules: list[str], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    bad = {}
    for module in modules:
        hits = sorted(
            name
            for name in IMPORTS[module]
            if any(name == f or name.startswith(f + ".") for f in forbidden)
        )
        if hits:
            bad[module] = hits
    return bad


def _under(prefix: str) -> list[str]:
    return [m for m in SOURCES if m == prefix or m.startswith(prefix + ".")]


class TestPrefectStaysInItsWing:
    def test_only_flows_prefect_imports_prefect(self):
        outside = [m for m in SOURCES if not m.startswith("flows._prefect")]
        assert _offenders(outside, ("prefect",)) == {}

    def test_the_engine_imports_neither_the_prefect_wing_nor_the_cli(self):
        assert _offenders(_under("flows._engine"), ("flows._prefect", "flows._cli")) == {}

    def test_the_store_imports_nothing_above_it(self):
        forbidden = ("flows._engine", "flows._prefect", "flows._cli", "flows._replay")
        assert _offenders(_under("flows._provenance"), forbidden) == {}

    def test_the_prefect_wing_never_imports_the_cli(self):
        assert _offenders(_under("flows._prefect"), ("flows._cli",)) == {}


# The layers of ``flows``, bottom to top: name -> (its modules, the layers it may use).
# A module is in the layer of its longest matching prefix; ``flows`` itself (the public
# names) is the CLI's layer, the top.
LAYERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "foundations": (
        ("flows._paths", "flows._settings", "flows._telemetry", "flows._masking", "flows._words"),
        (),
    ),
    "spec": (("flows._spec",), ("foundations",)),
    "store": (("flows._provenance",), ("foundations",)),
    "engine": (("flows._engine",), ("foundations", "spec", "store")),
    "check": (("flows._check",), ("foundations", "spec", "store", "engine")),
    "replay": (("flows._replay",), ("foundations", "spec", "store", "engine")),
    "report": (
        ("flows._report", "flows._report_approvals", "flows._report_figures"),
        ("foundations", "store"),
    ),
    "crate": (("flows._crate",), ("foundations", "store", "report")),
    "prefect": (("flows._prefect",), ("foundations", "spec", "store", "engine", "check")),
    "cli": (
        ("flows", "flows._cli"),
        ("foundations", "spec", "store", "engine", "check", "replay", "report", "crate", "prefect"),
    ),
}


def _layer(module: str) -> str | None:
    """Return the layer ``module`` of ``flows`` belongs to (longest prefix), or None."""
    matches = [
        (len(prefix), name)
        for name, (prefixes, _) in LAYERS.items()
        for prefix in prefixes
        if module == prefix or (prefix != "flows" and module.startswith(prefix + "."))
    ]
    return max(matches)[1] if matches else None


def _reached(module: str) -> set[str]:
    """Return every module of the project that importing ``module`` runs, transitively."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for name in IMPORTS[todo.pop()]:
            if name in SOURCES and name not in seen:
                seen.add(name)
                todo.append(name)
    seen.discard(module)
    return seen


class TestLayers:
    def test_every_module_of_flows_is_in_a_named_layer(self):
        assert [m for m in _under("flows") if _layer(m) is None] == []

    @pytest.mark.parametrize("layer", list(LAYERS))
    def test_a_layer_reaches_only_itself_and_the_layers_it_may_use(self, layer):
        allowed = {layer, *LAYERS[layer][1]}
        leaks = {}
        for module in (m for m in _under("flows") if _layer(m) == layer):
            outside = sorted(
                f"{name} ({_layer(name)})"
                for name in _reached(module)
                if name.startswith("flows") and _layer(name) not in allowed
            )
            if outside:
                leaks[module] = outside
        assert leaks == {}

    def test_the_layers_follow_imports_transitively(self):
        # What the rule is for: a direct import of an allowed layer can still carry
        # a module of a forbidden one (the store once reached the engine through the
        # spec, the report and the crate builder).
        reached = _reached("flows._provenance._store")
        assert "flows._provenance._schema" in reached  # through the lazy package
        assert not any(_layer(name) in {"engine", "spec", "report"} for name in reached)


class TestOnlyTheCliPrints:
    @staticmethod
    def _prints(module: str) -> list[int]:
        tree = ast.parse(SOURCES[module].read_text())
        lines = []
        for node in ast.walk(tree):
            calls_print = (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in {"print", "input"}
            )
            if calls_print:
                lines.append(node.lineno)
            if (
                isinstance(node, ast.Attribute)
                and node.attr in {"stdout", "stderr"}
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            ):
                lines.append(node.lineno)
        return lines

    def test_nothing_outside_flows_cli_prints(self):
        outside = [m for m in _under("flows") if not m.startswith("flows._cli")]
        printing = {m: self._prints(m) for m in outside}
        assert {m: lines for m, lines in printing.items() if lines} == {}


class TestPublicNamesOnly:
    def test_flows_uses_only_public_names_of_the_other_packages(self):
        private = tuple(f"{p}._" for p in ("acceptance", "policies", "tasks"))
        bad = {m: sorted(n for n in IMPORTS[m] if n.startswith(private)) for m in _under("flows")}
        assert {m: names for m, names in bad.items() if names} == {}


class TestShape:
    def test_flows_has_at_most_twelve_modules_at_the_top(self):
        top = list((ROOT / "flows").glob("*.py"))
        assert len(top) <= 12, sorted(p.name for p in top)

    def test_no_import_cycle_anywhere(self):
        # Tarjan's strongly connected components over the project's import graph.
        graph = {m: sorted(i for i in IMPORTS[m] if i in SOURCES and i != m) for m in SOURCES}
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        cycles: list[list[str]] = []
        counter = [0]

        def visit(node: str) -> None:
            index[node] = low[node] = counter[0]
            counter[0] += 1
            stack.append(node)
            on_stack.add(node)
            for nxt in graph[node]:
                if nxt not in index:
                    visit(nxt)
                    low[node] = min(low[node], low[nxt])
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if low[node] == index[node]:
                component = []
                while True:
                    item = stack.pop()
                    on_stack.discard(item)
                    component.append(item)
                    if item == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))

        for module in graph:
            if module not in index:
                visit(module)
        assert cycles == []


@pytest.mark.parametrize("package", ["flows._engine", "flows._provenance"])
def test_package_imports_without_prefect_in_a_clean_process(package):
    import subprocess
    import sys

    code = f"import sys, {package}; sys.exit('prefect' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
