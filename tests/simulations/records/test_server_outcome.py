"""What one ServerApp run produces (:mod:`fedlmc.simulations.records.server_outcome`): the
outcome record, the round columns and the widths resolved from the run config."""

from __future__ import annotations

import math

from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.records.server_outcome import (
    ServerOutcome,
    round_columns,
    train_config_record,
    width_columns,
)
from fedlmc.strategies.strategy_utils import ClientUpdate, Failure, RoundReport
from fedlmc.study.rows import ROUND_COLUMNS


def update(pid: int, seconds: float | None) -> ClientUpdate:
    metrics = {} if seconds is None else {"train-seconds": seconds}
    return ClientUpdate(
        partition_id=pid,
        node_id=10 + pid,
        state={},
        num_examples=5,
        metrics=metrics,
        tensor_bytes=0,
    )


def test_round_columns_are_the_schemas_in_order_and_sum_the_survivors():
    config = validate_run_config({"client-widths": "0.5,1", "methods": "embed_average"},
                                 check_devices=False)  # fmt: skip
    report = RoundReport(survivors=[update(0, 2.0), update(1, None)])
    report.failures.append(Failure(node_id=12, partition_id=2, reason="boom"))
    columns = round_columns(report, bytes_sent=1234, seconds=3.5, rounds=2, config=config)
    assert tuple(columns) == ROUND_COLUMNS
    assert columns["clients_survived"] == 2 and "boom" in columns["clients_failed"]
    assert columns["train_seconds"] == 2.0  # a survivor reporting no time counts 0
    assert (columns["bytes_sent_by_clients"], columns["rounds"]) == (1234, 2)
    assert columns["client_widths"] == "0.5,1" and columns["server_width"] == 1.0
    dropped = update(0, 2.0)
    dropped.metric_problems = ("train-seconds = 1e+300; allowed: a finite number",)
    only = round_columns(RoundReport(survivors=[dropped]), 0, 0.0, 1, config)
    assert math.isnan(only["train_seconds"])  # the screen removed it: undefined


def test_the_outcome_table_appends_the_run_config_on_request():
    config = validate_run_config({}, check_devices=False)
    outcome = ServerOutcome(config=config, rows=[{"method": "average", "accuracy": 0.5}])
    assert list(outcome.table().columns) == ["method", "accuracy"]
    table = outcome.table(with_config=True)
    assert table.loc[0, "width"] == config["width"] and table.loc[0, "accuracy"] == 0.5
    assert width_columns(config) == {"client_widths": "1,1", "server_width": 1.0}
    assert dict(train_config_record(config)) == dict(config)
