"""The differential-privacy run-config keys (simulations/config/dp.py): a DP cell is refused
before any work, on one line naming the key and its value, unless it is the shared-init
plain average in the clear without warm-up or federated calibration; the DP key values are
checked. In process."""

from __future__ import annotations

import math

import pytest

from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.config.schema import ConfigError

DP = {"dp": "server-fixed", "strategy": "average", "init": "shared"}


def test_a_shared_init_average_with_dp_is_accepted_with_its_settings():
    config = validate_run_config({**DP, "dp-noise-multiplier": 0.0, "dp-clipping-norm": 0.5})
    assert (config["dp"], config["dp-noise-multiplier"], config["dp-clipping-norm"]) == (
        "server-fixed",
        0.0,
        0.5,
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"strategy": "compare"}, "dp = 'server-fixed' with strategy = 'compare'"),
        ({"init": "independent"}, "dp = 'server-fixed' with init = 'independent'"),
        ({"secure-aggregation": "secagg+"}, r"with secure-aggregation = 'secagg\+'"),
        ({"warmup-rounds": 1}, "dp = 'server-fixed' with warmup-rounds = 1"),
        ({"calibration": "federated"}, "with calibration = 'federated'"),
        ({"dp-clipping-norm": 0.0}, r"dp-clipping-norm = 0.0: allowed: a number in \(0, 1000000\]"),
        (
            {"dp-noise-multiplier": -0.1},
            r"dp-noise-multiplier = -0.1: allowed: a number in \[0, 1000\]",
        ),
        ({"dp-clipping-norm": math.inf}, "dp-clipping-norm"),
        ({"dp": "client"}, "dp = 'client': allowed: off, server-fixed, client-fixed"),
    ],
)
def test_a_dp_cell_outside_what_dp_runs_is_refused_naming_the_value(change, message):
    with pytest.raises(ConfigError, match=message) as raised:
        validate_run_config({**DP, **change})
    assert "\n" not in str(raised.value)


def test_without_dp_the_dp_settings_do_not_constrain_the_cell():
    config = validate_run_config({"strategy": "compare", "init": "independent"})
    assert config["dp"] == "off"
