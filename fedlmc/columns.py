r"""The results-column table: every column of ``results.csv`` declared once.

A :class:`Column` holds a column's name, what it measures (one line, also the heading of its
table in ``report.md``), which cells and methods it applies to, its definition (Markdown text),
its kind (a number, text, or a JSON list/matrix held as text), the code that fills it
(``source``) and the report section it is averaged in, if any. Everything that lists columns
derives from these declarations: the row schema (:mod:`fedlmc.study.rows`:
:data:`~fedlmc.study.rows.COLUMNS`, the string columns, the Flower server's round columns), the
validation of ``results.csv`` (:mod:`fedlmc.simulations.records.results_file`), the docs' columns
table (:func:`fedlmc.study.rows.columns_markdown`) and the per-method mean tables of ``report.md``.
A
merge method declares the columns only it fills next to its registration (``register_method(...,
columns=...)``, e.g. ``auto_choice``).

Notation: metrics are on the test split; :math:`A` is accuracy, :math:`L` the mean NLL,
:math:`w_i` the clients' normalised weights, :math:`z_i` client :math:`i`'s logits,
:math:`f_l(\theta)` layer :math:`l`'s hidden features, :math:`T` a fitted softmax temperature.
Imports nothing outside these column modules.

The declaration itself (:class:`Column`, :data:`KINDS`, :data:`SOURCES`, :data:`REPORT_SECTIONS`)
is :mod:`fedlmc.column_schema`; the column families are :mod:`fedlmc.columns_metrics` (a
merge's quality) and :mod:`fedlmc.columns_mechanism` (LEWC, LLFC, barriers); this module
assembles them, with the round and provenance columns, into :data:`COMMON_COLUMNS`. Every name
of the three is importable from here.
"""

from __future__ import annotations

from fedlmc.column_schema import KINDS, REPORT_SECTIONS, SOURCES, Column, check_unique
from fedlmc.columns_mechanism import (
    PREDICTION_KEYS,
    PREDICTION_MEAN_KEYS,
    barrier_family,
    client_barrier_family,
    layer_mechanism_family,
    lewc_scope_family,
    mechanism_family,
    prediction_layer_family,
    prediction_mean_family,
)
from fedlmc.columns_metrics import (
    ENSEMBLE_ACCURACIES,
    endpoint_family,
    ensemble_family,
    merge_gap_family,
    metric_family,
    temperature_family,
)

__all__ = [
    "COMMON_COLUMNS",
    "KINDS",
    "PREDICTION_KEYS",
    "PREDICTION_MEAN_KEYS",
    "PROVENANCE_COLUMNS",
    "RENAMED_COLUMNS",
    "REPORT_SECTIONS",
    "ROUND_COLUMNS_DECLARED",
    "SOURCES",
    "Column",
    "check_unique",
]


RENAMED_COLUMNS = {"logit_norm_ratio": "logit_norm_ratio_client_norms"}
"""Old column name -> the column it is now, for results written before the rename (read back
under the new name): ``logit_norm_ratio`` divided by the clients' mean logit norm, not by the
norm of their mean logits that LEWC predicts against (issue 53)."""


ROUND_COLUMNS_DECLARED = (
    Column(
        "clients_survived",
        "clients merged",
        "federation rows",
        "the clients whose training reply was merged (a `compare` row of a method that queries "
        "the clients: less those its queries lost)",
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
        "after the merge stays merged; a `compare` row counts the clients its own method's "
        "queries lost, and those of earlier queries, which its method no longer asked)",
        source="round",
    ),
    Column(
        "clients_dropped_reasons",
        "why each dropped client was dropped",
        "federation rows",
        '`"node N (partition P): [QUERY reply:] reason; ..."` for each dropped client; under '
        "SecAgg+ `\"node N: SecAgg+ stage 'S': reason; ...\"` (the server never learns a dropped "
        "node's partition)",
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
        "held-out data; with `lewc` not fitted but LEWC's prediction `sum_i w_i^L`)",
        source="server",
    ),
    Column(
        "secagg_error_bound",
        "largest difference from the clear merge SecAgg+'s quantisation allows",
        'rows of a `secure-aggregation = "secagg+"` run',
        "\\(3 N c / (Q S)\\) for the plain average, \\(S = \\sum_i n_i / M\\): \\(N\\) "
        "clients, clipping range \\(c\\), quantisation range \\(Q = 2^{22}\\), \\(M\\) = "
        "SecAgg+'s `max_weight` (the training pool's size), \\(n_i\\) the clients' examples: "
        "every merged value is within it of the clear weighted average "
        "(`fedlmc.strategies.secure`); for `average_lewc_bias` the largest over its layers of "
        "\\((N c / (Q S))(2 S^{1-l} + l)\\) (`fedlmc.merging.sum_form.error_bound`)",
        source="server",
    ),
    Column(
        "dp_epsilon",
        "epsilon of the DP row's one release, at delta 1e-5",
        "`average` rows of a `dp` run (the noisy average of clipped updates)",
        "\\(\\varepsilon\\) at \\(\\delta = 10^{-5}\\) of one Gaussian release with noise "
        "multiplier `dp-noise-multiplier`, every client taking part (no sampling "
        "amplification), from Flower's RDP accountant; `inf` with noise multiplier 0 (no "
        "privacy); NaN where the accountant is not installed (Flower's optional "
        '`dp-accounting`, `pip install "flwr[dp]"`) and in rows without DP',
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
        "temperature), a reference ensemble (`ensemble`, `ensemble_equal`, `ensemble_calibrated`, "
        "`logit_ensemble`: `fedlmc methods` says each) or `fedavg`",
        kind="text",
    ),
    Column("num_clients", "clients merged", "every row", "the clients whose models the row uses"),
    Column(
        "server_sees",
        "what the row's merge rule needs the server to see",
        "every row",
        "the least the server must see of the clients to compute the row's merge, the "
        "method's `server_sees` declaration (`fedlmc.study.server_sees`): `sum` (secure "
        "aggregation can compute it), `each model's statistics`, `one model and permutations` "
        "or `each model` (the ensembles); `fedavg`: `sum` (each round). A property of the rule, "
        "not of the run: a run in the clear shows the server every model (the "
        "`secure-aggregation` column says how the run was run)",
        kind="text",
    ),
    *endpoint_family(),
    *ensemble_family()[:ENSEMBLE_ACCURACIES],
    *metric_family(),
    *ensemble_family()[ENSEMBLE_ACCURACIES:],
    *temperature_family(),
    *merge_gap_family(),
    *barrier_family(),
    *client_barrier_family(),
    *lewc_scope_family(),
    *prediction_mean_family(),
    *mechanism_family(),
    *prediction_layer_family(),
    *layer_mechanism_family(),
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
        methods="on_path",
    ),
    Column(
        "temperature_path",
        "Fitted T at each lambda of the two-client path (measured, temperature units)",
        "two-client cells, diagnostics on",
        "JSON list, one entry per `lam` of `curve` (same order): the T fitted on the server split "
        "for the model at `theta(l)` of the barrier columns' path (post-processed like the merge); "
        "the entries at `l = 1` and `l = 0` are client 0's and the aligned client 1's own T (for "
        "BatchNorm models, after re-estimation)",
        kind="JSON",
        methods="on_path",
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
        methods="on_path",
    ),
    *ROUND_COLUMNS_DECLARED,
    *PROVENANCE_COLUMNS,
)
"""Every column but those the merge methods declare, in ``results.csv`` order."""
check_unique(COMMON_COLUMNS)
