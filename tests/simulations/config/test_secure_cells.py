"""Which cells run under secure aggregation (:mod:`fedlmc.simulations.config.secure`)."""

from __future__ import annotations

import pytest

from fedlmc.simulations.config import ConfigError, validate_run_config
from fedlmc.simulations.config.secure import (
    is_secure,
    secure_cells_in_flight,
    secure_choices,
    secure_methods,
)


def test_the_secure_methods_come_from_the_registry():
    methods = secure_methods()
    assert "average" in methods and "weight_matching" not in methods
    assert secure_choices().startswith("strategy = 'average'")


def test_secure_cells_run_one_at_a_time():
    secure, clear = {"secure-aggregation": "secagg+"}, {"secure-aggregation": "off"}
    assert is_secure(secure) and not is_secure(clear) and not is_secure({})
    assert secure_cells_in_flight([clear, secure], 4) == 1
    assert secure_cells_in_flight([clear, clear], 4) == 4


def test_a_secure_cell_is_refused_naming_what_the_method_needs():
    ok = validate_run_config(
        {"strategy": "average", "secure-aggregation": "secagg+"}, check_devices=False
    )
    assert is_secure(ok)
    with pytest.raises(ConfigError, match="'weight_matching' needs the server to see each model"):
        validate_run_config(
            {"strategy": "aligned", "align": "weight_matching", "secure-aggregation": "secagg+"},
            check_devices=False,
        )
    with pytest.raises(ConfigError, match="strategy = 'compare'"):
        validate_run_config(
            {"strategy": "compare", "methods": "average", "secure-aggregation": "secagg+"},
            check_devices=False,
        )
