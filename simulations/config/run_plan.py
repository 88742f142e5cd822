"""A run resolved once, at the boundary: :func:`plan_run` turns a run config into a frozen
:class:`RunPlan` that the ServerApp's modes read instead of the raw mapping.

The plan holds what every later step would otherwise re-derive from the run config's keys:

- the mode (:class:`~fedlmc.simulations.config.values.Mode`, the ``strategy`` key);
- the merge methods, resolved once (an entry ``package.module:function`` is the method it
  registers): the ``aligned`` mode's method, the ``compare`` mode's rows and the options every
  merge method receives (:class:`fedlmc.merging.merge_job.MergeJob`'s ``options``);
- the strategies' options (:class:`fedlmc.strategies.StrategyOptions`), built once; the FedAvg
  rounds (the baseline and the warm-up before a one-shot round) take a variant of the same
  object (:attr:`RunPlan.fedavg_options`);
- the study's settings of the ``compare`` mode (:class:`StudySettings`);
- the client plan (:class:`ClientPlan`): what the clients must do in this run, from which the
  strategy options' protocol fields (``holdout_share``, ``clients_keep_models``) are set, and
  which the strategies send as the keys of :mod:`fedlmc.strategies.protocol`.

What the plan cannot hold is what only the running server knows (the data splits, the
device, the clients' partition sizes): the ServerApp adds it with ``StrategyOptions.replace``.
This module imports the strategies (Flower): the config package does not re-export it, so that
validating a run config still loads no heavy library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from fedlmc.merging.method_registry import merge_method
from fedlmc.simulations.config.defences import client_check, robust_method_options
from fedlmc.simulations.config.derived import (
    align_method,
    calibration_holdout,
    federated_calibration,
    method_list,
    selected_methods,
    uses_fedavg,
)
from fedlmc.simulations.config.field_keys import field_method_options
from fedlmc.simulations.config.run_config import RunConfig
from fedlmc.simulations.config.validate import validate_run_config
from fedlmc.simulations.config.values import FEDAVG, ONE_SHOT_MODES, Mode
from fedlmc.strategies.options import StrategyOptions
from fedlmc.strategies.robust import RobustScreen

__all__ = ["ClientPlan", "RunPlan", "StudySettings", "plan_run"]


@dataclass(frozen=True)
class ClientPlan:
    """What the clients must do in a run.

    :param holdout_share: The share of its partition each client holds out from training and
        answers the federated temperature query on (``calibration-holdout`` under federated
        calibration, else 0).
    :param keeps_model: The clients keep their trained weights across the query rounds of a
        study's several methods (``keep-model = "several-queries"``; a one-shot strategy's own
        method that queries the clients asks for it itself).
    :param federated_calibration: The clients answer the calibration queries (temperature,
        BatchNorm and REPAIR statistics) on their data.
    :param queried_methods: The merge methods that query the clients about their own trained
        models (``activation_federated``: ``query.align``, ``fisher``: ``query.fisher``,
        ``regmean``: ``query.gram``).
    """

    holdout_share: float = 0.0
    keeps_model: bool = False
    federated_calibration: bool = False
    queried_methods: tuple[str, ...] = ()


@dataclass(frozen=True)
class StudySettings:
    """The ``compare`` mode's study settings (:func:`fedlmc.study.compare_methods`): the
    interpolation grid's ``lambdas`` points, the ``seed`` and whether the ``diagnostics`` run."""

    lambdas: int
    seed: int
    diagnostics: bool


@dataclass(frozen=True)
class RunPlan:
    """A run config resolved once (see the module docstring).

    :param config: The validated run config (read-only; the rows' config columns).
    :param mode: The ``strategy`` key as a :class:`Mode`.
    :param align_method: The merge method of the ``aligned`` mode (``None`` in another mode).
    :param compare_methods: The ``compare`` mode's rows of the study, FedAvg aside (empty in
        another mode).
    :param runs_fedavg: The FedAvg baseline runs (``fedavg``, or ``fedavg`` in ``compare``'s
        ``methods``).
    :param method_options: The options every merge method receives (read-only).
    :param strategy_options: The strategies' options, with the client plan's protocol fields.
    :param study: The ``compare`` mode's study settings.
    :param client: What the clients must do (:class:`ClientPlan`).
    """

    config: RunConfig
    mode: Mode
    align_method: str | None
    compare_methods: tuple[str, ...]
    runs_fedavg: bool
    method_options: Mapping[str, Any]
    strategy_options: StrategyOptions
    study: StudySettings
    client: ClientPlan

    @property
    def merge_method(self) -> str:
        """The merge of a one-shot mode: ``align_method`` under ``aligned``, else ``average``."""
        return self.align_method if self.align_method is not None else "average"

    @property
    def fedavg_options(self) -> StrategyOptions:
        """The options of the FedAvg rounds (the baseline, the warm-up before a one-shot round):
        :attr:`strategy_options` without the one-shot fields (no calibration, no kept states or
        models; the holdout share stays: never trained on, in FedAvg rounds too)."""
        return self.strategy_options.replace(
            calibration="none", keep_client_states=False, clients_keep_models=False
        )


def plan_run(config: Mapping[str, Any]) -> RunPlan:
    """The :class:`RunPlan` of ``config``: a :class:`RunConfig` as it is, any other mapping
    validated first (:func:`validate_run_config`, without the checks about this machine; a bad
    value raises its one-line :class:`~fedlmc.simulations.config.ConfigError`)."""
    config = validate_run_config(config, check_devices=False)
    mode = Mode(config["strategy"])
    client = client_plan(config, mode)
    methods = [m for m in method_list(config) if m != FEDAVG] if mode == Mode.COMPARE else []
    return RunPlan(
        config=config,
        mode=mode,
        align_method=align_method(config) if mode == Mode.ALIGNED else None,
        compare_methods=tuple(methods),
        runs_fedavg=uses_fedavg(config),
        method_options=MappingProxyType(merge_options(config)),
        strategy_options=strategy_options(config, mode, client),
        study=StudySettings(config["lambdas"], config["seed"], config["diagnostics"]),
        client=client,
    )


def client_plan(config: Mapping[str, Any], mode: Mode) -> ClientPlan:
    """What the clients of ``config`` must do (:class:`ClientPlan`)."""
    queried = [m for m in selected_methods(config) if merge_method(m).needs.clients]
    return ClientPlan(
        holdout_share=calibration_holdout(config),
        keeps_model=mode == Mode.COMPARE and bool(queried),
        federated_calibration=federated_calibration(config),
        queried_methods=tuple(queried),
    )


def merge_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The run-config keys that reach the merge methods: ``auto-tolerance``, ``cca-ridge``, the
    robust rules' (:func:`fedlmc.simulations.config.defences.robust_method_options`) and the
    field methods' (:func:`fedlmc.simulations.config.field_keys.field_method_options`)."""
    return {
        "auto_tolerance": config["auto-tolerance"],
        "cca_ridge": config["cca-ridge"],
        **robust_method_options(config),
        **field_method_options(config),
    }


def strategy_options(config: Mapping[str, Any], mode: Mode, client: ClientPlan) -> StrategyOptions:
    """The strategies' options of ``config`` (one-shot fields as the mode runs them: its
    ``calibration`` in a one-shot mode, none in ``compare``, whose study calibrates on the server
    split afterwards), the protocol fields from the ``client`` plan."""
    return StrategyOptions(
        num_clients=config["num-clients"],
        min_clients=config["min-clients"],
        robust=RobustScreen(config["outlier-factor"]),
        client_check=client_check(config),
        wait_timeout=config["timeout"],
        query_timeout=config["timeout"],
        calibration=config["calibration"] if mode in ONE_SHOT_MODES else "none",
        keep_client_states=mode in (Mode.COMPARE, *ONE_SHOT_MODES),
        holdout_share=client.holdout_share,
        clients_keep_models=client.keeps_model,
    )
