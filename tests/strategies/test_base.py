"""The screened FedAvg every fedlmc strategy builds on (:mod:`fedlmc.strategies.base`): one
options object, the protocol keys it sends, the claimed totals."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord

from fedlmc.strategies.base import ScreenedFedAvg, claimed_total, configured_epochs
from fedlmc.strategies.options import StrategyOptions
from fedlmc.strategies.protocol import PROTOCOL_KEYS, holdout_share
from fedlmc.strategies.strategy_utils import ClientUpdate, RoundReport


def test_the_strategy_takes_one_options_object_and_reads_it():
    strategy = ScreenedFedAvg(StrategyOptions(num_clients=3, min_clients=2))
    assert (strategy.num_clients, strategy.min_clients) == (3, 2)
    assert strategy.min_train_nodes == strategy.min_available_nodes == 3
    with pytest.raises(AttributeError):
        strategy.num_clients = 4  # type: ignore[misc]
    with pytest.raises(TypeError, match="allowed: a StrategyOptions"):
        ScreenedFedAvg({"num_clients": 3})  # type: ignore[arg-type]


def test_a_round_adds_only_protocol_keys_to_the_callers_config():
    options = StrategyOptions(num_clients=2, holdout_share=0.2, calibration="federated")
    sent = dict(ScreenedFedAvg(options).round_config(3, ConfigRecord({"lr": 0.1})))
    assert sent["lr"] == 0.1 and sent["server-round"] == 3
    assert set(sent) - {"lr"} <= PROTOCOL_KEYS and holdout_share(sent) == 0.2
    plain = dict(ScreenedFedAvg(StrategyOptions(num_clients=2)).round_config(1, ConfigRecord()))
    assert plain == {"server-round": 1}


def test_configured_epochs_and_claimed_totals():
    assert configured_epochs({"epochs": 4}) == 4
    assert configured_epochs({"epochs": True}) is None and configured_epochs({}) is None
    survivors = [
        ClientUpdate(
            partition_id=p, node_id=p, state={}, num_examples=n, metrics={}, tensor_bytes=0
        )
        for p, n in enumerate((3, 2**62, 2**62))
    ]
    assert claimed_total(RoundReport(survivors=survivors[:1])) == 3
    assert isinstance(claimed_total(RoundReport(survivors=survivors)), float)  # beyond int64
