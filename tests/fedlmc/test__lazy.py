"""fedlmc._lazy: a package's ``__getattr__``/``__dir__`` import a module on first use only."""

from __future__ import annotations

import sys

import pytest

from fedlmc._lazy import lazy_exports


def test_a_lazy_name_resolves_to_its_module_attribute_on_first_use():
    getattr_, dir_ = lazy_exports("fedlmc", {"check_unique": ".column_schema", "KINDS": ".columns"})
    assert dir_() == ["KINDS", "check_unique"]
    from fedlmc.column_schema import check_unique

    assert getattr_("check_unique") is check_unique
    assert getattr_("KINDS") == ("number", "text", "JSON")


def test_an_absolute_module_path_is_imported_only_when_asked(monkeypatch):
    monkeypatch.delitem(sys.modules, "fedlmc.training_columns", raising=False)
    getattr_, _ = lazy_exports("anything", {"TRAINING_FILE": "fedlmc.training_columns"})
    assert "fedlmc.training_columns" not in sys.modules
    assert getattr_("TRAINING_FILE") == "training.csv"
    assert "fedlmc.training_columns" in sys.modules


def test_an_unknown_name_is_an_attribute_error_naming_package_and_name():
    getattr_, _ = lazy_exports("fedlmc.data", {"partition": ".partitions"})
    with pytest.raises(AttributeError, match=r"'fedlmc.data' has no attribute 'nope'"):
        getattr_("nope")
