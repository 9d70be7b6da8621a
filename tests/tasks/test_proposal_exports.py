"""The ``tasks`` exports owned by the planning side resolve, lazily or not."""

from __future__ import annotations

import importlib

import pytest

import tasks


class TestLazyExports:
    def test_every_lazy_name_is_exported(self) -> None:
        assert set(tasks._LAZY) <= set(tasks.__all__)

    def test_every_lazy_name_resolves_to_its_module_attribute(self) -> None:
        for name, module in tasks._LAZY.items():
            assert getattr(tasks, name) is getattr(importlib.import_module(module), name)

    def test_an_unknown_name_is_an_attribute_error(self) -> None:
        with pytest.raises(AttributeError, match="no_such_name"):
            tasks.no_such_name  # noqa: B018  # the access is the test
