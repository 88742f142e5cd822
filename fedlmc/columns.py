r"""The results-column table: every column of ``results.csv`` declared once.

A :class:`Column` holds a column's name, what it measures (one line, also the heading of its
table in ``report.md``), which cells and methods it applies to, its definition (Markdown text),
its kind (a number, text, or a JSON list/matrix held as text), the code that fills it
(``source``) and the report section it is averaged in, if any. Everything that lists columns
derives from these declarations: the row schema (:mod:`fedlmc.study.rows`:
:data:`~fedlmc.study.rows.COLUMNS`, the string columns, the Flower server's round columns), the
validation of ``results.csv`` (:mod:`fedlmc.simulations.results_file`), the docs' columns table
(:func:`fedlmc.study.rows.columns_markdown`) and the per-method mean tables of ``report.md``. A
merge method declares the columns only it fills next to its registration (``register_method(...,
columns=...)``, e.g. ``auto_choice``).

Notation: metrics are on the test split; :math:`A` is accuracy, :math:`L` the mean NLL,
:math:`w_i` the clients' normalised weights, :math:`z_i` client :math:`i`'s logits,
:math:`f_l(\theta)` layer :math:`l`'s hidden features, :math:`T` a fitted softmax temperature.
Imports nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "COMMON_COLUMNS",
    "KINDS",
    "REPORT_SECTIONS",
    "SOURCES",
    "Column",
    "check_unique",
]

KINDS = ("number", "text", "JSON")
"""``number``: a float or int (NaN where it does not apply); ``text``: a string (empty where it
does not apply); ``JSON``: a JSON list or matrix held as a string (empty where it does not)."""
SOURCES = ("row", "round", "server", "provenance")
"""``row``: every row (:func:`fedlmc.study.rows.empty_row`: the study's and the Flower server's);
``round``: added by the Flower server to every row of a federation; ``server``: added by the
Flower server to some rows of a federation; ``provenance``: added to every row of a
``results.csv`` the Flower server writes (versions and device)."""
REPORT_SECTIONS = (
    "merge gap",
    "barriers",
    "client paths",
    "agreement",
    "LEWC",
    "temperature",
    "mechanism",
)
"""The order of ``report.md``'s per-method mean tables: section by section, each section's
columns in table order."""


@dataclass(frozen=True)
class Column:
    """One results column (see the module docstring)."""

    name: str
    measures: str
    """What it measures, one line (the heading of its table in ``report.md``)."""
    applies: str
    """Which cells and methods get a value (elsewhere NaN or an empty string)."""
    definition: str
    """How it is computed (Markdown)."""
    kind: str = "number"
    source: str = "row"
    report_table: str = ""
    """The section of ``report.md``'s per-method mean tables (:data:`REPORT_SECTIONS`) the
    column is averaged in; empty: none."""

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"column name {self.name!r}: allowed: a Python identifier")
        for field, value, allowed in (
            ("kind", self.kind, KINDS),
            ("source", self.source, SOURCES),
            ("report_table", self.report_table, ("", *REPORT_SECTIONS)),
        ):
            if value not in allowed:
                raise ValueError(
                    f"column {self.name!r}: {field} = {value!r}; allowed: "
                    f"{', '.join(repr(a) for a in allowed)}"
                )

    @property
    def is_string(self) -> bool:
        """Whether the column holds text (``text`` and ``JSON`` kinds)."""
        return self.kind != "number"


def check_unique(columns: Iterable[Column]) -> None:
    """``ValueError`` naming the first column name declared twice."""
    seen: set[str] = set()
    for column in columns:
        if column.name in seen:
            raise ValueError(f"column {column.name!r} is declared twice")
        seen.add(column.name)


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
PLAIN_CHAINS = "; plain chains only (NaN/empty for a residual network: `lewc_undefined_reason`)"


def _prediction_scope(key: str, at: str) -> str:
    """Where a LEWC/LLFC column applies: LEWC's own quantities need a plain chain."""
    return AT[at][1] + (PLAIN_CHAINS if key.startswith("lewc_") else "")


def _prediction_layer_columns() -> tuple[Column, ...]:
    """``{key}_layers{at}``: per layer of the model's ``layer_names``, JSON lists."""
    return tuple(
        Column(
            f"{key}_layers{at}",
            f"{PREDICTIONS[key][0]}{AT[at][0]}, per layer",
            _prediction_scope(key, at),
            f"per layer `l` (JSON list), {AT[at][2]}: {PREDICTIONS[key][1]}",
            kind="JSON",
        )
        for at in AT
        for key in PREDICTION_KEYS
    )


def _prediction_mean_columns() -> tuple[Column, ...]:
    """``{key}_mean{at}``: the mean over layers of the errors and cosines."""
    return tuple(
        Column(
            f"{key}_mean{at}",
            f"{PREDICTIONS[key][0]}{AT[at][0]}"
            f"{' (combined weights)' if not at and 'error' in key else ''}, mean over layers",
            _prediction_scope(key, at),
            f"mean over layers of `{key}_layers{at}`",
            report_table="LEWC" if "error" in key else "",
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
BARRIER_METRICS = {
    "accuracy": ("Accuracy barrier", "", "accuracy"),
    "loss": ("Loss barrier", ", raw logits", "NLL of the raw logits"),
    "loss_calibrated": ("Loss barrier", ", calibrated", "NLL at the temperature fitted at each l"),
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


def _barrier_columns() -> tuple[Column, ...]:
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
                    "two-client cells, diagnostics on; every merge method",
                    f"{rule.format(of=of)}; {BARRIER_PATH}",
                    report_table="barriers",
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


def _client_barrier_columns() -> tuple[Column, ...]:
    """``client_to_merge_path_loss_barrier_{half,max}[_calibrated]_{mean,worst}``."""
    columns = []
    for at, at_text in (("half", "at 1/2"), ("max", "maximum over lambda")):
        for cal, cal_text in (("", "raw logits"), ("_calibrated", "calibrated")):
            for over, over_text in (("mean", "mean over clients"), ("worst", "worst client")):
                reported = at == "half" and cal == "_calibrated"
                columns.append(
                    Column(
                        f"client_to_merge_path_loss_barrier_{at}{cal}_{over}",
                        f"Barrier {at_text} on the path client -> merge"
                        f"{SHAPE_NOTE if over == 'mean' else ''}, {cal_text}, {over_text}",
                        "cells of three or more clients, diagnostics on; every merge method",
                        f"{BARRIER_AT[at][1].format(of=f'loss ({cal_text})')} on each "
                        f"client's path, {over_text}: {CLIENT_PATH}",
                        report_table="client paths" if reported else "",
                    )
                )
    return tuple(columns)


def _endpoint_columns() -> tuple[Column, ...]:
    """The clients' own models: test accuracy (mean, min, max) and mean NLL."""
    own = "the clients' own models on the test split, unweighted"
    every = "every row (the same value on every row of a cell)"
    columns = [
        Column(f"endpoint_acc_{over}", f"{over} test accuracy of the clients", every, f"{own}")
        for over in ("mean", "min", "max")
    ]
    columns.append(
        Column("endpoint_nll_mean", "mean test NLL of the clients", every, f"{own}; raw logits")
    )
    columns.append(
        Column(
            "endpoint_acc_clients",
            "test accuracy of each client",
            every,
            f"{own}, one per merged client in partition order (JSON list; with mixed widths "
            "client `i` has the `i`-th width of `client_widths`)",
            kind="JSON",
        )
    )
    return tuple(columns)


def _metric_columns() -> tuple[Column, ...]:
    """The row's own model on the test split."""
    every = "every row"
    return (
        Column("accuracy", "test accuracy of the row's model", every, "top-1 accuracy"),
        Column(
            "nll",
            "test NLL at the row's temperature",
            every,
            "`nll_raw` for raw rows, `nll_calibrated` for `_t` rows",
        ),
        Column(
            "ece",
            "test ECE at the row's temperature",
            every,
            "`ece_raw` for raw rows, `ece_calibrated` for `_t` rows",
        ),
        Column(
            "temperature",
            "the row's softmax temperature",
            every,
            "1 for raw rows; for `_t` rows the temperature `T` fitted on the server split "
            "(`p(y|x) = softmax(f(x) / T)`; `T` never changes the accuracy)",
        ),
        Column("nll_raw", "test NLL at T = 1", every, "filled for raw and `_t` rows"),
        Column("ece_raw", "test ECE at T = 1", every, "filled for raw and `_t` rows"),
        Column(
            "nll_calibrated",
            "test NLL at the server-fitted T",
            every,
            "filled for raw and `_t` rows",
        ),
        Column(
            "ece_calibrated",
            "test ECE at the server-fitted T",
            every,
            "filled for raw and `_t` rows",
        ),
    )


def _temperature_columns() -> tuple[Column, ...]:
    """Server-fitted temperatures and their ratios."""
    every = "every row"
    return (
        Column(
            "endpoint_temperature_mean",
            "mean server-fitted T of the clients",
            every,
            "mean over the clients of their own models' server-fitted T",
        ),
        Column(
            "logit_ensemble_temperature",
            "server-fitted T of the logit ensemble",
            every,
            "T fitted on the server split for `softmax(sum_i w_i z_i / T)`",
        ),
        Column(
            "merge_temperature",
            "server-fitted T of the merge",
            "merge rows (raw rows too)",
            "T fitted on the server split for the merged model",
        ),
        Column(
            "temperature_ratio_endpoints",
            "merge T / the clients' mean T",
            "merge rows",
            "`merge_temperature / endpoint_temperature_mean`",
        ),
        Column(
            "temperature_ratio_logit_ensemble",
            "Fitted T of the merge / fitted T of the logit ensemble (measured)",
            "merge rows",
            "`merge_temperature / logit_ensemble_temperature`; if the merged logits are `c` "
            "times the logit ensemble's, exactly `c`",
            report_table="temperature",
        ),
        Column(
            "lewc_temperature_ratio",
            "LEWC's prediction of that T ratio, ||sum w^L z|| / ||sum w z||",
            "merge rows, diagnostics on, plain chains (NaN where LEWC is undefined)",
            "`||sum_i w_i^L z_i|| / ||sum_i w_i z_i||` at the logits (`N^(1-L)` at equal "
            "weights; the last entry of `lewc_norm_ratio_layers`)",
            report_table="temperature",
        ),
    )


def _merge_gap_columns() -> tuple[Column, ...]:
    """The row's model against the unweighted mean of the endpoints (any number of clients)."""
    applies = "every merge and reference row, any number of clients"
    return (
        Column(
            "merge_gap_accuracy",
            "Merge gap, accuracy (mean endpoint accuracy - merged accuracy)",
            applies,
            "`mean_i A_i - A` (`endpoint_acc_mean - accuracy`)",
            report_table="merge gap",
        ),
        Column(
            "merge_gap_loss",
            "Merge gap, loss (merged NLL - mean endpoint NLL), raw logits",
            applies,
            "`L_raw - mean_i L_i,raw` (`nll_raw - endpoint_nll_mean`)",
            report_table="merge gap",
        ),
        Column(
            "merge_gap_loss_calibrated",
            "Merge gap, loss, each model with its fitted temperature",
            "merge rows and `logit_ensemble`, any number of clients",
            "`nll_calibrated` minus the mean of the clients' calibrated NLLs (each model with "
            "its own server-fitted temperature)",
            report_table="merge gap",
        ),
    )


def _mechanism_columns() -> tuple[Column, ...]:
    """LEWC scope, logit shrinkage, orthogonality and the per-layer mechanism columns."""
    diagnostics = "diagnostics on, two or more clients"
    return (
        Column(
            "logit_norm_ratio",
            "Logit norm of the merge / endpoints' (LEWC: shrinks with depth)",
            diagnostics,
            "mean logit norm of the evaluated merge over the endpoints' (weighted)",
            report_table="mechanism",
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


def _layer_mechanism_columns() -> tuple[Column, ...]:
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
            )
            for cal, text in (("", "raw logits"), ("_calibrated", "calibrated"))
        ),
    )


def _ensemble_columns() -> tuple[Column, ...]:
    """The two reference ensembles and the row's agreement with them."""
    every = "every row (the same value on every row of a cell)"
    agreement = "the fraction of test inputs on which the row's model predicts the same class as "
    return (
        Column(
            "ensemble_acc",
            "test accuracy of the probability ensemble",
            every,
            "`sum_i w_i softmax(z_i)` (row `ensemble`; N forward passes)",
        ),
        Column(
            "ensemble_nll",
            "test NLL of the probability ensemble",
            every,
            "`sum_i w_i softmax(z_i)` (row `ensemble`)",
        ),
        Column(
            "logit_ensemble_acc",
            "test accuracy of the logit ensemble",
            every,
            "`softmax(sum_i w_i z_i)` (row `logit_ensemble`): what LEWC likens the merge to "
            "(scaled logits, same argmax), not the probability ensemble",
        ),
        Column(
            "agreement_prob_ensemble",
            "Top-1 agreement with the probability ensemble (test split)",
            "every row",
            agreement + "the probability ensemble",
            report_table="agreement",
        ),
        Column(
            "agreement_logit_ensemble",
            "Top-1 agreement with the logit ensemble (test split)",
            "every row",
            agreement + "the logit ensemble",
            report_table="agreement",
        ),
    )


def _lewc_scope_columns() -> tuple[Column, ...]:
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
            "single depth per layer); empty where LEWC is defined",
            kind="text",
        ),
    )


ROUND_COLUMNS_DECLARED = (
    Column(
        "clients_survived",
        "clients merged",
        "federation rows",
        "the clients whose training reply was merged",
        source="round",
    ),
    Column(
        "clients_failed",
        "the clients left out, with reasons",
        "federation rows",
        '`"node N (partition P): reason; ..."` for the training-round replies dropped and the '
        "clients left out by the alignment query",
        kind="text",
        source="round",
    ),
    Column(
        "clients_dropped",
        "distinct clients with any reply dropped",
        "federation rows",
        "clients with a training or query reply dropped by the screen of "
        "`fedlmc.strategies.screening`, a timeout or an error (a client dropped only from a query "
        "after the merge stays merged)",
        source="round",
    ),
    Column(
        "clients_dropped_reasons",
        "why each dropped client was dropped",
        "federation rows",
        '`"node N (partition P): [QUERY reply:] reason; ..."` for each dropped client',
        kind="text",
        source="round",
    ),
    Column(
        "bytes_sent_by_clients",
        "bytes the clients sent",
        "federation rows",
        "the tensor bytes of their trained weights, every round, plus the payload of every query "
        "reply (calibration, statistics and alignment rounds: tensors and 8 bytes per metric "
        "number)",
        source="round",
    ),
    Column(
        "rounds",
        "message rounds with the clients",
        "federation rows",
        "training rounds plus query rounds (`compare` rows: 1, their methods run on the server)",
        source="round",
    ),
    Column(
        "train_seconds",
        "the clients' training time",
        "federation rows",
        "sum of the surviving clients' training times (every round for FedAvg); NaN when the "
        "screen removed a client's reported time (not finite, below 0 or above 1e7 s)",
        source="round",
    ),
    Column(
        "round_seconds",
        "wall time of the strategy",
        "federation rows",
        "seconds from the strategy's start to its result",
        source="round",
    ),
    Column(
        "client_widths",
        "every client's width multiplier",
        "federation rows",
        "the width multiplier of each client, in partition order, comma-separated (e.g. "
        '`"0.5,1,2,4"`): the run config\'s `client-widths`, or `width` for every client when it is '
        "empty",
        kind="text",
        source="round",
    ),
    Column(
        "server_width",
        "width multiplier of the merged model",
        "federation rows",
        "the run config's `server-width`, or the widest client's width when it is 0; clients "
        "narrower than it are embedded into it before the merge",
        source="round",
    ),
    Column(
        "temperature_server_split",
        "T the server split gives for the merge",
        "`_t` rows of the `average`/`aligned` strategies",
        "the temperature fitted on the server split for the same merged model, beside "
        "`temperature` (fitted where `calibration` says: with `federated`, on the clients' "
        "held-out data)",
        source="server",
    ),
    Column(
        "secagg_error_bound",
        "largest difference from the clear average SecAgg+'s quantisation allows",
        '`average` rows of a `secure-aggregation = "secagg+"` run',
        "\\(3 N c / (Q \\sum_i n_i / M)\\): \\(N\\) clients, clipping range \\(c\\), "
        "quantisation range \\(Q = 2^{22}\\), \\(M\\) = SecAgg+'s `max_weight` (the "
        "training pool's size), \\(n_i\\) the clients' examples: every merged value is "
        "within it of the clear weighted average (`fedlmc.strategies.secure`)",
        source="server",
    ),
)

PROVENANCE_COLUMNS = (
    *(
        Column(
            f"{package}_version",
            f"the {package} version",
            "rows of a results.csv",
            f"the installed {package} package's version in the process that wrote the row",
            kind="text",
            source="provenance",
        )
        for package in ("fedlmc", "flwr", "torch")
    ),
    Column(
        "device_used",
        "the device that evaluated the row",
        "rows of a results.csv",
        "the resolved server device, e.g. `cpu: x86_64 (2 cores)` (`device` is the run-config key)",
        kind="text",
        source="provenance",
    ),
)

COMMON_COLUMNS: tuple[Column, ...] = (
    Column(
        "method",
        "the evaluated model",
        "every row",
        "a merge method `m` (temperature 1), `m_t` (the same merge with the server-fitted "
        "temperature), a reference ensemble (`ensemble`, `logit_ensemble`) or `fedavg`",
        kind="text",
    ),
    Column("num_clients", "clients merged", "every row", "the clients whose models the row uses"),
    Column(
        "server_sees",
        "what the row's merge rule needs the server to see",
        "every row",
        "the least the server must see of the clients to compute the row's merge, the "
        "method's `server_sees` declaration (`fedlmc.merging.server_sees`): `sum` (secure "
        "aggregation can compute it), `each model's statistics`, `one model and permutations` "
        "or `each model` (the ensembles); `fedavg`: `sum` (each round). A property of the rule, "
        "not of the run: a run in the clear shows the server every model (the "
        "`secure-aggregation` column says how the run was run)",
        kind="text",
    ),
    *_endpoint_columns(),
    *_ensemble_columns()[:3],
    *_metric_columns(),
    *_ensemble_columns()[3:],
    *_temperature_columns(),
    *_merge_gap_columns(),
    *_barrier_columns(),
    *_client_barrier_columns(),
    *_lewc_scope_columns(),
    *_prediction_mean_columns(),
    *_mechanism_columns(),
    *_prediction_layer_columns(),
    *_layer_mechanism_columns(),
    Column(
        "merge_seconds",
        "time of the merge",
        "merge rows",
        "alignment + averaging + BatchNorm re-estimation or REPAIR, seconds",
    ),
    Column(
        "curve",
        "the two-client interpolation path",
        "two-client cells, diagnostics on",
        "JSON `{lam, accuracy, nll, nll_calibrated}` of the path of the barrier columns",
        kind="JSON",
    ),
    Column(
        "temperature_path",
        "Fitted T at each lambda of the two-client path (measured, temperature units)",
        "two-client cells, diagnostics on, methods with a path (empty elsewhere)",
        "JSON list, one entry per `lam` of `curve` (same order): the T fitted on the server split "
        "for the model at `theta(l)` of the barrier columns' path (post-processed like the merge); "
        "the entries at `l = 1` and `l = 0` are client 0's and the aligned client 1's own T (for "
        "BatchNorm models, after re-estimation)",
        kind="JSON",
    ),
    Column(
        "temperature_path_lewc",
        "LEWC's predicted T at each lambda, l^L T(1) + (1 - l)^L T(0) (temperature units)",
        "as `temperature_path`, where LEWC is defined (empty where `lewc_undefined_reason` "
        "gives why)",
        "JSON list on `temperature_path`'s grid: `l^L T(1) + (1 - l)^L T(0)` with `T(1), T(0)` "
        "`temperature_path`'s endpoint entries and `L` the number of Linear/Conv layers; equal "
        "to them at the endpoints, `(l^L + (1 - l)^L) T` when `T(0) = T(1) = T` "
        "(`fedlmc.analysis.paths.lewc_temperature_path`)",
        kind="JSON",
    ),
    *ROUND_COLUMNS_DECLARED,
    *PROVENANCE_COLUMNS,
)
"""Every column but those the merge methods declare, in ``results.csv`` order."""
check_unique(COMMON_COLUMNS)
