"""What one run of the ServerApp produces (:class:`ServerOutcome`: its rows, merged weights,
reports and timings), what a mode of it works on (:class:`ServerRun`) and the columns of a
strategy's round (:func:`round_columns`, :func:`width_columns`); a merged model's own columns
are the study's (:func:`fedlmc.study.model_rows.merge_rows`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from flwr.app import ConfigRecord
from flwr.serverapp import Grid
from torch import nn

from fedlmc.data.loading import DataSplits
from fedlmc.simulations.config import (
    client_widths,
    server_width,
    widths_text,
)
from fedlmc.simulations.config.run_plan import RunPlan
from fedlmc.simulations.records.progress import RunProgress
from fedlmc.strategies import (
    FedAvgResult,
    OneShotResult,
)
from fedlmc.strategies.screening import WeightBound
from fedlmc.strategies.strategy_utils import Failure, RoundReport, StateDict
from fedlmc.study.rows import ROUND_COLUMNS


@dataclass
class ServerOutcome:
    """What one run of the ServerApp produced (``run_federation`` reads it in-process)."""

    config: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    merged: dict[str, StateDict] = field(default_factory=dict)
    results: dict[str, OneShotResult | FedAvgResult] = field(default_factory=dict)
    reports: dict[str, RoundReport] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    weight_bound: WeightBound | None = None
    client_templates: dict[int, nn.Module] | None = None
    """Clients of different widths: per partition id a model at that client's width (``None``:
    every client at the server's width, :func:`fedlmc.simulations.config.mixed_widths`)."""
    secure: dict[str, Any] = field(default_factory=dict)
    """Per method, the secure round behind it (``secure-aggregation = "secagg+"``)."""
    progress: RunProgress = field(default_factory=lambda: RunProgress(None))
    """Where the stages are told (:mod:`fedlmc.simulations.records.progress`; silent by default)."""

    def templates_of(self, report: RoundReport, template: nn.Module) -> list[nn.Module]:
        """The architecture each survivor's weights load into: its own width's, or
        ``template`` when every client has the server's width."""
        if self.client_templates is None:
            return [template] * len(report.survivors)
        return [self.client_templates[u.partition_id] for u in report.survivors]

    def table(self, with_config: bool = False) -> pd.DataFrame:
        """The rows as a DataFrame (one per method); ``with_config`` appends the run-config
        columns (hyphenated keys)."""
        rows = [{**row, **self.config} for row in self.rows] if with_config else self.rows
        return pd.DataFrame(rows)


@dataclass(frozen=True)
class ServerRun:
    """What a mode of the ServerApp works on: the run's ``grid``, its ``plan``
    (:class:`~fedlmc.simulations.config.run_plan.RunPlan`), the data ``splits``, the server's
    model ``template``, the ``device`` it evaluates on, and the ``outcome`` it fills (its rows,
    merged weights, reports)."""

    grid: Grid
    plan: RunPlan
    splits: DataSplits
    template: nn.Module
    device: torch.device
    outcome: ServerOutcome

    @property
    def config(self) -> Mapping[str, Any]:
        """The plan's validated run config (the plain values of the rows' config columns)."""
        return self.plan.config


MIXED_COLLECT = "embed_average"
"""The merge of the ``compare`` strategy's collecting round when the clients' widths differ (the
study's rows are computed afterwards from the collected models; this merge is not a row)."""

# ----------------------------------------------------------------------------- helpers


def train_config_record(config: Mapping[str, Any]) -> ConfigRecord:
    """The run config as the ConfigRecord sent with every train message."""
    return ConfigRecord({k: v for k, v in config.items()})


def failures_text(failures: Sequence[Failure]) -> str:
    """``"node N (partition 1): client error: ...; ..."`` on one line (empty when none)."""
    return "; ".join(f.describe() for f in failures)  # plain text: Failure sanitises reasons


def width_columns(config: Mapping[str, Any]) -> dict[str, Any]:
    """``client_widths`` (every client's width, in partition order) and ``server_width`` (the
    merged model's), resolved from the run config."""
    return {
        "client_widths": widths_text(client_widths(config)),
        "server_width": server_width(config),
    }


def _train_seconds(update: Any) -> float:
    """A survivor's ``train-seconds`` (0 when it reports none; NaN when the screen removed the
    value it sent: the column is then undefined, and the log names the client)."""
    if "train-seconds" in update.dropped_metrics:
        return math.nan
    return float(update.metrics.get("train-seconds", 0.0))


def round_columns(
    report: RoundReport,
    bytes_sent: int,
    seconds: float,
    rounds: int,
    config: Mapping[str, Any],
) -> dict[str, Any]:
    """Columns describing the rounds behind a row (:data:`fedlmc.study.rows.ROUND_COLUMNS`),
    the width columns (:func:`width_columns`) included."""
    train_seconds = [_train_seconds(u) for u in report.survivors]
    columns = {
        "clients_survived": len(report.survivors),
        "clients_failed": failures_text(report.failures),
        "clients_dropped": len(report.dropped_nodes),
        "clients_dropped_reasons": failures_text(report.dropped),
        "bytes_sent_by_clients": int(bytes_sent),
        "rounds": int(rounds),
        "train_seconds": float(sum(train_seconds)),
        "round_seconds": float(seconds),
        **width_columns(config),
    }
    assert tuple(columns) == ROUND_COLUMNS
    return columns
