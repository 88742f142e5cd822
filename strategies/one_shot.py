r"""One-shot merging strategies for Flower's Message API (``flwr.serverapp.strategy``).

One round: every connected client trains (independently initialised in the paper's setting) and
sends its weights; the server merges the survivors in one shot,

.. math:: \bar\theta = \sum_i w_i\, \pi_i(\theta_i), \qquad w_i = n_i / \textstyle\sum_j n_j,

with :math:`n_i` the client's ``num-examples`` and :math:`\pi_i` the identity
(:class:`OneShotAverage`) or the permutations of a registered merge method
(:class:`PermutationAlignedAverage`, :mod:`fedlmc.merging.method_registry`: weight or activation
matching, MergeMany, the random-permutation control, ...).
Then the post-merge pipeline (:mod:`fedlmc.merging.post_merge`, the same the study runs): for
BatchNorm models the merged model's running statistics are re-estimated, REPAIR methods renormalise
the hidden units of models without BatchNorm, and one softmax temperature :math:`T` is fitted
(``calibration``, one of :data:`fedlmc.merging.post_merge.CALIBRATIONS`):

- ``"server"``: on the server's own held-out data (``server_data``); BatchNorm and REPAIR
  statistics come from it too;
- ``"federated"``: on the clients' held-out data without moving it (each client holds out a
  share of its partition from training: ``holdout_share``, sent as ``holdout-share``,
  :mod:`fedlmc.strategies.protocol`). Every data-dependent step after the merge runs on the
  clients through query rounds (:class:`fedlmc.strategies.queries.ClientRounds`): BatchNorm
  statistics (``query.bn_stats``), REPAIR's per-unit statistics (``query.unit_stats``),
  ``auto``'s calibrated NLLs, and the temperature: a grid of ``temperature_grid_points`` values
  of :math:`u = \log T` in one round, then Newton rounds of one value each (usually one). Sums
  are exact, so the result equals a centralised fit on the survivors' calibration data. Every
  message round costs a ClientApp start in a deployment (a process per message), hence the grid;
- ``"lewc"``: no data and no query: :math:`T = \sum_i w_i^{\,L}` predicted from the chain's
  depth :math:`L` and the merge weights (:mod:`fedlmc.merging.lewc_temperature`; :math:`T = 1`
  when the round config says ``init = "shared"``); the plain average of norm-free chains only,
  refused at construction for any other merge or model;
- ``"none"``: :math:`T = 1` (BN statistics, if any, still re-estimated on ``server_data``).

A fitted :math:`T` at an end of the fit's range is one ``fedlmc warning:`` line in the log
(:func:`fedlmc.strategies.strategy_utils.log_temperature_bound`).

The ``activation_federated`` method aligns on the clients whatever the calibration: one
``query.align`` round in which every client but the first matches its own model to client 0's
on its own data and returns only permutation indices.

Where the results travel. ``strategy.start(...)`` returns a :class:`OneShotResult`, a frozen
record of the round that holds what Flower's ``Result`` holds (``arrays``: the merged, finished
weights; ``train_metrics_clientapp``, ``evaluate_metrics_clientapp``,
``evaluate_metrics_serverapp``) and the round's details: ``merged_state``, ``weights``,
``report`` (survivors sorted by partition id, failures with reasons), ``temperature``,
``server_split_temperature``, ``calibration_history``, ``bn_source``, ``repaired``,
``query_rounds``, ``query_bytes``, ``merge_seconds`` and ``merge_info`` (see
:class:`OneShotRound`). ``result.train_metrics_clientapp[1]`` is the round's MetricRecord with
``temperature``, ``log-temperature``, ``server-split-temperature`` (the temperature fitted on
the server split for the same merged model when the server holds data, a reference for the
federated one; NaN otherwise), ``clients-survived``, ``clients-failed``, ``bytes-received``
(tensor bytes of the trained weights plus the payload of every query reply,
:func:`fedlmc.strategies.protocol.payload_bytes`), ``query-rounds`` (message rounds after training),
``merge-seconds`` (alignment with its query rounds, averaging, BN re-estimation and REPAIR),
``bn-reestimated`` (0/1) and the num-examples-weighted means of the clients' training metrics.
:meth:`OneShotAverage.merge_round` computes one round's :class:`OneShotRound` from the replies
(what Flower's ``aggregate_train`` hook returns the arrays and metrics of).
Shared with the FedAvg baseline (:class:`fedlmc.strategies.base.ScreenedFedAvg`): waiting for every
node, screening the replies, the client counts.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields, replace
from logging import INFO, WARNING
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.supercore import log
from torch import Tensor, nn

from fedlmc.averaging import load_state
from fedlmc.evaluation import predict_logits, resolve_device
from fedlmc.merging.builtin_methods import AUTO_TOLERANCE
from fedlmc.merging.lewc_temperature import ONE_BASIN_NOTE, LewcPrediction, lewc_refusal
from fedlmc.merging.merge_result import calibrated, finish_merge
from fedlmc.merging.method_registry import (
    MergeRequest,
    check_method,
    check_template_merge,
    merge_method,
    refuse_calibrated_row,
    template_merge_names,
)
from fedlmc.merging.methods import merge_states
from fedlmc.merging.post_merge import Calibration, ServerData, StatisticsSource, calibrate
from fedlmc.merging.request_facts import model_facts
from fedlmc.permutation.model_spec import permutation_spec
from fedlmc.permutation.spec import PermutationSpec, check_spec
from fedlmc.strategies.base import ScreenedFedAvg
from fedlmc.strategies.one_shot_result import OneShotResult, OneShotRound
from fedlmc.strategies.options import StrategyOptions
from fedlmc.strategies.protocol import (
    KEEP_ONE_QUERY,
    metric_record,
    record_to_state,
    state_to_record,
)
from fedlmc.strategies.queries import MERGE_QUERIES, ClientRounds
from fedlmc.strategies.robust import accuracy_outliers, chance_floor, num_classes_of
from fedlmc.strategies.strategy_utils import (
    ClientUpdate,
    RoundReport,
    StateDict,
    flower_records,
    log_temperature_bound,
    require_survivors,
)

Data = tuple[Tensor, Tensor]
NO_SERVER_DATA_WARNING = (
    "a deployment without server data: a poisoned client's model cannot be checked on data "
    "(no accuracy check; the payload screen, the norm rule and the copy check still run, and a "
    "label flipper within them is merged at its share, up to max-client-share); pass "
    "server_data=(x, y) to check each client's accuracy on it"
)
"""The warning line of a one-shot round in a deployment without ``server_data``."""


class OneShotAverage(ScreenedFedAvg):
    """Flower ``FedAvg`` turned into a robust one-shot merge with temperature calibration.

    Its messages carry the caller's train config plus only the protocol keys
    (:mod:`fedlmc.strategies.protocol`: ``server-round``, ``holdout-share``, ``keep-model``);
    the queries carry the same config. ``start`` returns a :class:`OneShotResult`.

    :param template: A model of the clients' architecture (its weights are not used): needed to load
        the merged weights for BN re-estimation and temperature fitting. With ``client_references``
        (clients of different widths) it is the merged model's (server) width and the merge method
        must be a mixed-width one (``mixed_widths`` in :mod:`fedlmc.merging.method_registry`).
    :param options: Every other setting (:class:`fedlmc.strategies.options.StrategyOptions`:
        ``num_clients``, ``min_clients``, ``calibration``, ``server_data``, ``keep_client_states``,
        the screens, ...), read as ``self.options``. ``calibration="server"`` needs
        ``server_data``.
    """

    merge_method = "average"
    """The registered merge method (:mod:`fedlmc.merging.method_registry`) this strategy applies."""

    def __init__(self, template: nn.Module, options: StrategyOptions) -> None:
        super().__init__(options)
        self.template = copy.deepcopy(template).cpu().eval()
        if options.calibration == "server" and options.server_data is None:
            raise ValueError("calibration = 'server' needs server_data (x, y); got None")
        if options.calibration == "lewc" and (
            why := lewc_refusal(self.template, self.merge_method)
        ):
            raise ValueError(f"{type(self).__name__}: {why}")
        self.device = resolve_device(options.device)
        self.seed = 0
        self.spec: PermutationSpec | None = None
        self.method_options: dict[str, Any] = {}
        self.summary_note = ""
        """Said after the settings in :meth:`summary` (e.g. what a collecting round is for)."""
        self._last_round: OneShotRound | None = None
        self._sent_arrays: ArrayRecord | None = None

    @property
    def server_data(self) -> Data | None:
        """``options.server_data``: the server's held-out data (``None`` without)."""
        return self.options.server_data

    # ------------------------------------------------------------------------- Flower hooks

    def summary(self) -> None:
        """Log the strategy's settings."""
        log(
            INFO,
            "\t├──> %s (%s): %d clients (min %d survivors), calibration %s%s",
            type(self).__name__,
            self.merge_method,
            self.num_clients,
            self.min_clients,
            self.options.calibration,
            f" ({self.summary_note})" if self.summary_note else "",
        )
        log(INFO, "\t└──> Weighted by: '%s'", self.weighted_by_key)

    def kept_models(self) -> str | None:
        """``several-queries`` with ``options.clients_keep_models`` (a study queries the
        collected clients), else ``one-query`` when the merge method queries the clients about
        their own models (``activation_federated``, ``fisher``, ``regmean``), else ``None``."""
        if (kept := super().kept_models()) is not None:
            return kept
        return KEEP_ONE_QUERY if merge_method(self.merge_method).needs.clients else None

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's hook (:class:`~fedlmc.strategies.base.ScreenedFedAvg`'s), keeping the
        arrays sent: the clients' common starting model under ``init = "shared"``
        (:meth:`shared_base`). In a deployment (no partitions assigned) without
        ``server_data``, one warning line: ``NO_SERVER_DATA_WARNING``."""
        self._sent_arrays = arrays
        messages = super().configure_train(server_round, arrays, config, grid)
        if self._assigned is None and self.server_data is None:  # a deployment without data
            log(WARNING, "fedlmc warning: %s", NO_SERVER_DATA_WARNING)
        return messages

    def shared_base(self) -> StateDict | None:
        """The weights this round sent when its config says the clients start from them
        (``init = "shared"``): the base of the task-vector methods; else ``None``."""
        if self._sent_arrays is None or self._round_config.get("init") != "shared":
            return None
        return record_to_state(self._sent_arrays)

    def start(
        self, grid: Grid, initial_arrays: ArrayRecord, *args: Any, **kwargs: Any
    ) -> OneShotResult:
        """Flower's ``Strategy.start`` (same arguments), returning a :class:`OneShotResult`
        of the last round."""
        self._last_round = None
        flower = super().start(grid, initial_arrays, *args, **kwargs)
        if self._last_round is None:
            raise RuntimeError("start ran no training round (num_rounds = 0); allowed: 1")
        last = {f.name: getattr(self._last_round, f.name) for f in fields(OneShotRound)}
        return OneShotResult(**{**last, **flower_records(flower)})

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's hook: :meth:`merge_round`'s arrays and metrics (the round is kept for the
        result of :meth:`start`)."""
        self._last_round = self.merge_round(server_round, replies)
        return self._last_round.arrays, self._last_round.metrics

    # ------------------------------------------------------------------------- the round

    def merge_round(self, server_round: int, replies: Iterable[Message]) -> OneShotRound:
        """Screen the replies, merge the survivors, then the post-merge pipeline and the
        temperature (:mod:`fedlmc.merging.merge_result`: BN re-estimation, REPAIR, :math:`T`)."""
        report = self.screen(server_round, replies)
        clients = self.client_rounds(report.survivors)
        states = [u.state for u in report.survivors]
        weights = self.merge_weights(report)
        start = time.perf_counter()
        merged, aligned, info = self.merge(states, weights, clients)
        if len(aligned) < len(states):  # clients dropped by the alignment query: not merged
            self.drop_unaligned(report, clients)
            weights = self.merge_weights(report)
        result = finish_merge(
            self.merge_method,
            self.template,
            merged,
            aligned,
            weights,
            self.statistics_source(clients),
            device=self.device,
            info=info,
            started=start,
        )
        fitted, server_split = self.calibrate_temperature(result.model, clients, weights)
        result = calibrated(result, fitted)
        report.query_failures = [f for f in clients.dropped if f.stage not in MERGE_QUERIES]
        if not self.options.keep_client_states:
            result = replace(result, aligned=[])
            for update in report.survivors:
                update.state = {}
        log(
            INFO,
            "aggregate_train: merged %d clients %s (%s), temperature %.4f, %d query rounds",
            len(report.survivors),
            report.survivor_ids,
            self.merge_method,
            result.temperature,
            clients.rounds,
        )
        log_temperature_bound(self.merge_method, result.temperature)
        metrics = self.client_metrics(report, extra_bytes=clients.bytes_received)
        metrics.update(
            {
                "temperature": result.temperature,
                "log-temperature": math.log(result.temperature),
                "server-split-temperature": server_split,
                "bn-reestimated": int(result.bn_reset),
                "query-rounds": int(clients.rounds),
                "merge-seconds": float(result.seconds),
            }
        )
        return OneShotRound(
            **{f.name: getattr(result, f.name) for f in fields(result)},
            arrays=state_to_record(result.state),
            metrics=metric_record(metrics),
            report=report,
            server_split_temperature=server_split,
            query_rounds=int(clients.rounds),
            query_bytes=int(clients.bytes_received),
        )

    def drop_unaligned(self, report: RoundReport, clients: ClientRounds) -> None:
        """Move the clients whose answer to the merge's query (alignment, Fisher, Gram matrices:
        :data:`~fedlmc.strategies.queries.MERGE_QUERIES`) was dropped out of the survivors; raises
        :class:`~fedlmc.strategies.strategy_utils.NotEnoughClientsError` when fewer than
        ``min_clients`` remain."""
        for failure in clients.dropped:
            if failure.stage in MERGE_QUERIES:
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
            timeout=self.options.query_timeout,
            min_clients=self.min_clients,
            grid_points=int(self.options.temperature_grid_points),
            newton_steps=int(self.options.temperature_steps),
            weight_bound=self.weight_bound,
            spec=self.spec,
            robust=self.robust,
        )

    @property
    def on_clients(self) -> bool:
        """Whether the data-dependent steps after the merge use the clients' data."""
        return self.options.calibration == "federated"

    def check_clients(self, report: RoundReport) -> None:
        """The base check (copies), then, with ``client_check = "server-split"``, server data
        and clients of the template's width, each survivor's accuracy on the server split
        against chance and the others' (:func:`fedlmc.strategies.robust.accuracy_outliers`,
        the floor of :func:`fedlmc.strategies.robust.chance_floor` for the template's classes
        and the split's size)."""
        super().check_clients(report)
        check = self.options.client_check == "server-split" and self.server_data is not None
        if not check or self.options.client_references is not None:
            return
        labels = self.server_data[1]
        if not labels.numel():
            return
        classes = num_classes_of(self.template) or int(labels.max()) + 1
        floor = chance_floor(max(classes, 2), int(labels.numel()))
        self._drop(report, accuracy_outliers(self.server_split_accuracies(report.survivors), floor))

    def server_split_accuracies(self, survivors: Sequence[ClientUpdate]) -> list[float]:
        """Each survivor's own accuracy on the server data (its model as it sent it)."""
        x, y = self.server_data
        accuracies = []
        for update in survivors:
            model = load_state(self.template, update.state).to(self.device).eval()
            logits = predict_logits(model, x, device=self.device)
            accuracies.append(float((logits.argmax(dim=1).cpu() == y.cpu()).double().mean()))
        return accuracies

    # ------------------------------------------------------------------------- merge

    def merge(
        self,
        states: Sequence[StateDict],
        weights: Sequence[float],
        clients: ClientRounds | None = None,
    ) -> tuple[StateDict, list[StateDict], dict[str, Any]]:
        r""":func:`fedlmc.merging.methods.merge_states` (``with_info=True``) with this strategy's
        ``merge_method``:
        :math:`\sum_i w_i \pi_i(\theta_i)` (plain average: :math:`\pi_i = \mathrm{id}`), the
        clients in the merged basis and the method's info. ``clients`` reach the method when it
        runs on the clients (``activation_federated``) or takes their data under federated
        calibration (``auto``)."""
        entry = merge_method(self.merge_method)
        uses_clients = entry.needs.clients or (entry.needs.clients_for_data and self.on_clients)
        return merge_states(
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
            base=self.shared_base() if entry.needs.base else None,
            with_info=True,
        )

    # ------------------------------------------------------------------------- post-merge

    def statistics_source(self, clients: ClientRounds) -> StatisticsSource | None:
        """Where BN re-estimation and REPAIR take their statistics: the clients' query rounds
        under federated calibration, else the server data (``None`` without any)."""
        return clients if self.on_clients else self.server_source()

    def server_source(self) -> ServerData | None:
        """The server data as a statistics source (``None`` without server data)."""
        return None if self.server_data is None else ServerData(*self.server_data)

    def calibrate_temperature(
        self, model: nn.Module, clients: ClientRounds, weights: Sequence[float] = ()
    ) -> tuple[Calibration, float]:
        """:math:`T` by the configured calibration (:func:`fedlmc.merging.post_merge.calibrate`;
        ``lewc``: predicted from the merge ``weights``, :meth:`lewc_prediction`) and, when the
        server holds data and calibration is not ``none``, the temperature fitted on the server
        data (a reference; NaN else). A :math:`T` at a bound is said by the round's log."""
        server = self.server_source()
        if self.options.calibration == "none":
            return calibrate(model, None), math.nan
        reference = math.nan if server is None else calibrate(model, server, warn=False).temperature
        if self.options.calibration == "lewc":
            return calibrate(model, self.lewc_prediction(weights), warn=False), reference
        if self.options.calibration == "server":
            return Calibration(reference), reference
        return calibrate(model, clients, warn=False), reference

    def lewc_prediction(self, weights: Sequence[float]) -> LewcPrediction:
        """LEWC's temperature for this template and the merge ``weights``
        (:mod:`fedlmc.merging.lewc_temperature`); :math:`T = 1`, said in a warning, when the round
        config says the clients share their start (``init = "shared"``: one basin)."""
        shared = self._round_config.get("init") == "shared"
        if shared:
            log(WARNING, "fedlmc warning: %s", ONE_BASIN_NOTE)
        return LewcPrediction.of(self.template, weights, spec=self.spec, shared_start=shared)


class PermutationAlignedAverage(OneShotAverage):
    r"""One-shot merge after permutation alignment by a registered merge method.

    ``method`` is any registered merge method but ``average``
    (:mod:`fedlmc.merging.method_registry`;
    built in: ``weight_matching`` and ``activation_matching`` permute every client onto client
    0, the lowest partition id, ``merge_many`` runs MergeMany, ``random_permutation`` is the
    scrambled control, ``activation_federated`` matches activations on the clients), then
    :math:`\sum_i w_i \pi_i(\theta_i)`. Methods that need server inputs (activation matching)
    use ``server_data``'s.

    The permutation spec is settled when the strategy is built, before any client trains
    (:meth:`construction_spec`): ``spec`` if given, else the template's own
    ``permutation_spec()``, else one derived from the template's graph on ``example_input``
    (a batch of 2 or more inputs), on the first 2 inputs of ``server_data`` or on
    ``model.config["in_shape"]``; a model it cannot be derived for is refused here, naming what
    to pass. A given ``spec`` is checked on the example input when there is one.

    The method's one refusal (:func:`~fedlmc.merging.method_registry.check_method`) is asked
    here too, with ``options.min_clients`` as the fewest clients a round may merge and
    ``method_options``: ``krum`` below its :math:`2f + 3` clients is refused at construction.
    A ``_t`` row's name (``weight_matching_t``) is refused too: the strategy's temperature is
    ``options.calibration``'s (:func:`~fedlmc.merging.method_registry.refuse_calibrated_row`).
    """

    def __init__(
        self,
        template: nn.Module,
        options: StrategyOptions,
        *,
        method: str = "weight_matching",
        seed: int = 0,
        spec: PermutationSpec | None = None,
        example_input: Tensor | tuple[Tensor, ...] | None = None,
        method_options: Mapping[str, Any] | None = None,
    ) -> None:
        aligning = [m for m in template_merge_names() if m != "average"]
        where = f"{type(self).__name__}(method={method!r})"
        entry = check_template_merge(method, where, aligning)
        refuse_calibrated_row(method, where, "StrategyOptions(calibration='server' or 'federated')")
        self.merge_method = entry.name  # before the base's checks (calibration = "lewc")
        super().__init__(template, options)
        if entry.name == "average":
            raise ValueError("method = 'average': use OneShotAverage; allowed: an aligning method")
        self.spec = self.construction_spec(spec, example_input, method)
        self.method_options = dict(method_options or {})
        request = MergeRequest(  # the method's one refusal, before any client trains
            num_clients=self.num_clients,
            fewest_clients=self.min_clients,  # Krum's 2f + 3 at these options
            server_data=self.server_data is not None,
            federated_data=self.on_clients,
            clients=True,
            options=self.method_options,
            **model_facts(template, self.spec, [entry.name]),
        )
        check_method(method, request)
        self.merge_method = entry.name
        self.seed = int(seed)

    def construction_spec(
        self,
        spec: PermutationSpec | None,
        example_input: Tensor | tuple[Tensor, ...] | None,
        method: str,
    ) -> PermutationSpec:
        """The permutation spec the merge will use, settled now (class docstring): derived
        (:func:`fedlmc.permutation.model_spec.permutation_spec`, which checks a derived spec on
        its example) or, when given, checked on the example input
        (:func:`fedlmc.permutation.spec.check_spec`); a ``ValueError`` names the strategy."""
        if example_input is None and self.server_data is not None:
            example_input = self.server_data[0][:2]
        if isinstance(example_input, tuple):  # the template is on the CPU
            example_input = tuple(t.cpu() for t in example_input)
        elif isinstance(example_input, Tensor):
            example_input = example_input.cpu()
        try:
            if spec is None:
                return permutation_spec(self.template, example_input)
            if example_input is not None:
                check_spec(self.template, spec, example_input)
            return spec
        except (ValueError, RuntimeError, TypeError) as err:  # torch.fx and shape errors too
            raise ValueError(
                f"{type(self).__name__}(method={method!r}): {first_line(err)}; pass "
                "example_input= (a batch "
                "of 2 or more of the model's inputs), server_data= or spec="
            ) from None


class AutoMerge(PermutationAlignedAverage):
    """The ``auto`` merge (:func:`fedlmc.merging.builtin_methods.automatic_choice`): plain averaging
    when its calibrated NLL is within ``tolerance`` nats of the endpoints', else the better of it
    and weight matching; the NLLs are measured on the server data, or, with ``calibration =
    "federated"``, on the clients' held-out data (no server data needed).
    The result's ``merge_info`` holds ``auto_choice`` and ``auto_nll_gap``."""

    def __init__(
        self,
        template: nn.Module,
        options: StrategyOptions,
        *,
        tolerance: float = AUTO_TOLERANCE,
        seed: int = 0,
        spec: PermutationSpec | None = None,
        example_input: Tensor | tuple[Tensor, ...] | None = None,
    ) -> None:
        if not tolerance >= 0:
            raise ValueError(f"tolerance = {tolerance!r}; allowed: a number >= 0 (nats)")
        super().__init__(
            template,
            options,
            method="auto",
            seed=seed,
            spec=spec,
            example_input=example_input,
            method_options={"auto_tolerance": float(tolerance)},
        )


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message (torch.fx appends the graph and a traceback)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
