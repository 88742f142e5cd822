"""The tables read from the registries (:mod:`fedlmc.simulations.config.tables`): one row per
registered method, model and key, and the ``[tool.flwr.app.config]`` block that reads back as
the run schema's defaults and replaces only its own lines."""

from __future__ import annotations

import tomllib

import pytest

from fedlmc.merging import merge_method_names
from fedlmc.models import model_names
from fedlmc.simulations.config import run_schema
from fedlmc.simulations.config.tables import (
    PYPROJECT_TABLE,
    _pyproject_config_of,
    keys_table,
    methods_table,
    models_table,
    pyproject_config,
    with_pyproject_config,
)


def body(table: str) -> list[str]:
    lines = table.split("\n")
    assert lines[1].startswith("|---")
    return lines[2:]


def test_every_key_has_one_row_in_schema_order():
    rows = body(keys_table())
    assert [row.split(" | ")[0].strip("| `") for row in rows] == list(run_schema())
    device = next(row for row in rows if row.startswith("| `device`"))
    assert device.endswith("| no: runtime |")


def test_every_method_and_model_is_in_its_table():
    methods, models = methods_table(), models_table()
    for name in merge_method_names():
        assert f"`{name}`" in methods, name
    for name in model_names():
        assert f"`{name}`" in models, name


def test_the_pyproject_block_reads_back_as_the_defaults():
    block = pyproject_config()
    assert block.startswith(PYPROJECT_TABLE + "\n")
    values = tomllib.loads(block)["tool"]["flwr"]["app"]["config"]
    assert values == {name: key.default for name, key in run_schema().items()}


def test_the_block_is_replaced_in_place_and_read_back():
    text = '[project]\nname = "x"\n\n[tool.flwr.app.config]\nseed = 99\n\n[tool.other]\na = 1\n'
    assert _pyproject_config_of(text) == "[tool.flwr.app.config]\nseed = 99\n"
    new = with_pyproject_config(text)
    assert new.startswith('[project]\nname = "x"\n\n') and new.endswith("\n\n[tool.other]\na = 1\n")
    assert _pyproject_config_of(new) == pyproject_config()


def test_a_pyproject_without_the_block_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"^no \[tool\.flwr\.app\.config\] table; allowed: "):
        _pyproject_config_of('[project]\nname = "x"\n')
