r"""The results-row schema: one tidy row per evaluated method, the columns and how they fill.

Every row of :func:`fedlmc.study.compare_methods` (and of the Flower server, which adds its
round columns) has every column of :data:`COLUMNS`; a value that does not apply is NaN (numbers)
or an empty string (:data:`STRING_COLUMNS`, JSON lists for the per-layer ones). Every column has
one definition. Metrics are on the test split; :math:`A` is accuracy, :math:`L` the mean NLL.

- ``accuracy``; ``nll``/``ece`` with the row's temperature (``temperature = 1`` for raw rows,
  the server-fitted :math:`T` for ``_t`` rows); ``nll_raw``/``ece_raw`` and
  ``nll_calibrated``/``ece_calibrated`` are filled for both.
- ``endpoint_acc_mean/min/max``, ``endpoint_nll_mean``: the clients' own models (unweighted).
- **Merge gap** (any number of clients): the row's model against the unweighted mean of the
  endpoints, ``merge_gap_accuracy`` :math:`= \bar A_{\mathrm{end}} - A`,
  ``merge_gap_loss`` :math:`= L_{\mathrm{raw}} - \bar L_{\mathrm{end,raw}}` and
  ``merge_gap_loss_calibrated`` (both sides with their own server-fitted temperature).
- **Barriers** (two clients, diagnostics on): on the path
  :math:`\theta(\lambda) = \lambda \theta_a + (1-\lambda) \pi(\theta_b)` (BatchNorm statistics
  re-estimated, or for the REPAIR methods every interior point repaired, and :math:`T` refitted
  at each :math:`\lambda`), the excess over the chord between
  the endpoints, :math:`e(\lambda) = L(\lambda) - [\lambda L(1) + (1-\lambda) L(0)]` (for accuracy
  the chord minus the path). ``*_barrier_half``: :math:`e(1/2)`, **signed** (the paper's Table 1;
  negative when the midpoint beats the chord); ``*_barrier_max``: :math:`\max_\lambda e(\lambda)`
  over the grid (Git Re-Basin's definition, never negative). For ``loss``, ``loss ..._calibrated``
  and ``accuracy``.
- **Paths to the merge** (three or more clients, diagnostics on): for every client :math:`i`
  the path :math:`\lambda \pi_i(\theta_i) + (1-\lambda) \bar\theta` to the merged model
  (post-processed like the merge at every point: BatchNorm re-estimated or REPAIR applied), its
  loss barrier at :math:`\lambda = 1/2` (signed) and its maximum, raw and calibrated; the mean
  over clients (``client_to_merge_path_loss_barrier_half_mean``, ...) and the worst client
  (``..._worst``). They measure the *shape of the path from a client to the merge*, not the
  merge's quality: a poor merge can sit on a convex path (the merge's quality is
  ``merge_gap_*``). With at most ``PAIRWISE_MAX_CLIENTS`` clients,
  ``pairwise_loss_barrier_half`` (and ``_calibrated``) hold the N x N matrix (JSON) of the
  loss barrier at :math:`\lambda = 1/2` between clients i and j in the method's basis and on its
  path rule (0 on the diagonal), post-processed like the merge.
- **Ensembles and temperatures** (every row): ``ensemble_acc``/``ensemble_nll`` of the
  probability ensemble :math:`\sum_i w_i\,\mathrm{softmax}(z_i)` (row ``ensemble``) and
  ``logit_ensemble_acc`` of the logit ensemble :math:`\mathrm{softmax}(\sum_i w_i z_i)` (row
  ``logit_ensemble``, which LEWC likens the merge to: scaled logits, same argmax);
  ``agreement_prob_ensemble`` / ``agreement_logit_ensemble``: fraction of test inputs on which
  the row's model predicts the same class as each ensemble. ``endpoint_temperature_mean`` (mean
  of the clients' own server-fitted :math:`T`), ``logit_ensemble_temperature``,
  ``merge_temperature`` (the merge's server-fitted :math:`T`, also on raw rows),
  ``temperature_ratio_endpoints`` (merge :math:`T` / ``endpoint_temperature_mean``) and
  ``temperature_ratio_logit_ensemble`` (merge :math:`T` / logit ensemble :math:`T`). If the
  merged logits are :math:`c` times the logit ensemble's, the latter ratio is exactly :math:`c`;
  LEWC predicts :math:`c` = ``lewc_temperature_ratio`` :math:`= \|\sum_i w_i^L z_i\| /
  \|\sum_i w_i z_i\|` (:math:`N^{1-L}` at equal weights; the last entry of
  ``lewc_norm_ratio_layers``; NaN where LEWC is undefined).
- **LEWC and LLFC** (diagnostics on, two or more clients; per layer :math:`l` of the model's
  ``layer_names``, on 512 test inputs, :mod:`fedlmc.analysis.diagnostics`). They measure the
  **combined weights** :math:`\bar\theta` of the method, *before* BatchNorm re-estimation or REPAIR
  (which rescale what LEWC predicts); ``lewc_measured_on`` names the weights measured for each
  row. With :math:`F_l = f_l(\bar\theta)`, LEWC's prediction :math:`P_l = \sum_i w_i^l
  f_l(\theta_i)` and LLFC's :math:`Q_l = \sum_i w_i f_l(\theta_i)`, which LLFC (Zhou et al.
  2023) claims only up to a positive scale: ``lewc_error_layers``
  :math:`\|F_l - P_l\| / \|F_l\|`; ``llfc_scaled_error_layers``
  :math:`\min_{c>0} \|F_l - c Q_l\| / \|F_l\|` (at equal weights never above LEWC's, by
  construction); ``lewc_cos_layers`` / ``llfc_cos_layers`` (mean cosine with each prediction;
  equal at equal weights); ``norm_ratio_layers`` (measured :math:`\|F_l\| / \|Q_l\|`) against
  ``lewc_norm_ratio_layers`` (LEWC's prediction of it, :math:`\|P_l\| / \|Q_l\|`): the scale
  is LEWC's content beyond LLFC. ``*_mean`` over layers. The ``*_quarter`` columns repeat them at
  :math:`\lambda = 1/4` on the two-client path (weights 1/4, 3/4), where the directions differ
  too. LEWC's exponent :math:`l` exists only for plain chains (:mod:`fedlmc.permutation.chain`): for
  a residual network the LEWC columns are NaN/empty and ``lewc_undefined_reason`` says why (the
  LLFC and measured columns stay). ``logit_norm_ratio``: mean logit norm of the evaluated merge
  over the endpoints' (weighted).
- **Mechanism**: ``recip_orth_layers`` (per Linear/Conv, mean of :math:`r_{ab}, r_{ba}` of
  clients 0 and 1; ``recip_orth_mean`` leaves out the first layer, whose inputs coincide),
  ``relu_additivity_layers`` / ``_mean`` (both on bias-free products :math:`W z`: they cannot see
  biases), ``lewc_bias_mismatch_layers`` (plain chains with biases: per biased layer
  :math:`\|\bar b_l - \sum_i w_i^l b_i\| / \|\sum_i w_i^l b_i\|`, how far the merge's bias is
  from the one LEWC needs; 0 for ``average_lewc_bias``), ``dead_unit_fraction_layers`` (per
  hidden layer of the evaluated merge, the fraction of units never active on the diagnostic
  inputs), ``bias_share_layers`` (per Linear/Conv of the evaluated merge,
  :math:`\|b\| / (\|W z\| + \|b\|)` over the diagnostic inputs: near 1 when the bias swamps
  the signal), ``stable_rank_layers`` (stable rank of each hidden weight, mean over the clients).
- ``auto_choice`` and ``auto_nll_gap``: what the ``auto`` method chose (``average`` or
  ``weight_matching``) and the calibrated-NLL gap of the plain average it measured on the server
  split (:func:`fedlmc.merging.methods.automatic_choice`); empty/NaN for the other methods.
- ``merge_seconds``; ``curve`` (JSON of the two-client interpolation path).

**Round columns** (:data:`ROUND_COLUMNS`, added by the Flower server to every row of a
federation): ``clients_survived`` (clients merged), ``clients_failed`` (``"node N (partition P):
reason; ..."`` for the training-round replies dropped and the clients left out by the alignment
query), ``clients_dropped`` (distinct clients with any reply dropped by the screen of
:mod:`fedlmc.strategies.screening`, a timeout or an error: training or query round) and
``clients_dropped_reasons`` (``"node N (partition P): [QUERY reply:] reason; ..."`` for each of
them; a client dropped only from a query after the merge stays merged), ``bytes_sent_by_clients``,
``rounds``, ``train_seconds``, ``round_seconds``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "CLIENT_BARRIER_COLUMNS",
    "COLUMNS",
    "LAYER_COLUMNS",
    "NAN",
    "ROUND_COLUMNS",
    "ROUND_STRING_COLUMNS",
    "STRING_COLUMNS",
    "curve_json",
    "empty_row",
    "endpoint_columns",
    "finite_mean",
    "metric_columns",
]

PREDICTION_KEYS = (
    "lewc_cos",
    "lewc_error",
    "llfc_cos",
    "llfc_scaled_error",
    "norm_ratio",
    "lewc_norm_ratio",
)
PREDICTION_MEAN_KEYS = PREDICTION_KEYS[:4]  # errors and cosines have a mean over layers
LAYER_COLUMNS = (
    *(f"{key}_layers{at}" for at in ("", "_quarter") for key in PREDICTION_KEYS),
    "lewc_bias_mismatch_layers",
    "dead_unit_fraction_layers",
    "bias_share_layers",
    "recip_orth_layers",
    "relu_additivity_layers",
    "stable_rank_layers",
    "pairwise_loss_barrier_half",
    "pairwise_loss_barrier_half_calibrated",
)
CLIENT_BARRIER_COLUMNS = tuple(
    f"client_to_merge_path_loss_barrier_{at}{cal}_{over}"
    for at in ("half", "max")
    for cal in ("", "_calibrated")
    for over in ("mean", "worst")
)
COLUMNS = (
    "method",
    "num_clients",
    "endpoint_acc_mean",
    "endpoint_acc_min",
    "endpoint_acc_max",
    "endpoint_nll_mean",
    "ensemble_acc",
    "ensemble_nll",
    "logit_ensemble_acc",
    "accuracy",
    "nll",
    "ece",
    "temperature",
    "nll_raw",
    "ece_raw",
    "nll_calibrated",
    "ece_calibrated",
    "agreement_prob_ensemble",
    "agreement_logit_ensemble",
    "endpoint_temperature_mean",
    "logit_ensemble_temperature",
    "merge_temperature",
    "temperature_ratio_endpoints",
    "temperature_ratio_logit_ensemble",
    "lewc_temperature_ratio",
    "merge_gap_accuracy",
    "merge_gap_loss",
    "merge_gap_loss_calibrated",
    "accuracy_barrier_half",
    "loss_barrier_half",
    "loss_barrier_half_calibrated",
    "accuracy_barrier_max",
    "loss_barrier_max",
    "loss_barrier_max_calibrated",
    *CLIENT_BARRIER_COLUMNS,
    "lewc_measured_on",
    "lewc_undefined_reason",
    *(f"{key}_mean{at}" for at in ("", "_quarter") for key in PREDICTION_MEAN_KEYS),
    "logit_norm_ratio",
    "recip_orth_mean",
    "relu_additivity_mean",
    *LAYER_COLUMNS,
    "auto_choice",
    "auto_nll_gap",
    "merge_seconds",
    "curve",
)
STRING_COLUMNS = (
    "method",
    "lewc_measured_on",
    "lewc_undefined_reason",
    *LAYER_COLUMNS,
    "auto_choice",
    "curve",
)
ROUND_COLUMNS = (
    "clients_survived",
    "clients_failed",
    "clients_dropped",
    "clients_dropped_reasons",
    "bytes_sent_by_clients",
    "rounds",
    "train_seconds",
    "round_seconds",
)
ROUND_STRING_COLUMNS = ("clients_failed", "clients_dropped_reasons")
NAN = float("nan")


def empty_row(method: str, num_clients: int) -> dict[str, Any]:
    """A row with every column present: NaN numbers, empty strings."""
    row: dict[str, Any] = {name: NAN for name in COLUMNS}
    row.update({name: "" for name in STRING_COLUMNS})
    row["method"] = method
    row["num_clients"] = int(num_clients)
    return row


def metric_columns(
    metrics: Mapping[str, float], calibrated: bool, temperature: float
) -> dict[str, float]:
    """The metric columns of a row from test ``accuracy``, ``nll_raw``, ``ece_raw``,
    ``nll_calibrated``, ``ece_calibrated``; ``nll``/``ece`` follow ``calibrated``."""
    suffix = "calibrated" if calibrated else "raw"
    return {
        "accuracy": metrics["accuracy"],
        "nll": metrics[f"nll_{suffix}"],
        "ece": metrics[f"ece_{suffix}"],
        "temperature": temperature if calibrated else 1.0,
        "nll_raw": metrics["nll_raw"],
        "ece_raw": metrics["ece_raw"],
        "nll_calibrated": metrics["nll_calibrated"],
        "ece_calibrated": metrics["ece_calibrated"],
    }


def endpoint_columns(endpoints: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Unweighted mean, min and max test accuracy and mean test NLL of the clients."""
    acc = [e["accuracy"] for e in endpoints]
    return {
        "endpoint_acc_mean": sum(acc) / len(acc),
        "endpoint_acc_min": min(acc),
        "endpoint_acc_max": max(acc),
        "endpoint_nll_mean": sum(e["nll_raw"] for e in endpoints) / len(endpoints),
    }


def finite_mean(values: Sequence[float]) -> float:
    """Mean of the finite values (NaN when there are none)."""
    kept = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(kept) / len(kept) if kept else NAN


def curve_json(curve: Any) -> str:
    """An interpolation curve (DataFrame) as JSON ``{lam, accuracy, nll, nll_calibrated}``."""
    keys = ("lam", "accuracy", "nll", "nll_calibrated")
    return json.dumps({k: [float(v) for v in curve[k]] for k in keys})
