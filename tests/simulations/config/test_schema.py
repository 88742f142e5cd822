"""Typed keys and their checks (:mod:`fedlmc.simulations.config.schema`): a bad value is refused
with one line naming the key, the value and what is allowed; numbers are coerced as TOML needs."""

from __future__ import annotations

import pytest

from fedlmc.simulations.config.schema import (
    MAX_INT,
    MAX_SHOWN,
    ConfigError,
    Key,
    at_least,
    check_value,
    coerce,
    did_you_mean,
    fraction,
    named,
    shown,
)

SCHEMA = {
    "rate": Key(float, 0.1, "a rate", at_least(0.0, strict=True)),
    "count": Key(int, 1, "a count", at_least(1)),
    "share": Key(float, 0.5, "a share", fraction),
    "mode": named(str, "off", "a mode", ("off", "true", "false"), booleans=True),
}


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("rate", 0.0, "rate = 0.0: allowed: a number > 0.0"),
        ("count", 0, "count = 0: allowed: a number >= 1"),
        ("share", 1.0, "share = 1.0: allowed: a number in [0, 1)"),
        ("mode", "on", "mode = 'on': allowed: off, true, false"),
        ("count", "3", "count = '3': expected int"),
        ("count", True, "count = True: expected int"),
        ("rate", float("inf"), "rate = inf: allowed: a finite number"),
    ],
)
def test_a_bad_value_gets_one_line_naming_key_value_and_what_is_allowed(key, value, expected):
    with pytest.raises(ConfigError) as error:
        check_value(key, value, SCHEMA)
    assert str(error.value) == expected


def test_where_prefixes_the_key_in_the_message():
    with pytest.raises(ConfigError, match=r"^grid\.count = 0: "):
        check_value("count", 0, SCHEMA, where="grid.")


def test_numbers_are_coerced_as_toml_needs_and_booleans_read_as_names():
    assert check_value("rate", 1, SCHEMA) == 1.0 and isinstance(
        check_value("rate", 1, SCHEMA), float
    )
    assert check_value("count", 4.0, SCHEMA) == 4 and isinstance(
        check_value("count", 4.0, SCHEMA), int
    )
    assert check_value("mode", True, SCHEMA) == "true"
    with pytest.raises(ConfigError, match="expected int"):
        coerce("count", 4.5, int)


def test_an_integer_beyond_64_bits_is_out_of_range_with_the_allowed_range():
    with pytest.raises(ConfigError) as error:
        check_value("count", MAX_INT + 1, SCHEMA)
    message = str(error.value)
    assert message.startswith("count = ") and "out of range; allowed: a number >= 1" in message
    assert f"at most {MAX_INT}" in message


def test_long_values_are_cut_with_their_length():
    text = shown("x" * 1000)
    assert len(text) < 2 * MAX_SHOWN and "(1002 characters)" in text
    assert shown("short") == "'short'"


def test_did_you_mean_names_the_closest_choice_or_nothing():
    assert did_you_mean("averge", ["average", "ensemble"]) == " (did you mean 'average'?)"
    assert did_you_mean("zzz", ["average", "ensemble"]) == ""


def test_a_list_key_takes_a_toml_list_or_names_both_forms(tmp_path):
    """Issue 54 item 9: ``methods = [...]`` in a sweep file is the list it reads as."""
    from fedlmc.simulations.config import load_sweep_config, validate_run_config

    config = validate_run_config({"methods": ["average", "ensemble"], "client-widths": [1, 1]})
    assert config["methods"] == "average,ensemble" and config["client-widths"] == "1,1"
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\n[run]\nmethods = ["average", "ensemble"]\n[grid]\nseed = [0, 1]\n')
    assert load_sweep_config(path, check_devices=False).run["methods"] == "average,ensemble"
    for bad in (3, ["average", True], {"a": 1}):
        with pytest.raises(ConfigError, match="allowed: a comma-separated string or a list"):
            validate_run_config({"methods": bad})


def test_collected_names_every_failed_check_and_one_alone():
    from fedlmc.simulations.config.schema import ConfigErrors, collected

    def bad(text):
        def check():
            raise ConfigError(text)

        return check

    assert collected([lambda: 1, lambda: 2]) == [1, 2]
    with pytest.raises(ConfigError, match="^one$") as alone:
        collected([lambda: 1, bad("one")])
    assert not isinstance(alone.value, ConfigErrors)
    with pytest.raises(ConfigErrors) as several:
        collected([bad("a"), lambda: 1, bad("b"), bad("c")])
    assert several.value.messages == ["a", "b", "c"]
