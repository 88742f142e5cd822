"""Flower server strategies for one-shot merging (plug into any ServerApp).

- :class:`OneShotAverage`: one round, robust weighted average, BN re-estimation and temperature
  calibration (server-side or federated).
- :class:`PermutationAlignedAverage`: the same after alignment by a registered merge method
  (:mod:`fedlmc.merging.method_registry`: weight or activation matching, MergeMany,
  random-permutation control).
- :class:`AutoMerge`: the ``auto`` method: plain averaging when it is good enough on the server
  data, else the better of it and weight matching.
- :class:`FedAvgBaseline`: multi-round FedAvg with the same total local epochs.

All four derive from :class:`fedlmc.strategies.base.ScreenedFedAvg` (wait for every node, screen the
replies) and take one :class:`StrategyOptions` (:mod:`fedlmc.strategies.options`: the clients, the
screens, the calibration);
:mod:`fedlmc.strategies.protocol` encodes what travels between the ClientApp and the server.
Their ``start`` returns a frozen result object holding Flower's ``Result`` records plus the
strategy's details: :class:`OneShotResult` (the round's merge, temperature and report) and
:class:`FedAvgResult` (each round's report). ``OneShotAverage`` with
``StrategyOptions(..., keep_client_states=True)`` is the collecting mode used by studies: the
survivors' weights stay in ``result.report.survivors`` for ``fedlmc.study.compare_methods``.
"""

from fedlmc.strategies.base import ScreenedFedAvg
from fedlmc.strategies.fedavg import FedAvgBaseline, FedAvgResult, epochs_per_round
from fedlmc.strategies.one_shot import (
    AutoMerge,
    OneShotAverage,
    OneShotResult,
    OneShotRound,
    PermutationAlignedAverage,
)
from fedlmc.strategies.options import StrategyOptions
from fedlmc.strategies.protocol import state_to_record
from fedlmc.strategies.strategy_utils import (
    ClientsFailedError,
    InconsistentShapesError,
    NodesUnavailableError,
    NotEnoughClientsError,
)

__all__ = [  # what a ServerApp instantiates first (the API page follows this order)
    "StrategyOptions",
    "OneShotAverage",
    "PermutationAlignedAverage",
    "AutoMerge",
    "FedAvgBaseline",
    "OneShotResult",
    "OneShotRound",
    "FedAvgResult",
    "state_to_record",
    "epochs_per_round",
    "NotEnoughClientsError",
    "ClientsFailedError",
    "InconsistentShapesError",
    "NodesUnavailableError",
    "ScreenedFedAvg",
]
