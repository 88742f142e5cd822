"""The DP ``average`` mode's server side (:mod:`fedlmc.simulations.private.dp_server`): the
epsilon column and the round columns."""

from __future__ import annotations

import math

from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.private.dp_server import dp_epsilon, dp_round_columns
from fedlmc.simulations.records.server_outcome import width_columns
from fedlmc.strategies.private import private_one_shot_average
from fedlmc.study.rows import ROUND_COLUMNS


def test_epsilon_is_infinite_without_noise_and_falls_as_noise_grows():
    assert dp_epsilon(0.0, 4) == math.inf
    low, high = dp_epsilon(0.5, 4), dp_epsilon(2.0, 4)
    assert math.isfinite(low) and math.isfinite(high) and high < low


def test_the_round_columns_of_a_dp_round_before_any_reply():
    config = validate_run_config(
        {"dp": "server-fixed", "strategy": "average", "init": "shared", "num-clients": 3},
        check_devices=False,
    )
    strategy = private_one_shot_average(3, 1.0, 10.0, "server", noise_seed=0)
    columns = dp_round_columns(strategy, config, 1.5, width_columns(config))
    assert tuple(columns) == ROUND_COLUMNS
    assert columns["clients_survived"] == 0 and columns["clients_dropped"] == 3
    assert columns["round_seconds"] == 1.5 and math.isnan(columns["train_seconds"])
