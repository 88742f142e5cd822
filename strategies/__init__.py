"""Flower server strategies for one-shot merging (plug into any ServerApp).

- :class:`OneShotAverage`: one round, robust weighted average, BN re-estimation and temperature
  calibration (server-side or federated).
- :class:`PermutationAlignedAverage`: the same after Git Re-Basin permutation alignment.
- :class:`FedAvgBaseline`: multi-round FedAvg with the same total local epochs.

``OneShotAverage(..., keep_client_states=True)`` is the collecting mode used by studies: the
survivors' weights stay in ``strategy.report.survivors`` for ``fedlmc.study.evaluate_methods``.
"""

from strategies.common import (
    InconsistentShapesError,
    NodesUnavailableError,
    NotEnoughClientsError,
)
from strategies.fedavg import FedAvgBaseline, epochs_per_round
from strategies.one_shot import OneShotAverage, PermutationAlignedAverage

__all__ = [
    "FedAvgBaseline",
    "InconsistentShapesError",
    "NodesUnavailableError",
    "NotEnoughClientsError",
    "OneShotAverage",
    "PermutationAlignedAverage",
    "epochs_per_round",
]
