"""The ``tasks`` exports owned by the planning side resolve, lazily or not."""

from __future__ import annotations

import importlib

import pytest

import tasks


class TestLazyExports:
    def test_every_lazy_name_is_exported(self) -> None:
        # lazy_loader's __dir__ lists the names it loads on first use.
        assert set(dir(tasks)) <= set(tasks.__all__)

    def test_every_exported_name_resolves_to_its_module_attribute(self) -> None:
        for name in tasks.__all__:
            value = getattr(tasks, name)
            home = importlib.import_module(value.__module__)
            assert getattr(home, name, value) is value, name

    def test_an_unknown_name_is_an_attribute_error(self) -> None:
        with pytest.raises(AttributeError, match="no_such_name"):
            tasks.no_such_name  # noqa: B018  # the access is the test
