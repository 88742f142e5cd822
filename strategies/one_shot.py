r"""One-shot merging strategies for Flower's Message API (``flwr.serverapp.strategy``).

One round: every connected client trains (independently initialised in the paper's setting) and
sends its weights; the server merges the survivors in one shot,

.. math:: \bar\theta = \sum_i w_i\, \pi_i(\theta_i), \qquad w_i = n_i / \textstyle\sum_j n_j,

with :math:`n_i` the client's ``num-examples`` and :math:`\pi_i` the identity
(:class:`OneShotAverage`) or the permutations of a registered merge method
(:class:`PermutationAlignedAverage`, :mod:`fedlmc.merging.methods`: weight or activation matching,
MergeMany, the random-permutation control, ...).
Then, for BatchNorm models, the merged model's running statistics are re-estimated, REPAIR
methods renormalise the hidden units of models without BatchNorm, and one softmax temperature
:math:`T` is fitted (``calibration``):

- ``"server"``: on the server's own held-out data (``server_data``); BatchNorm and REPAIR
  statistics come from it too;
- ``"federated"``: on the clients' held-out data without moving it (each client holds out a
  share of its partition from training, the run config's ``calibration-holdout``). Every
  data-dependent step after the merge runs on the clients through query rounds
  (:class:`fedlmc.strategies.queries.ClientRounds`): BatchNorm statistics (``query.bn_stats``),
  REPAIR's per-unit statistics (``query.unit_stats``), ``auto``'s calibrated NLLs, and the
  temperature: a grid of ``temperature_grid_points`` values of :math:`u = \log T` in one round, then
  Newton rounds of one value each (usually one). Sums are exact, so the result equals a centralised
  fit on the survivors' calibration data. Every message round costs a ClientApp start in a
  deployment (SuperNodes start a process per message), hence the grid;
- ``"none"``: :math:`T = 1` (BN statistics, if any, still re-estimated on ``server_data``).

The ``activation_federated`` method aligns on the clients whatever the calibration: one
``query.align`` round in which every client but the first matches its own model to client 0's
on its own data and returns only permutation indices.

Where the results travel. ``strategy.start(...)`` returns Flower's ``Result``: ``result.arrays``
holds the merged (BN-re-estimated) weights and ``result.train_metrics_clientapp[1]`` is a
MetricRecord with ``temperature``, ``log-temperature``, ``server-split-temperature`` (the
temperature fitted on the server split for the same merged model when the server holds data,
a reference for the federated one; NaN otherwise), ``clients-survived``, ``clients-failed``,
``bytes-received`` (tensor bytes of the trained weights plus the payload of every query reply,
:func:`fedlmc.strategies.protocol.payload_bytes`), ``query-rounds`` (message rounds after training),
``merge-seconds`` (alignment with its query rounds, averaging, BN re-estimation and REPAIR),
``bn-reestimated`` (0/1) and the num-examples-weighted means of the clients' training metrics.
Shared with the FedAvg baseline (:class:`fedlmc.strategies.base.ScreenedFedAvg`): waiting for every
node, screening the replies, the client counts.
The strategy object keeps the details of the last round: ``strategy.report`` (survivors sorted
by partition id, failures with reasons), ``strategy.temperature``, ``strategy.calibration_history``
and ``strategy.merged_state``.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from logging import INFO, WARNING
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.supercore import log
from torch import Tensor, nn

from fedlmc.averaging import load_state
from fedlmc.evaluation import predict_logits, resolve_device
from fedlmc.merging.calibrate import (
    apply_bn_statistics,
    fit_temperature,
    has_batchnorm,
    reset_bn_stats,
    temperature_grid,
)
from fedlmc.merging.methods import AUTO_TOLERANCE, merge_method, merge_with_info
from fedlmc.merging.repair import repair
from fedlmc.permutation.chain import norm_free_chain
from fedlmc.permutation.model_spec import permutation_spec
from fedlmc.permutation.spec import PermutationSpec
from fedlmc.strategies.base import ScreenedFedAvg
from fedlmc.strategies.common import ClientUpdate, RoundReport, StateDict, require_survivors
from fedlmc.strategies.protocol import ALIGN_QUERY, NUM_EXAMPLES_KEY, metric_record, state_to_record
from fedlmc.strategies.queries import ClientRounds
from fedlmc.strategies.screening import WeightBound

Data = tuple[Tensor, Tensor]
CALIBRATIONS = ("server", "federated", "none")


def _check_choice(what: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{what} = {value!r}; allowed: {', '.join(allowed)}")
    return value


class OneShotAverage(ScreenedFedAvg):
    """Flower ``FedAvg`` turned into a robust one-shot merge with temperature calibration.

    Parameters
    ----------
    template : nn.Module
        A model of the clients' architecture (its weights are not used): needed to load the
        merged weights for BN re-estimation and temperature fitting.
    num_clients : int
        Nodes to wait for before sending the round (``wait_timeout`` seconds at most).
    min_clients : int
        Fewest surviving replies the merge accepts (:class:`NotEnoughClientsError` otherwise).
    calibration : "server" | "federated" | "none"
    server_data : (x, y), optional
        The server's held-out data; required for ``calibration="server"`` and used for BN
        re-estimation unless calibration is federated.
    keep_client_states : bool
        Keep the survivors' state dicts in ``strategy.report`` (for studies comparing methods).

    Calibration queries carry the round's train config, so clients see the same run
    configuration.
    """

    merge_method = "average"
    """The registered merge method (:mod:`fedlmc.merging.methods`) this strategy applies."""

    def __init__(
        self,
        template: nn.Module,
        *,
        num_clients: int,
        min_clients: int = 2,
        calibration: str = "server",
        server_data: Data | None = None,
        wait_timeout: float = 600.0,
        query_timeout: float | None = 600.0,
        keep_client_states: bool = False,
        temperature_steps: int = 8,
        temperature_grid_points: int = 1001,
        device: str | torch.device | None = None,
        weighted_by_key: str = NUM_EXAMPLES_KEY,
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        weight_bound: WeightBound | None = None,
    ) -> None:
        super().__init__(
            num_clients=num_clients,
            min_clients=min_clients,
            wait_timeout=wait_timeout,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            weight_bound=weight_bound,
        )
        self.template = copy.deepcopy(template).cpu().eval()
        self.calibration = _check_choice("calibration", calibration, CALIBRATIONS)
        if calibration == "server" and server_data is None:
            raise ValueError("calibration = 'server' needs server_data (x, y); got None")
        self.server_data = server_data
        self.query_timeout = query_timeout
        self.keep_client_states = bool(keep_client_states)
        self.temperature_steps = int(temperature_steps)
        self.temperature_grid_points = int(temperature_grid_points)
        temperature_grid(self.temperature_grid_points)  # validates
        self.device = resolve_device(device)
        self.report = RoundReport()
        self.temperature = 1.0
        self.calibration_history: list[dict[str, float]] = []
        self.bn_source = "none"
        self.query_bytes = 0
        self.query_rounds = 0
        self.merge_seconds = math.nan
        self.server_split_temperature = math.nan
        self.merged_state: StateDict | None = None
        self.seed = 0
        self.spec: PermutationSpec | None = None
        self.method_options: dict[str, Any] = {}
        self.merge_info: dict[str, Any] = {}

    # ------------------------------------------------------------------------- Flower hooks

    def summary(self) -> None:
        """Log the strategy's settings."""
        log(
            INFO,
            "\t├──> %s (%s): %d clients (min %d survivors), calibration %s",
            type(self).__name__,
            self.merge_method,
            self.num_clients,
            self.min_clients,
            self.calibration,
        )
        log(INFO, "\t└──> Weighted by: '%s'", self.weighted_by_key)

    def round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        """The train config, plus what this strategy's clients need to know whatever the
        caller's ServerApp sends: ``calibration = "federated"`` (so that clients hold out their
        calibration share) and, for a merge method that runs on the clients
        (``activation_federated``), ``strategy = "aligned"`` and ``align`` (so that clients keep
        their trained model for the align query)."""
        config = super().round_config(server_round, config)
        entry = merge_method(self.merge_method)
        if entry.needs_clients or (self.on_clients and config.get("strategy") != "average"):
            if entry.name != "average":
                config["strategy"], config["align"] = "aligned", entry.name
        if self.on_clients:
            config["calibration"] = "federated"
            config.setdefault("strategy", "average")
        return config

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Screen the replies, merge the survivors, re-estimate BN, REPAIR, fit the temperature."""
        report = self.screen(server_round, replies)
        self.report = report
        clients = self.client_rounds(report.survivors)
        states = [u.state for u in report.survivors]
        weights = self.merge_weights(report)
        start = time.perf_counter()
        merged, aligned = self.merge(states, weights, clients)
        if len(aligned) < len(states):  # clients dropped by the alignment query: not merged
            self.drop_unaligned(report, clients)
            states = [u.state for u in report.survivors]
            weights = self.merge_weights(report)
        model = load_state(self.template, merged).to(self.device).eval()
        self.bn_source = self.reestimate_batchnorm(model, clients)
        model = self.repair_units(model, aligned, weights, clients)
        self.merge_seconds = time.perf_counter() - start
        final = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        self.merged_state = final
        arrays = state_to_record(final)
        self.temperature = self.calibrate_temperature(model, arrays, clients)
        self.query_rounds, self.query_bytes = clients.rounds, clients.bytes_received
        report.query_failures = [f for f in clients.dropped if f.stage != ALIGN_QUERY]
        if not self.keep_client_states:
            for update in report.survivors:
                update.state = {}
        log(
            INFO,
            "aggregate_train: merged %d clients %s (%s), temperature %.4f, %d query rounds",
            len(states),
            report.survivor_ids,
            self.merge_method,
            self.temperature,
            self.query_rounds,
        )
        return arrays, metric_record(self.round_metrics(report))

    def drop_unaligned(self, report: RoundReport, clients: ClientRounds) -> None:
        """Move the clients whose alignment answer was dropped out of the survivors; raises
        :class:`~fedlmc.strategies.common.NotEnoughClientsError` when fewer than ``min_clients``
        remain."""
        for failure in clients.dropped:
            if failure.stage == ALIGN_QUERY:
                report.drop(failure)
        require_survivors(report, self.min_clients)

    def client_rounds(self, survivors: Sequence[ClientUpdate]) -> ClientRounds:
        """The query rounds on this round's survivors
        (:class:`fedlmc.strategies.queries.ClientRounds`)."""
        return ClientRounds(
            self._grid,
            survivors,
            self._round_config,
            template=self.template,
            device=self.device,
            timeout=self.query_timeout,
            min_clients=self.min_clients,
            grid_points=self.temperature_grid_points,
            newton_steps=self.temperature_steps,
            weight_bound=self.weight_bound,
            spec=self.spec,
        )

    @property
    def on_clients(self) -> bool:
        """Whether the data-dependent steps after the merge use the clients' data."""
        return self.calibration == "federated"

    # ------------------------------------------------------------------------- merge

    def merge(
        self,
        states: Sequence[StateDict],
        weights: Sequence[float],
        clients: ClientRounds | None = None,
    ) -> tuple[StateDict, list[StateDict]]:
        r""":func:`fedlmc.merging.methods.merge_with_info` with this strategy's ``merge_method``:
        :math:`\sum_i w_i \pi_i(\theta_i)` (plain average: :math:`\pi_i = \mathrm{id}`) and the
        clients in the merged basis. ``clients`` reach the method when it runs on the clients
        (``activation_federated``) or takes their data under federated calibration (``auto``)."""
        entry = merge_method(self.merge_method)
        uses_clients = entry.needs_clients or (entry.clients_for_data and self.on_clients)
        merged, aligned, self.merge_info = merge_with_info(
            self.merge_method,
            self.template,
            states,
            weights,
            server_data=self.server_data,
            seed=self.seed,
            device=self.device,
            spec=self.spec,
            options=self.method_options,
            clients=clients if uses_clients else None,
        )
        return merged, aligned

    def repair_units(
        self,
        model: nn.Module,
        aligned: Sequence[StateDict],
        weights: Sequence[float],
        clients: ClientRounds | None = None,
    ) -> nn.Module:
        """REPAIR when the merge method asks for it and the model has no BatchNorm (whose
        re-estimation is REPAIR): on the clients' training data under federated calibration
        (:meth:`ClientRounds.repair`), else on the server data's inputs
        (:func:`fedlmc.merging.repair.repair`)."""
        if not merge_method(self.merge_method).repair or has_batchnorm(model) or len(aligned) < 2:
            return model
        endpoints = [load_state(self.template, sd).to(self.device).eval() for sd in aligned]
        if self.on_clients:
            return clients.repair(model, endpoints, weights).eval()
        return repair(model, endpoints, weights, self.server_data[0]).eval()

    # ------------------------------------------------------------------------- calibration

    def reestimate_batchnorm(self, model: nn.Module, clients: ClientRounds | None = None) -> str:
        """Reset BN running statistics in place (unless the merge method opts out); returns where
        they came from."""
        if not has_batchnorm(model) or not merge_method(self.merge_method).reestimate_bn:
            return "none"
        if self.on_clients:
            apply_bn_statistics(model, clients.bn_statistics(model))
            model.eval()
            return "federated"
        if self.server_data is not None:
            reset_bn_stats(model, self.server_data)
            model.eval()
            return "server"
        log(WARNING, "BatchNorm model merged without server data: running statistics kept")
        return "none"

    def calibrate_temperature(
        self, model: nn.Module, arrays: ArrayRecord, clients: ClientRounds | None = None
    ) -> float:
        """:math:`T` by the configured calibration; fills ``calibration_history`` and, when the
        server holds data, ``server_split_temperature`` (the temperature fitted on the server
        split for the same model, a reference for the federated one)."""
        self.calibration_history = []
        self.server_split_temperature = math.nan
        if self.server_data is not None and self.calibration != "none":
            x, y = self.server_data
            logits = predict_logits(model, x, device=self.device)
            self.server_split_temperature = float(fit_temperature(logits, y))
        if self.calibration == "none":
            return 1.0
        if self.calibration == "server":
            return self.server_split_temperature
        temperature, self.calibration_history = clients.fit_temperature(arrays)
        return temperature

    # ------------------------------------------------------------------------- metrics

    def round_metrics(self, report: RoundReport) -> dict[str, float | int]:
        """Weighted client metrics plus the merge's own numbers (see the module docstring)."""
        metrics = self.client_metrics(report, extra_bytes=self.query_bytes)
        metrics.update(
            {
                "temperature": float(self.temperature),
                "log-temperature": float(math.log(self.temperature)),
                "server-split-temperature": float(self.server_split_temperature),
                "bn-reestimated": int(self.bn_source != "none"),
                "query-rounds": int(self.query_rounds),
                "merge-seconds": float(self.merge_seconds),
            }
        )
        return metrics


class PermutationAlignedAverage(OneShotAverage):
    r"""One-shot merge after permutation alignment by a registered merge method.

    ``method`` is any registered merge method but ``average`` (:mod:`fedlmc.merging.methods`;
    built in: ``weight_matching`` and ``activation_matching`` permute every client onto client
    0, the lowest partition id, ``merge_many`` runs MergeMany, ``random_permutation`` is the
    scrambled control, ``activation_federated`` matches activations on the clients), then
    :math:`\sum_i w_i \pi_i(\theta_i)`. Methods that need server inputs (activation matching)
    use ``server_data``'s. ``spec`` overrides the template's permutation spec.
    """

    def __init__(
        self,
        template: nn.Module,
        *,
        method: str = "weight_matching",
        seed: int = 0,
        spec: PermutationSpec | None = None,
        method_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(template, **kwargs)
        entry = merge_method(method)
        if entry.name == "average":
            raise ValueError("method = 'average': use OneShotAverage; allowed: an aligning method")
        on_clients = entry.clients_for_data and self.on_clients
        if entry.needs_server_data and self.server_data is None and not on_clients:
            raise ValueError(f"method = {method!r} needs server_data for its inputs; got None")
        if entry.plain_chain_only:  # refused before any client trains
            norm_free_chain(spec or permutation_spec(template), template.state_dict())
        self.merge_method = entry.name
        self.seed = int(seed)
        self.spec = spec
        self.method_options = dict(method_options or {})


class AutoMerge(PermutationAlignedAverage):
    """The ``auto`` merge (:func:`fedlmc.merging.methods.automatic_choice`): plain averaging when
    its calibrated NLL is within ``tolerance`` nats of the endpoints', else the better of it and
    weight matching; the NLLs are measured on the server data, or, with ``calibration =
    "federated"``, on the clients' held-out data (no server data needed).
    ``strategy.merge_info`` holds ``auto_choice`` and ``auto_nll_gap`` after the round."""

    def __init__(
        self, template: nn.Module, *, tolerance: float = AUTO_TOLERANCE, **kwargs: Any
    ) -> None:
        if not tolerance >= 0:
            raise ValueError(f"tolerance = {tolerance!r}; allowed: a number >= 0 (nats)")
        options = {"auto_tolerance": float(tolerance)}
        super().__init__(template, method="auto", method_options=options, **kwargs)
