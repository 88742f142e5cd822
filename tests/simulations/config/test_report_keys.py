"""The ``[report]`` settings of a sweep file
(:data:`fedlmc.simulations.config.report_keys.REPORT_SCHEMA`)."""

from __future__ import annotations

import pytest

from fedlmc.simulations.config.report_keys import REPORT_SCHEMA
from fedlmc.simulations.config.schema import ConfigError, check_value


def test_the_defaults_pass_their_checks():
    for name, key in REPORT_SCHEMA.items():
        assert check_value(name, key.default, REPORT_SCHEMA, "report.") == key.default


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("dpi", 10, "allowed: an integer 50 .. 1200 (print resolution)"),
        ("error-bars", "var", "allowed: std, sem, none"),
    ],
)
def test_a_bad_report_setting_is_refused_naming_it(key, value, allowed):
    with pytest.raises(ConfigError) as error:
        check_value(key, value, REPORT_SCHEMA, "report.")
    assert str(error.value) == f"report.{key} = {value!r}: {allowed}"


def test_a_good_report_setting_is_kept():
    assert check_value("dpi", 300, REPORT_SCHEMA) == 300
    assert check_value("error-bars", "sem", REPORT_SCHEMA) == "sem"
