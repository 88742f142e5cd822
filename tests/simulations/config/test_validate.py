"""One run config validated in one call (:func:`validate_run_config`): defaults, value checks,
the checks on several keys, and the defaults that follow the cell."""

from __future__ import annotations

import pytest

from fedlmc.simulations.config import (
    ConfigError,
    cell_default_methods_note,
    default_methods,
    mixed_width_counterparts,
    run_schema,
    validate_run_config,
)


def test_every_key_gets_its_declared_default():
    config = validate_run_config({}, check_devices=False)
    assert dict(config) == {key: spec.default for key, spec in run_schema().items()}


def test_an_unknown_key_is_named_with_the_closest_key():
    with pytest.raises(ConfigError, match=r"unknown key 'widht' \(did you mean 'width'\?\)"):
        validate_run_config({"widht": 2.0}, check_devices=False)


def test_a_bad_value_is_named_with_what_is_allowed():
    with pytest.raises(ConfigError, match="partition"):
        validate_run_config({"partition": "random"}, check_devices=False)
    with pytest.raises(ConfigError, match="num-clients"):
        validate_run_config({"num-clients": 0}, check_devices=False)


def test_a_check_on_several_keys_runs_after_the_values():
    with pytest.raises(
        ConfigError, match="client-widths = '1,2': 2 widths; allowed: one per client"
    ):
        validate_run_config({"client-widths": "1,2", "num-clients": 3}, check_devices=False)


def test_mixed_widths_get_the_counterparts_of_the_default_methods_and_say_so():
    counterparts = mixed_width_counterparts(default_methods())
    assert counterparts.startswith("embed_average,embed_average_t")
    plain = validate_run_config({}, check_devices=False)
    assert plain["methods"] == default_methods() and cell_default_methods_note(plain) is None
    mixed = validate_run_config({"client-widths": "0.5,1"}, check_devices=False)
    assert mixed["methods"] == counterparts
    note = cell_default_methods_note(mixed)
    assert note is not None and "client widths 0.5,1" in note and default_methods() in note


def test_an_explicit_method_list_is_checked_as_given():
    config = validate_run_config(
        {"client-widths": "0.5,1", "methods": "embed_average"}, check_devices=False
    )
    assert config["methods"] == "embed_average"
    with pytest.raises(ConfigError, match="weight_matching"):
        validate_run_config(
            {"client-widths": "0.5,1", "methods": "weight_matching"}, check_devices=False
        )
