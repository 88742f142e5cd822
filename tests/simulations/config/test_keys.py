"""The key table (:mod:`fedlmc.simulations.config.keys`): every key's default passes its own
check, every numeric key declares the range a real run could use (a value just outside it is
refused, one at its edge accepted), the model options sit after ``width``, and the runtime
keys are the ones declared so."""

from __future__ import annotations

import math

import pytest

from fedlmc.simulations.config.keys import (
    MODEL_OPTIONS_AFTER,
    RUN_KEYS,
    run_schema,
    runtime_keys,
)
from fedlmc.simulations.config.report_keys import REPORT_SCHEMA
from fedlmc.simulations.config.schema import ConfigError, Range, check_value
from fedlmc.simulations.config.tables import keys_table

SCHEMAS = {"run": run_schema(), "report": REPORT_SCHEMA}
NUMERIC = [
    pytest.param(schema, name, id=f"{schema}.{name}")
    for schema, keys in SCHEMAS.items()
    for name, key in keys.items()
    if key.type in (int, float)
]


def test_every_default_passes_its_own_check():
    schema = run_schema()
    for name, key in schema.items():
        assert check_value(name, key.default, schema) == key.default, name


def test_every_key_has_a_one_line_meaning():
    for name, key in run_schema().items():
        assert key.doc and "\n" not in key.doc, name


def test_the_model_options_follow_width_and_are_not_in_run_keys():
    names = list(run_schema())
    options = [n for n in names if n not in RUN_KEYS]
    assert options and "base-hidden" in options
    after = names.index(MODEL_OPTIONS_AFTER)
    assert names[after + 1 : after + 1 + len(options)] == options
    assert [n for n in names if n in RUN_KEYS] == list(RUN_KEYS)  # documentation order kept


def test_runtime_keys_are_exactly_those_declared_runtime():
    schema = run_schema()
    runtime = runtime_keys()
    assert set(runtime) == {n for n, k in schema.items() if k.runtime}
    assert {"device", "num-cpus", "data-root"} <= set(runtime)
    assert not {"seed", "model", "methods"} & set(runtime)


def test_the_numeric_keys_are_the_ones_ranged():
    names = {p.values[1] for p in NUMERIC}
    assert {"epochs", "lr", "server-cpus", "num-cpus", "depth", "timeout", "dpi"} <= names
    assert len(NUMERIC) == 47  # the count the closing note of issue 52 reports


@pytest.mark.parametrize(("schema", "name"), NUMERIC)
def test_every_numeric_key_declares_a_finite_range_holding_its_default(schema, name):
    key = SCHEMAS[schema][name]
    assert isinstance(key.check, Range), name
    bounds = key.check
    assert bounds.integer == (key.type is int)
    assert math.isfinite(bounds.low) and math.isfinite(bounds.high) and bounds.low < bounds.high
    assert bounds(key.default) is None
    if schema == "run":
        row = next(line for line in keys_table().splitlines() if line.startswith(f"| `{name}` |"))
        assert f"; {bounds.allowed}" in row  # `fedlmc keys` states the range


def edges(bounds: Range) -> tuple[list, list]:
    """``(just outside, at the edge inside)``: the integers next to the bounds, or the floats
    next to them (the bound itself where the end is closed, its neighbour where it is open)."""
    if bounds.integer:
        return [bounds.low - 1, bounds.high + 1], [bounds.low, bounds.high]
    below, above = math.nextafter(bounds.low, -math.inf), math.nextafter(bounds.high, math.inf)
    outside = [bounds.low if bounds.low_open else below, bounds.high if bounds.high_open else above]
    low = math.nextafter(bounds.low, math.inf) if bounds.low_open else bounds.low
    high = math.nextafter(bounds.high, -math.inf) if bounds.high_open else bounds.high
    return outside, [low, high]


@pytest.mark.parametrize(("schema", "name"), NUMERIC)
def test_a_value_just_outside_the_range_is_refused_and_one_at_its_edge_accepted(schema, name):
    keys = SCHEMAS[schema]
    bounds = keys[name].check
    outside, inside = edges(bounds)
    for value in outside:
        with pytest.raises(ConfigError) as refused:
            check_value(name, value, keys)
        message = str(refused.value)
        assert message.startswith(f"{name} = ") and bounds.bounds in message, message
        assert "\n" not in message
    for value in inside:
        assert check_value(name, value, keys) == value


@pytest.mark.parametrize("name", ["num-cpus", "num-gpus"])
@pytest.mark.parametrize("value", [1e-5, 5e-324, 9.9e-5])
def test_a_resource_share_finer_than_ray_schedules_is_refused(name, value):
    """Ray fails a non-zero ``num_cpus`` / ``num_gpus`` below 0.0001 only once it started
    ("The precision of the fractional quantity ... cannot go beyond 0.0001")."""
    schema = run_schema()
    with pytest.raises(ConfigError, match=r"0\.0001"):
        check_value(name, value, schema)
    assert check_value(name, 1e-4, schema) == 1e-4
