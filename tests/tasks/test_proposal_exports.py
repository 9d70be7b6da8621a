"""The ``tasks`` exports owned by the planning side resolve, lazily or not."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import tasks


def _declared_homes() -> dict[str, str]:
    """Return {name: module} from the ``if TYPE_CHECKING:`` imports of ``tasks/__init__.py``."""
    tree = ast.parse(Path(tasks.__file__).read_text(encoding="utf-8"))
    homes: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom), ast.unparse(statement)
                for alias in statement.names:
                    homes[alias.asname or alias.name] = str(statement.module)
    return homes


class TestLazyExports:
    def test_every_lazy_name_is_exported(self) -> None:
        # lazy_loader's __dir__ lists the names it loads on first use.
        assert set(dir(tasks)) <= set(tasks.__all__)

    def test_every_exported_name_resolves_to_its_module_attribute(self) -> None:
        """Each name is the very object of the private module ``tasks`` declares it from.

        The homes are read from the ``if TYPE_CHECKING:`` imports of ``tasks/__init__.py``
        (what type checkers see), not from ``__module__``: a type alias such as
        ``TaskSpec`` has ``types`` there.
        """
        homes = _declared_homes()
        assert set(homes) == set(tasks.__all__)
        for name, module in homes.items():
            home = importlib.import_module(module)
            assert name in vars(home), (name, module)
            assert getattr(tasks, name) is vars(home)[name], (name, module)

    def test_an_unknown_name_is_an_attribute_error(self) -> None:
        with pytest.raises(AttributeError, match="no_such_name"):
            tasks.no_such_name  # noqa: B018  # the access is the test
