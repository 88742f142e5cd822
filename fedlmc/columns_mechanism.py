r"""The results columns of the mechanism: LEWC and LLFC per layer, barriers, orthogonality.

Column families (functions returning :class:`~fedlmc.column_schema.Column` tuples) that
:mod:`fedlmc.columns` assembles into the one column table, in ``results.csv`` order: the LEWC and
LLFC layer predictions and their means (:data:`PREDICTION_KEYS`), the barriers of the
two-client path and of each client's path to the merge, the mechanism means and their per-layer
lists, and where LEWC's depths are defined. Notation as in :mod:`fedlmc.columns`. Imports
nothing but the column declaration.
"""

from __future__ import annotations

from fedlmc.column_schema import Column

# ----------------------------------------------------------------------------- families

PREDICTION_KEYS = (
    "lewc_cos",
    "lewc_error",
    "llfc_cos",
    "llfc_scaled_error",
    "norm_ratio",
    "lewc_norm_ratio",
    "lewc_cos_centred",
    "lewc_cos_shuffled",
    "llfc_cos_centred",
    "llfc_cos_shuffled",
    "common_mode_share",
)
"""The per-layer LEWC/LLFC quantities (one ``*_layers`` column each, and ``*_layers_quarter``)."""
PREDICTION_MEAN_KEYS = tuple(k for k in PREDICTION_KEYS if "_cos" in k or "_error" in k)
"""Those with a mean over layers (errors and cosines)."""
CENTRED = (
    "as `{raw}` with both sides centred on their mean over the inputs, `F_l(x) - mean_x F_l` "
    "and `{p}(x) - mean_x {p}` per unit and position: the input-specific agreement, without the "
    "input-independent vector non-negative (ReLU) features share; NaN where either side is "
    "constant over the inputs (a constant feature has no centred direction)"
)
SHUFFLED = (
    "the baseline of `{raw}` by construction: mean over inputs of the cosine between `F_l(x)` "
    "and `{p}` at another input (with `p` the permutation of the inputs drawn from seed 0, "
    "input `p_k` meets the prediction for input `p_(k+1 mod n)`); a raw cosine near it says "
    "nothing input-specific"
)
PREDICTIONS = {
    "lewc_cos": (
        "LEWC's prediction: mean cosine with it",
        "mean over inputs of the cosine between `F_l` and LEWC's prediction "
        "`P_l = sum_i w_i^l f_l(theta_i)`",
    ),
    "lewc_error": (
        "LEWC relative error",
        "`||F_l - P_l|| / ||F_l||` (scale included)",
    ),
    "llfc_cos": (
        "LLFC's prediction: mean cosine with it",
        "mean over inputs of the cosine between `F_l` and LLFC's prediction "
        "`Q_l = sum_i w_i f_l(theta_i)` (equal to `lewc_cos` at equal weights)",
    ),
    "llfc_scaled_error": (
        "LLFC relative error at its best positive scale",
        "`min_{c>0} ||F_l - c Q_l|| / ||F_l||`: LLFC (Zhou et al. 2023) claims `Q_l` only up "
        "to a positive scale (at equal weights never above `lewc_error`, by construction)",
    ),
    "norm_ratio": (
        "measured feature shrinkage",
        "`||F_l|| / ||Q_l||`, to compare with `lewc_norm_ratio` (LLFC makes no claim about it)",
    ),
    "lewc_norm_ratio": (
        "LEWC's predicted feature shrinkage",
        "`||P_l|| / ||Q_l||`: the scale, LEWC's content beyond LLFC",
    ),
    "lewc_cos_centred": (
        "LEWC's prediction: mean centred cosine with it",
        CENTRED.format(raw="lewc_cos", p="P_l"),
    ),
    "lewc_cos_shuffled": (
        "LEWC's prediction for a shuffled input: mean cosine with it (baseline)",
        SHUFFLED.format(raw="lewc_cos", p="P_l"),
    ),
    "llfc_cos_centred": (
        "LLFC's prediction: mean centred cosine with it",
        CENTRED.format(raw="llfc_cos", p="Q_l"),
    ),
    "llfc_cos_shuffled": (
        "LLFC's prediction for a shuffled input: mean cosine with it (baseline)",
        SHUFFLED.format(raw="llfc_cos", p="Q_l"),
    ),
    "common_mode_share": (
        "share of the merged output's energy in its mean over inputs",
        "`n ||mean_x F_l(x)||^2 / sum_x ||F_l(x)||^2` over the `n` inputs (flattened per input): "
        "1 for a feature constant over the inputs, 0 for zero-mean features; NaN where `F_l = 0`",
    ),
}
AT = {
    "": (
        "",
        "diagnostics on, two or more clients",
        "`F_l = f_l(theta_bar)` of the method's combined weights `theta_bar` (before BatchNorm "
        "re-estimation or REPAIR: `lewc_measured_on`) on 512 test inputs",
    ),
    "_quarter": (
        " at lambda = 1/4",
        "two-client cells, diagnostics on",
        "at lambda = 1/4 on the two-client path (weights 1/4, 3/4), where the directions of "
        "LEWC and LLFC differ too",
    ),
}
AT_METHODS = {"": "template_shaped", "_quarter": "on_path"}
"""Which merge methods each point measures (:data:`fedlmc.column_schema.METHOD_SCOPES`): the
merge's own weights, or the point at lambda = 1/4 of the path between the clients."""
PLAIN_CHAINS = "; plain chains only (NaN/empty for a residual network: `lewc_undefined_reason`)"


def _prediction_scope(key: str, at: str) -> str:
    """Where a LEWC/LLFC column applies: LEWC's own quantities need a plain chain."""
    return AT[at][1] + (PLAIN_CHAINS if key.startswith("lewc_") else "")


def prediction_layer_family() -> tuple[Column, ...]:
    """``{key}_layers{at}``: per layer of the model's ``layer_names``, JSON lists."""
    return tuple(
        Column(
            f"{key}_layers{at}",
            f"{PREDICTIONS[key][0]}{AT[at][0]}, per layer",
            _prediction_scope(key, at),
            f"per layer `l` (JSON list), {AT[at][2]}: {PREDICTIONS[key][1]}",
            kind="JSON",
            methods=AT_METHODS[at],
        )
        for at in AT
        for key in PREDICTION_KEYS
    )


def prediction_mean_family() -> tuple[Column, ...]:
    """``{key}_mean{at}``: the mean over layers of the errors and cosines."""
    return tuple(
        Column(
            f"{key}_mean{at}",
            f"{PREDICTIONS[key][0]}{AT[at][0]}"
            f"{' (combined weights)' if not at and 'error' in key else ''}, mean over layers",
            _prediction_scope(key, at),
            f"mean over layers of `{key}_layers{at}`",
            report_table="LEWC" if "error" in key else "",
            methods=AT_METHODS[at],
        )
        for at in AT
        for key in PREDICTION_MEAN_KEYS
    )


BARRIER_PATH = (
    "on the path `theta(l) = l theta_a + (1 - l) pi(theta_b)` (or the method's own rule, e.g. "
    "depth-weighted biases at every l; BatchNorm statistics re-estimated, or for the REPAIR "
    "methods every interior point repaired; T refitted at each l), the excess over the chord "
    "`e(l) = L(l) - [l L(1) + (1 - l) L(0)]` (for accuracy the chord minus the path)"
)
REFIT_T = "T refitted at every lambda, endpoints included"
"""What "calibrated" means in every barrier column's title."""
BARRIER_METRICS = {
    "accuracy": ("Accuracy barrier", "", "accuracy"),
    "loss": ("Loss barrier", ", raw logits", "NLL of the raw logits"),
    "loss_calibrated": (
        "Loss barrier",
        f", calibrated ({REFIT_T})",
        "NLL at the temperature refitted on the server split at each l, the endpoints l = 0 and "
        "1 included (one T per point of the path, not one T for the merge applied everywhere)",
    ),
}
BARRIER_AT = {
    "half": (
        " at lambda = 1/2 (signed)",
        "`e(1/2)` of the {of}, **signed** (negative when the midpoint beats the chord; the "
        "paper's Table 1)",
    ),
    "max": (
        ", maximum over lambda",
        "`max_l e(l)` of the {of} over the lambda grid (Git Re-Basin's definition; never negative)",
    ),
}


def barrier_family() -> tuple[Column, ...]:
    """``{metric}_barrier_{half,max}`` of the two-client path."""
    columns = []
    for at, (heading, rule) in BARRIER_AT.items():
        for metric, (what, suffix, of) in BARRIER_METRICS.items():
            base, _, calibrated = metric.partition("_")
            name = f"{base}_barrier_{at}{'_' + calibrated if calibrated else ''}"
            columns.append(
                Column(
                    name,
                    f"{what}{heading}{suffix}",
                    "two-client cells, diagnostics on",
                    f"{rule.format(of=of)}; {BARRIER_PATH}",
                    report_table="barriers",
                    methods="on_path",
                )
            )
    return tuple(columns)


CLIENT_PATH = (
    "for every client `i` (up to 16 clients; with more, 16 evenly spaced ones, first and last "
    "included: `fedlmc.analysis.paths.path_clients`, which bounds this diagnostic's cost) the "
    "path `l pi_i(theta_i) + (1 - l) theta_bar` to the merged model "
    "(post-processed like the merge at every point: BatchNorm re-estimated or REPAIR applied). "
    "It measures the *shape of the path* from a client to the merge, not the merge's quality (a "
    "poor merge can sit on a convex path): the merge's quality is `merge_gap_*`"
)


SHAPE_NOTE = " (its shape, not the merge's quality)"


def client_barrier_family() -> tuple[Column, ...]:
    """``client_to_merge_path_loss_barrier_{half,max}[_calibrated]_{mean,worst}``."""
    columns = []
    for at, at_text in (("half", "at 1/2"), ("max", "maximum over lambda")):
        for cal, cal_text in (("", "raw logits"), ("_calibrated", f"calibrated, {REFIT_T}")):
            for over, over_text in (("mean", "mean over clients"), ("worst", "worst client")):
                reported = at == "half" and cal == "_calibrated"
                columns.append(
                    Column(
                        f"client_to_merge_path_loss_barrier_{at}{cal}_{over}",
                        f"Barrier {at_text} on the path client -> merge"
                        f"{SHAPE_NOTE if over == 'mean' else ''}, {cal_text}, {over_text}",
                        "cells of three or more clients, diagnostics on",
                        f"{BARRIER_AT[at][1].format(of=f'loss ({cal_text})')} on each "
                        f"client's path, {over_text}: {CLIENT_PATH}",
                        report_table="client paths" if reported else "",
                        methods="template_shaped",
                    )
                )
    return tuple(columns)


def mechanism_family() -> tuple[Column, ...]:
    """LEWC scope, logit shrinkage, orthogonality and the per-layer mechanism columns."""
    diagnostics = "diagnostics on, two or more clients"
    return (
        Column(
            "logit_norm_ratio_logit_ensemble",
            "Logit norm of the merge / the logit ensemble's (LEWC: N^(1-L) at equal weights)",
            diagnostics,
            "`mean_n ||z_merge(x_n)|| / mean_n ||sum_i w_i z_i(x_n)||`: the evaluated merge's "
            "logits over the logit ensemble's, the weighted mean of the aligned clients' logits. "
            "The quantity LEWC predicts: `N^(1-L)` at equal weights, reached exactly when LEWC "
            "holds (`lewc_temperature_ratio` is the prediction at any weights; "
            "`fedlmc.analysis.diagnostics.logit_norm_ratios`)",
            report_table="mechanism",
            methods="template_shaped",
        ),
        Column(
            "logit_norm_ratio_client_norms",
            "Mean logit norm of the merge / the clients' mean logit norms (not LEWC's quantity)",
            diagnostics,
            "`mean_n ||z_merge(x_n)|| / sum_i w_i mean_n ||z_i(x_n)||`: the evaluated merge's "
            "logits against the clients' own scale; the clients' logits partly cancel in their "
            "mean, so it is at most `logit_norm_ratio_logit_ensemble` (equal when they point the "
            "same way on every input). Named `logit_norm_ratio` in results written before "
            "issue 53, which are read back under this name",
            methods="template_shaped",
        ),
        Column(
            "recip_orth_mean",
            "Reciprocal orthogonality ||W_a z_b|| / ||W_a z_a|| (0 = orthogonal)",
            diagnostics,
            "mean of `recip_orth_layers` over layers, leaving out the first layer (its inputs "
            "coincide, so its ratios are 1 by construction)",
            report_table="mechanism",
        ),
        Column(
            "relu_additivity_mean",
            "ReLU additivity error, mean over layers",
            diagnostics,
            "mean of `relu_additivity_layers`",
        ),
    )


def layer_mechanism_family() -> tuple[Column, ...]:
    """Per-layer mechanism diagnostics (JSON lists)."""
    diagnostics = "diagnostics on, two or more clients"
    return (
        Column(
            "lewc_bias_mismatch_layers",
            "distance of the merge's biases from LEWC's, per biased layer",
            "diagnostics on; norm-free plain chains with biases",
            "per biased layer `||b_bar_l - sum_i w_i^l b_i|| / ||sum_i w_i^l b_i||`: how far the "
            "merge's bias is from the one LEWC needs (0 for `average_lewc_bias`, `2^(l-1) - 1` "
            "for the plain average of two)",
            kind="JSON",
        ),
        Column(
            "dead_unit_fraction_layers",
            "fraction of dead units, per hidden layer",
            diagnostics,
            "per hidden layer of the evaluated merge, the fraction of units never active on the "
            "diagnostic inputs",
            kind="JSON",
        ),
        Column(
            "bias_share_layers",
            "share of the bias in each layer's output",
            diagnostics,
            "per Linear/Conv of the evaluated merge, `||b|| / (||W z|| + ||b||)` over the "
            "diagnostic inputs (near 1: the bias swamps the signal)",
            kind="JSON",
        ),
        Column(
            "recip_orth_layers",
            "reciprocal orthogonality, per layer",
            diagnostics,
            "per Linear/Conv, the mean of `r_ab = mean_n ||W_a z_b|| / mean_n ||W_a z_a||` and "
            "`r_ba` of the aligned clients 0 and 1, with `z` each model's layer inputs and `W` "
            "the weights without bias (0 = orthogonal, 1 for identical models)",
            kind="JSON",
        ),
        Column(
            "relu_additivity_layers",
            "ReLU additivity error, per layer",
            diagnostics,
            "per ReLU, on the pre-activations `z_a`, `z_b` of the aligned clients 0 and 1 at "
            "`l = w_0 / (w_0 + w_1)`: `||relu(l z_a + (1 - l) z_b) - [l relu(z_a) + (1 - l) "
            "relu(z_b)]|| / ||l relu(z_a) + (1 - l) relu(z_b)||` (0 when `z_a = z_b`)",
            kind="JSON",
        ),
        Column(
            "stable_rank_layers",
            "stable rank of each hidden weight",
            diagnostics,
            "per hidden weight `||W||_F^2 / ||W||_2^2`, mean over the clients",
            kind="JSON",
        ),
        *(
            Column(
                f"pairwise_loss_barrier_half{cal}",
                f"pairwise loss barriers at 1/2 between clients, {text}",
                "cells of three to `PAIRWISE_MAX_CLIENTS` (6) clients, diagnostics on",
                f"the N x N matrix (JSON) of the loss barrier at lambda = 1/2 ({text}) between "
                "clients i and j in the method's basis and on its path rule, post-processed "
                "like the merge (0 on the diagonal)",
                kind="JSON",
                methods="template_shaped",
            )
            for cal, text in (("", "raw logits"), ("_calibrated", f"calibrated, {REFIT_T}"))
        ),
    )


def lewc_scope_family() -> tuple[Column, ...]:
    """Which weights the LEWC columns measure, and why they are NaN where they are."""
    return (
        Column(
            "lewc_measured_on",
            "the weights the LEWC/LLFC columns measure",
            "merge rows, diagnostics on, two or more clients",
            "the method's combined weights, with what the evaluated model adds after them "
            '("before BatchNorm re-estimation", "before REPAIR")',
            kind="text",
        ),
        Column(
            "lewc_undefined_reason",
            "why LEWC's columns are NaN",
            "merge rows, diagnostics on",
            "why LEWC's depth exponents do not exist for the model (a residual network: no "
            "single depth per layer), or, for a merge that is a model of another architecture "
            "(`preserve_first`), why every LEWC/LLFC and merged-model column is NaN; empty "
            "where LEWC is defined",
            kind="text",
        ),
    )
