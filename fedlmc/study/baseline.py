r"""What every row of a study compares with, computed once from the clients' predictions.

:func:`client_baseline` predicts each client once on the test and server splits and gives a
:class:`ClientBaseline`: the endpoints' metrics, the two ensembles every merge is compared with
(``ensemble``, :math:`\sum_i w_i\,\mathrm{softmax}(z_i)`, and ``logit_ensemble``,
:math:`\mathrm{softmax}(\sum_i w_i z_i / T)`) with their top-1 labels, and the columns every
row shares. :func:`reference_row` is an ensemble's row; :func:`agreement_columns` and
:func:`temperature_columns` compare a merge with them.
"""

from __future__ import annotations

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
    the endpoints' metrics, the two ensembles' rows and top-1 labels, and the columns every
    row shares (``common``: endpoint means, ensemble accuracies, temperatures, stable ranks)."""

    endpoints: tuple[dict[str, float], ...]
    references: dict[str, dict[str, Any]]
    top1: dict[str, Tensor]
    common: dict[str, Any]


def _weighted_logits(logits: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    return sum(w * z for w, z in zip(weights, logits, strict=True))


def _reference_rows(
    predictions: Sequence[Predictions], weights: Sequence[float], splits: DataSplits
) -> tuple[dict[str, dict[str, Any]], dict[str, Tensor]]:
    r"""The two ensembles every merge is compared with, as row columns, and their top-1 labels:
    ``ensemble`` :math:`\sum_i w_i\,\mathrm{softmax}(z_i)` (raw) and ``logit_ensemble``
    :math:`\mathrm{softmax}(\sum_i w_i z_i / T)` (the scaled logit ensemble LEWC likens the merge
    to; raw, with its server-fitted :math:`T` in the calibrated columns)."""
    labels = splits.test[1]
    probs = ensemble_probs([p.test for p in predictions], list(weights))
    prob = metrics_from_probs(probs, labels)
    logit = Predictions(
        _weighted_logits([p.test for p in predictions], weights),
        _weighted_logits([p.server for p in predictions], weights),
        1.0,
    )
    logit.temperature = fit_temperature(logit.server, splits.server[1])
    top1 = {"ensemble": probs.argmax(dim=1), "logit_ensemble": logit.test.argmax(dim=1)}
    rows = {
        "ensemble": {
            "accuracy": prob["accuracy"],
            "nll": prob["nll"],
            "ece": prob["ece"],
            "temperature": 1.0,
            "nll_raw": prob["nll"],
            "ece_raw": prob["ece"],
        },
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
    """Top-1 agreement on the test split of a model's predicted classes with each ensemble's
    (:data:`AGREEMENT_COLUMNS`): the fraction of test inputs with the same predicted class."""
    return {
        AGREEMENT_COLUMNS[name]: float((predicted == labels).double().mean())
        for name, labels in top1.items()
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
    """The row of the reference ``method`` (``ensemble`` or ``logit_ensemble``)."""
    row = empty_row(method, context.num_clients)
    row.update(baseline.common)
    found = baseline.references[method]
    row.update(found)
    row["merge_gap_accuracy"] = row["endpoint_acc_mean"] - found["accuracy"]
    row["merge_gap_loss"] = found["nll_raw"] - row["endpoint_nll_mean"]
    if method == "logit_ensemble":
        row["merge_gap_loss_calibrated"] = found["nll_calibrated"] - finite_mean(
            [e["nll_calibrated"] for e in baseline.endpoints]
        )
    row.update(agreement_columns(baseline.top1, baseline.top1[method]))
    row["merged_parameters_ratio"] = float(context.num_clients)  # every client's model runs
    return row
