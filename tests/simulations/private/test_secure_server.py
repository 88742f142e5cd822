"""The round columns of a secure ``average`` row (``secure_round_columns``) when SecAgg+ merged
without a node, on a constructed round: the dropped node counted and named by its node id,
the stage and the reason, and a node that missed only the unmask stage (its masked vector is
in the sum) not counted as dropped."""

from __future__ import annotations

import numpy as np

from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.private.secure_server import secure_round_columns
from fedlmc.simulations.records.server_outcome import width_columns
from fedlmc.strategies.secure import SecureResult, SecureSettings


def _round(dropped: dict[int, str], unmask_missed: dict[int, str]) -> SecureResult:
    survivors = 3 - len(dropped)
    return SecureResult(
        aggregate=[np.zeros(2)],
        settings=SecureSettings(8.0, 1000.0),
        num_examples=[400] * survivors,
        metrics=[{"train-seconds": 1.5}] * survivors,
        received=[[np.zeros(2)]] * survivors,
        dropped=dropped,
        unmask_missed=unmask_missed,
    )


def test_a_node_dropped_before_the_sum_is_counted_and_named_one_merged_late_is_not():
    config = validate_run_config(
        {"num-clients": 3, "strategy": "average", "init": "shared", "secure-aggregation": "secagg+"}
    )
    reason = "SecAgg+ stage 'masked vectors': Error: Node Unavailable"
    late = {9: "SecAgg+ stage 'unmask': no reply within the timeout (30 s)"}
    columns = secure_round_columns(_round({42: reason}, late), config, width_columns(config))
    assert columns["clients_survived"] == 2 and columns["clients_dropped"] == 1
    assert columns["clients_dropped_reasons"] == f"node 42: {reason}"
    assert columns["clients_failed"] == columns["clients_dropped_reasons"]
    assert columns["train_seconds"] == 3.0
    clean = secure_round_columns(_round({}, late), config, width_columns(config))
    assert clean["clients_survived"] == 3 and clean["clients_dropped"] == 0
    assert clean["clients_dropped_reasons"] == "" == clean["clients_failed"]
