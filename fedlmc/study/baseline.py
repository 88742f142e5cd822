r"""What every row of a study compares with, computed once from the clients' predictions.

:func:`client_baseline` predicts each client once on the test and server splits and gives a
:class:`ClientBaseline`: the endpoints' metrics, the four ensembles every merge is compared
with (``ensemble``, :math:`\sum_i w_i\,\mathrm{softmax}(z_i)`; ``ensemble_equal``,
:math:`\frac1N \sum_i \mathrm{softmax}(z_i)`; ``ensemble_calibrated``,
:math:`\sum_i w_i\,\mathrm{softmax}(z_i / T_i)` with each client's own server-fitted
:math:`T_i`; and ``logit_ensemble``, :math:`\mathrm{softmax}(\sum_i w_i z_i / T)`) with their
top-1 labels, and the columns every row shares. :func:`reference_row` is an ensemble's row;
:func:`agreement_columns` and :func:`temperature_columns` compare a merge with them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from fedlmc.averaging import load_state
from fedlmc.evaluation import ensemble_probs, metrics_from_probs
from fedlmc.merging.calibrate import fit_temperature
from fedlmc.study.context import Predictions, StudyContext, templates_of_clients
from fedlmc.study.diagnostic_columns import stable_rank_columns
from fedlmc.study.rows import empty_row, endpoint_columns, finite_mean, json_list, metric_columns

if TYPE_CHECKING:
    from fedlmc.data.loading import DataSplits

__all__ = [
    "AGREEMENT_COLUMNS",
    "ClientBaseline",
    "agreement_columns",
    "client_baseline",
    "reference_row",
    "temperature_columns",
]


@dataclass(frozen=True)
class ClientBaseline:
    """What every row of a study compares with, computed once from the clients' predictions:
    the endpoints' metrics, the ensembles' rows and top-1 labels, and the columns every
    row shares (``common``: endpoint means, ensemble accuracies, temperatures, stable ranks)."""

    endpoints: tuple[dict[str, float], ...]
    references: dict[str, dict[str, Any]]
    top1: dict[str, Tensor]
    common: dict[str, Any]


def _weighted_logits(logits: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    return sum(w * z for w, z in zip(weights, logits, strict=True))


def _probability_row(probs: Tensor, labels: Tensor, raw: Tensor | None = None) -> dict[str, Any]:
    """The metric columns of a probability ensemble ``probs``: raw (``temperature`` 1) when
    ``raw`` is ``None``; else ``probs`` is the members at their own temperatures (no single
    :math:`T`: ``temperature`` NaN), its metrics the calibrated ones, ``raw`` the same members
    at :math:`T = 1`."""
    found = metrics_from_probs(probs, labels)
    if raw is None:
        return {
            "accuracy": found["accuracy"],
            "nll": found["nll"],
            "ece": found["ece"],
            "temperature": 1.0,
            "nll_raw": found["nll"],
            "ece_raw": found["ece"],
        }
    at_one = metrics_from_probs(raw, labels)
    return {
        "accuracy": found["accuracy"],
        "nll": found["nll"],
        "ece": found["ece"],
        "temperature": math.nan,
        "nll_raw": at_one["nll"],
        "ece_raw": at_one["ece"],
        "nll_calibrated": found["nll"],
        "ece_calibrated": found["ece"],
    }


def _probability_ensembles(
    predictions: Sequence[Predictions], weights: Sequence[float]
) -> dict[str, Tensor]:
    r"""The test-split probabilities of the three probability ensembles:
    ``ensemble`` :math:`\sum_i w_i\,\mathrm{softmax}(z_i)`, ``ensemble_equal``
    :math:`\frac1N \sum_i \mathrm{softmax}(z_i)` and ``ensemble_calibrated``
    :math:`\sum_i w_i\,\mathrm{softmax}(z_i / T_i)`, :math:`T_i` client :math:`i`'s own
    temperature fitted on the server split
    (:attr:`~fedlmc.study.context.Predictions.temperature`)."""
    logits = [p.test for p in predictions]
    return {
        "ensemble": ensemble_probs(logits, list(weights)),
        "ensemble_equal": ensemble_probs(logits),
        "ensemble_calibrated": ensemble_probs(
            logits, list(weights), [p.temperature for p in predictions]
        ),
    }


def _reference_rows(
    predictions: Sequence[Predictions], weights: Sequence[float], splits: DataSplits
) -> tuple[dict[str, dict[str, Any]], dict[str, Tensor]]:
    r"""The ensembles every merge is compared with, as row columns, and their top-1 labels: the
    three probability ensembles (``_probability_ensembles``; ``ensemble_calibrated`` with
    its members' temperatures in the calibrated columns and at :math:`T = 1` in the raw ones)
    and ``logit_ensemble`` :math:`\mathrm{softmax}(\sum_i w_i z_i / T)` (the scaled logit
    ensemble LEWC likens the merge to; raw, with its server-fitted :math:`T` in the calibrated
    columns)."""
    labels = splits.test[1]
    probs = _probability_ensembles(predictions, weights)
    logit = Predictions(
        _weighted_logits([p.test for p in predictions], weights),
        _weighted_logits([p.server for p in predictions], weights),
        1.0,
    )
    logit.temperature = fit_temperature(logit.server, splits.server[1])
    top1 = {name: p.argmax(dim=1) for name, p in probs.items()}
    top1["logit_ensemble"] = logit.test.argmax(dim=1)
    rows = {
        "ensemble": _probability_row(probs["ensemble"], labels),
        "ensemble_equal": _probability_row(probs["ensemble_equal"], labels),
        "ensemble_calibrated": _probability_row(
            probs["ensemble_calibrated"], labels, raw=probs["ensemble"]
        ),
        "logit_ensemble": {
            **metric_columns(logit.metrics(labels), False, logit.temperature),
            "logit_ensemble_temperature": logit.temperature,
        },
    }
    return rows, top1


def client_baseline(
    context: StudyContext, templates: Sequence[nn.Module] | None = None
) -> ClientBaseline:
    """Each client's predictions (its weights loaded into its own template, default the
    context's), once, and everything the rows compare with (:class:`ClientBaseline`)."""
    labels = context.splits.test[1]
    own = templates_of_clients(context.template, templates, context.num_clients)
    predictions = []
    for i, sd in enumerate(context.states):
        context.say(f"predicting client {i + 1}/{context.num_clients}")
        model = load_state(own[i], sd).to(context.device).eval()
        predictions.append(context.predict(model))
    endpoints = [p.metrics(labels) for p in predictions]
    references, top1 = _reference_rows(predictions, context.weights, context.splits)
    temperatures = [p.temperature for p in predictions]
    common = {
        **endpoint_columns(endpoints),
        "endpoint_acc_clients": json_list([e["accuracy"] for e in endpoints]),
        "ensemble_acc": references["ensemble"]["accuracy"],
        "ensemble_nll": references["ensemble"]["nll"],
        "ensemble_equal_acc": references["ensemble_equal"]["accuracy"],
        "ensemble_calibrated_acc": references["ensemble_calibrated"]["accuracy"],
        "logit_ensemble_acc": references["logit_ensemble"]["accuracy"],
        "endpoint_temperature_mean": sum(temperatures) / len(temperatures),
        "logit_ensemble_temperature": references["logit_ensemble"]["logit_ensemble_temperature"],
    }
    if context.diagnostics:
        common.update(stable_rank_columns(context.states, head=context.layer_names[-1]))
    return ClientBaseline(tuple(endpoints), references, top1, common)


AGREEMENT_COLUMNS = {
    "ensemble": "agreement_prob_ensemble",
    "logit_ensemble": "agreement_logit_ensemble",
}


def agreement_columns(top1: Mapping[str, Tensor], predicted: Tensor) -> dict[str, float]:
    """Top-1 agreement on the test split of a model's predicted classes with each ensemble of
    :data:`AGREEMENT_COLUMNS` in ``top1``: the fraction of test inputs with the same class."""
    return {
        AGREEMENT_COLUMNS[name]: float((predicted == labels).double().mean())
        for name, labels in top1.items()
        if name in AGREEMENT_COLUMNS
    }


def temperature_columns(baseline: ClientBaseline, temperature: float) -> dict[str, float]:
    """The merge's server-fitted :math:`T` over the endpoints' mean :math:`T` and over the
    logit ensemble's :math:`T` (LEWC predicts the latter ratio: ``lewc_temperature_ratio``)."""
    common = baseline.common
    return {
        "merge_temperature": temperature,
        "temperature_ratio_endpoints": temperature / common["endpoint_temperature_mean"],
        "temperature_ratio_logit_ensemble": temperature / common["logit_ensemble_temperature"],
    }


def reference_row(context: StudyContext, baseline: ClientBaseline, method: str) -> dict[str, Any]:
    """The row of the reference ``method`` (a name of
    :data:`~fedlmc.merging.method_registry.REFERENCE_METHODS`)."""
    row = empty_row(method, context.num_clients)
    row.update(baseline.common)
    found = baseline.references[method]
    row.update(found)
    row["merge_gap_accuracy"] = row["endpoint_acc_mean"] - found["accuracy"]
    row["merge_gap_loss"] = found["nll_raw"] - row["endpoint_nll_mean"]
    if method in ("logit_ensemble", "ensemble_calibrated"):
        row["merge_gap_loss_calibrated"] = found["nll_calibrated"] - finite_mean(
            [e["nll_calibrated"] for e in baseline.endpoints]
        )
    row.update(agreement_columns(baseline.top1, baseline.top1[method]))
    row["merged_parameters_ratio"] = float(context.num_clients)  # every client's model runs
    return row
