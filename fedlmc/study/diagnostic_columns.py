r"""The mechanism columns of a merge: LEWC and LLFC per layer, orthogonality, ReLU additivity.

On the first ``diagnostic_samples`` test inputs (:attr:`StudyContext.diagnostic_x`):
LEWC's prediction :math:`\sum_i w_i^{\,l} f_l(x; \theta_i)` and LLFC's
:math:`\sum_i w_i f_l(x; \theta_i)` of each layer of the *combined* weights (before BatchNorm
re-estimation or REPAIR: ``lewc_measured_on``), at the merge weights and, for two clients, at
:math:`\lambda = 1/4` (``*_quarter``); the logit norm ratios, dead units and bias shares of the
evaluated merge; reciprocal orthogonality and ReLU additivity of clients 0 and 1 in the merged
basis; the clients' stable ranks; how far the merge's biases are from the depth-weighted ones
LEWC needs. Where LEWC's depths are undefined (a residual network: ``lewc_undefined_reason``),
LEWC's columns are NaN or empty. Column definitions: :mod:`fedlmc.study.rows`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from fedlmc.analysis.diagnostics import (
    bias_shares,
    dead_unit_fractions,
    hidden_weight_keys,
    layer_predictions,
    logit_norm_ratios,
    reciprocal_orthogonality,
    relu_additivity_error,
    stable_ranks,
)
from fedlmc.analysis.shared_forwards import ModelState
from fedlmc.averaging import load_state
from fedlmc.permutation.chain import lewc_bias_targets, norm_free_chain, residual_reason
from fedlmc.permutation.model_spec import permutation_spec
from fedlmc.permutation.spec import PermutationSpec
from fedlmc.study.context import StudyContext
from fedlmc.study.merge import Merged
from fedlmc.study.rows import PREDICTION_KEYS, PREDICTION_MEAN_KEYS, finite_mean, json_list

StateDict = dict[str, Tensor]

__all__ = [
    "LEWC_ONLY",
    "NOT_TEMPLATE_REASON",
    "QUARTER",
    "bias_mismatch",
    "diagnostic_columns",
    "lewc_measured_on",
    "lewc_undefined_reason",
    "prediction_columns",
    "stable_rank_columns",
]

QUARTER = 0.25  # the second point of the path where LEWC and LLFC are compared

LEWC_ONLY = tuple(key for key in PREDICTION_KEYS if key.startswith("lewc_"))
"""Per-layer quantities that exist only where LEWC's depth exponents do (NaN elsewhere)."""


def prediction_columns(
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float],
    merged_state: StateDict,
    x: Tensor,
    layer_names: Sequence[str],
    suffix: str = "",
    lewc_undefined: str = "",
) -> dict[str, Any]:
    """LEWC and LLFC errors, cosines and norm ratios per layer
    (:func:`fedlmc.analysis.diagnostics.layer_predictions`) and their means, with ``suffix`` on
    every column name; without a suffix also ``lewc_temperature_ratio`` (LEWC's predicted norm ratio
    at the logits). Where ``lewc_undefined`` gives a reason (a residual network), the LEWC columns
    are NaN / empty and only LLFC's and the measured ones are filled."""
    layers = layer_predictions(
        template, states, weights, merged_state, x, layer_names, lewc=not lewc_undefined
    )
    keys = [k for k in PREDICTION_KEYS if not (lewc_undefined and k in LEWC_ONLY)]
    columns: dict[str, Any] = {}
    if not lewc_undefined and not suffix:
        columns["lewc_temperature_ratio"] = layers[-1]["lewc_norm_ratio"]
    for key in keys:
        columns[f"{key}_layers{suffix}"] = json_list([r[key] for r in layers])
    for key in PREDICTION_MEAN_KEYS:
        if key in keys:
            columns[f"{key}_mean{suffix}"] = finite_mean([r[key] for r in layers])
    return columns


def lewc_measured_on(merged: Merged) -> str:
    """Which weights the LEWC/LLFC layer columns measure (the combined weights, and what the
    row's evaluated model adds after them)."""
    if merged.bn_reset:
        return "combined weights, before BatchNorm re-estimation"
    if merged.repaired:
        return "combined weights, before REPAIR"
    return "combined weights (the evaluated merge)"


def lewc_undefined_reason(
    template: nn.Module, spec: PermutationSpec | None, x: Tensor, layer_names: Sequence[str]
) -> str:
    """Why LEWC's prediction is undefined for ``template`` ("" where it is defined): its
    Linear/Conv layers are no plain chain (:func:`fedlmc.permutation.chain.residual_reason`), or no
    permutation spec could be found to tell."""
    try:
        spec = spec if spec is not None else permutation_spec(template, x[:2])
    except (ValueError, RuntimeError) as error:
        return f"no permutation spec to find the layers' depths: {error}"
    return residual_reason(spec, template.state_dict(), layer_names)


def bias_mismatch(
    spec: PermutationSpec, merged: Merged, weights: Sequence[float]
) -> list[float] | None:
    r"""Per biased layer of a norm-free plain chain: :math:`\|\bar b_l - \sum_i w_i^{\,l}
    b^{(i)}_l\| / \|\sum_i w_i^{\,l} b^{(i)}_l\|`, how far the merge's bias is from the one LEWC
    needs (0 for ``average_lewc_bias``; the plain average's grows with depth). ``None`` for
    bias-free models and for models other than norm-free chains, where the rule is not LEWC's."""
    try:
        layers = norm_free_chain(spec, merged.combined)
    except ValueError:
        return None
    targets = lewc_bias_targets(layers, merged.aligned, weights)
    if not targets:  # bias-free: nothing to compare
        return None
    return [
        _ratio_of_norms(merged.combined[key] - target, target) for key, target in targets.items()
    ]


def _ratio_of_norms(numerator: Tensor, denominator: Tensor) -> float:
    bottom = float(denominator.double().norm())
    return float(numerator.double().norm()) / bottom if bottom > 0 else float("nan")


def _orthogonality_mean(layers: Sequence[Mapping[str, Any]]) -> float:
    r"""Mean over layers and both directions of :math:`r_{ab}, r_{ba}`, leaving out the first
    Linear/Conv layer: it sees the same input in both models, so its ratios are 1 by construction.
    """
    values = [float(layer[k]) for layer in layers[1:] for k in ("ratio_ab", "ratio_ba")]
    return finite_mean(values)


NOT_TEMPLATE_REASON = (
    "the merge is a model of another architecture (builds_model; preserve_first keeps every "
    "client's first layers): no state dict of the template to measure LEWC/LLFC, the logit "
    "norm ratio, dead units or bias shares on"
)
"""``lewc_undefined_reason`` of a merge that is no state dict of the template."""


def _logit_norm_columns(
    template: nn.Module, merged: Merged, x: Tensor, weights: Sequence[float]
) -> dict[str, float]:
    """``logit_norm_ratio_logit_ensemble`` (what LEWC predicts) and
    ``logit_norm_ratio_client_norms`` of the evaluated merge
    (:func:`fedlmc.analysis.diagnostics.logit_norm_ratios`)."""
    ratios = logit_norm_ratios(template, merged.aligned, merged.state, x, weights)
    return {
        "logit_norm_ratio_logit_ensemble": ratios.logit_ensemble,
        "logit_norm_ratio_client_norms": ratios.client_norms,
    }


def diagnostic_columns(context: StudyContext, merged: Merged) -> dict[str, Any]:
    """LEWC and LLFC per layer on the combined weights (at the merge weights and, for two
    clients, at lambda = 1/4; LEWC's columns NaN where ``context.lewc_undefined``), the logit
    norm ratios, dead units and bias shares of the evaluated merge, and reciprocal orthogonality
    and ReLU additivity of clients 0 and 1 (in the merged basis), all on the context's
    ``diagnostic_x``. For a merge that is no state dict of the template (``builds_model``) only
    the clients' columns (orthogonality, ReLU additivity) and ``lewc_undefined_reason``
    (:data:`NOT_TEMPLATE_REASON`)."""
    if not merged.template_shaped:
        return {"lewc_undefined_reason": NOT_TEMPLATE_REASON, **_pair_columns(context, merged)}
    template, x, names = context.template, context.diagnostic_x, context.layer_names
    weights, undefined = list(context.weights), context.lewc_undefined
    columns: dict[str, Any] = {
        "lewc_measured_on": lewc_measured_on(merged),
        "lewc_undefined_reason": undefined,
        **_shared_predictions(context, merged.aligned, weights, merged.combined),
        **_logit_norm_columns(template, merged, x, weights),
        "dead_unit_fraction_layers": json_list(dead_unit_fractions(merged.model, x, names)),
        "bias_share_layers": json_list(bias_shares(merged.model, x)),
    }
    if not undefined:
        mismatch = bias_mismatch(context.spec or permutation_spec(template, x[:2]), merged, weights)
        if mismatch is not None:
            columns["lewc_bias_mismatch_layers"] = json_list(mismatch)
    if len(merged.aligned) == 2 and merged.path is not None:
        quarter = merged.path(merged.aligned[0], merged.aligned[1], QUARTER)  # as combined
        columns.update(
            _shared_predictions(
                context, merged.aligned, [QUARTER, 1.0 - QUARTER], quarter, suffix="_quarter"
            )
        )
    columns.update(_pair_columns(context, merged))
    return columns


def _shared_predictions(
    context: StudyContext,
    states: Sequence[StateDict],
    weights: Sequence[float],
    merged_state: StateDict,
    suffix: str = "",
) -> dict[str, Any]:
    """:func:`prediction_columns` on the context's diagnostic inputs and layers; with the
    context's ``forwards`` cache computed once for equal states and weights (a bias-free
    model's ``average_lewc_bias`` combines the weights as ``average`` does)."""

    def compute() -> dict[str, Any]:
        return prediction_columns(
            context.template,
            states,
            weights,
            merged_state,
            context.diagnostic_x,
            context.layer_names,
            suffix=suffix,
            lewc_undefined=context.lewc_undefined,
        )

    if context.forwards is None:
        return compute()
    template = context.template
    models = [ModelState(template, state) for state in (merged_state, *states)]
    tag = ("prediction_columns", tuple(float(w) for w in weights), suffix)
    return dict(context.forwards.memo(tag, models, (context.diagnostic_x,), compute))


def _pair_columns(context: StudyContext, merged: Merged) -> dict[str, Any]:
    """Reciprocal orthogonality and ReLU additivity of clients 0 and 1 in the merged basis (at
    their relative weight :math:`\\lambda = w_0 / (w_0 + w_1)`)."""
    x, weights, pair = context.diagnostic_x, context.weights, merged.aligned[:2]
    lam = weights[0] / (weights[0] + weights[1]) if weights[0] + weights[1] > 0 else 0.5
    if context.forwards is None:
        return _pair_values(context, pair, lam)
    # the same two clients (every merge that leaves them unpermuted): computed once
    states = [ModelState(context.template, state) for state in pair]
    found = context.forwards.memo(
        ("pair_columns", lam), states, (x,), lambda: _pair_values(context, pair, lam)
    )
    return dict(found)


def _pair_values(context: StudyContext, pair: Sequence[StateDict], lam: float) -> dict[str, Any]:
    """The pair columns of two clients' state dicts (``_pair_columns``)."""
    device, x = context.device, context.diagnostic_x
    model_a = load_state(context.template, pair[0]).to(device).eval()
    model_b = load_state(context.template, pair[1]).to(device).eval()
    orth = reciprocal_orthogonality(model_a, model_b, x)
    relu = relu_additivity_error(model_a, model_b, x, lam=lam)
    return {
        "recip_orth_mean": _orthogonality_mean(orth),
        "recip_orth_layers": json_list(
            [(layer["ratio_ab"] + layer["ratio_ba"]) / 2 for layer in orth]
        ),
        "relu_additivity_mean": finite_mean(relu),
        "relu_additivity_layers": json_list(relu),
    }


def stable_rank_columns(states: Sequence[StateDict], head: str) -> dict[str, str]:
    """``stable_rank_layers``: per hidden weight (every weight outside the output module
    ``head``), the mean stable rank over the clients."""
    ranks = [stable_ranks(sd, hidden_weight_keys(sd, head)) for sd in states]
    return {"stable_rank_layers": json_list([sum(r) / len(r) for r in zip(*ranks, strict=True)])}
