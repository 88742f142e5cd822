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

from fedlmc._lazy import lazy_exports

_EXPORTS = {
    "ScreenedFedAvg": "fedlmc.strategies.base",
    "FedAvgBaseline": "fedlmc.strategies.fedavg",
    "FedAvgResult": "fedlmc.strategies.fedavg",
    "epochs_per_round": "fedlmc.strategies.fedavg",
    "AutoMerge": "fedlmc.strategies.one_shot",
    "OneShotAverage": "fedlmc.strategies.one_shot",
    "OneShotResult": "fedlmc.strategies.one_shot_result",
    "OneShotRound": "fedlmc.strategies.one_shot_result",
    "PermutationAlignedAverage": "fedlmc.strategies.one_shot",
    "StrategyOptions": "fedlmc.strategies.options",
    "state_to_record": "fedlmc.strategies.protocol",
    "ClientsFailedError": "fedlmc.strategies.strategy_utils",
    "InconsistentShapesError": "fedlmc.strategies.strategy_utils",
    "NodesUnavailableError": "fedlmc.strategies.strategy_utils",
    "NotEnoughClientsError": "fedlmc.strategies.strategy_utils",
}
"""Each public name and the module defining it, imported on first use: ``import
fedlmc.strategies.protocol`` (what every ClientApp process loads) imports no strategy, and
so no torch."""

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
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
