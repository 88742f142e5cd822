r"""The results columns of a merge's quality: endpoints, metrics, ensembles, T, merge gap.

Column families (functions returning :class:`~fedlmc.column_schema.Column` tuples) that
:mod:`fedlmc.columns` assembles into the one column table, in ``results.csv`` order. Notation as
in :mod:`fedlmc.columns`. Imports nothing but the column declaration.
"""

from __future__ import annotations

from fedlmc.column_schema import Column


def endpoint_family() -> tuple[Column, ...]:
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


def metric_family() -> tuple[Column, ...]:
    """The row's own model on the test split."""
    every = "every row"
    return (
        Column("accuracy", "test accuracy of the row's model", every, "top-1 accuracy"),
        Column(
            "nll",
            "test NLL at the row's temperature",
            every,
            "`nll_raw` for raw rows, `nll_calibrated` for `_t` rows and `ensemble_calibrated`",
        ),
        Column(
            "ece",
            "test ECE at the row's temperature",
            every,
            "`ece_raw` for raw rows, `ece_calibrated` for `_t` rows and `ensemble_calibrated`",
        ),
        Column(
            "temperature",
            "the row's softmax temperature",
            every,
            "1 for raw rows; for `_t` rows the temperature `T` fitted on the server split "
            "(`p(y|x) = softmax(f(x) / T)`; `T` never changes the accuracy); a strategy's "
            "`_t` row: its `calibration`'s `T` (`lewc`: predicted, `sum_i w_i^L`); NaN for "
            "`ensemble_calibrated` (each member at its own `T_i`)",
        ),
        Column(
            "temperature_at_bound",
            "whether the row's fitted T is an end of the fit's range",
            "`_t` rows (empty on raw rows and where T is inside the range)",
            "`lower` when `temperature` is the fit's lower clamp `T_MIN = 0.001`: the NLL still "
            "fell as T -> 0, because the merged model classifies the calibration data "
            "correctly with a margin, so no finite T is best; `upper` at `T_MAX = 1000`: the "
            "logits carry no usable information about the labels and the NLL is least at "
            "near-uniform predictions (a merge at chance, heavy noise); empty otherwise. At a "
            "bound T is the range's end, not a fitted value (`fedlmc.study.flags`)",
            kind="text",
        ),
        Column(
            "at_chance",
            "1 when the test accuracy is no better than guessing",
            every,
            "1 when `accuracy <= 1/C + 2 sqrt((1/C)(1 - 1/C)/n)` (`C` classes, `n` test "
            "samples: within two binomial standard errors of chance, or below), 0 otherwise "
            "(`fedlmc.study.flags`)",
        ),
        Column("nll_raw", "test NLL at T = 1", every, "filled for raw and `_t` rows"),
        Column("ece_raw", "test ECE at T = 1", every, "filled for raw and `_t` rows"),
        Column(
            "nll_calibrated",
            "test NLL at the server-fitted T",
            every,
            "filled for raw and `_t` rows; for `ensemble_calibrated` each member at its own "
            "server-fitted `T_i`",
        ),
        Column(
            "ece_calibrated",
            "test ECE at the server-fitted T",
            every,
            "filled for raw and `_t` rows; for `ensemble_calibrated` each member at its own "
            "server-fitted `T_i`",
        ),
        Column(
            "merged_parameters_ratio",
            "parameters the row's model needs / the template's (one client's at its width)",
            "merge and reference rows of the study",
            "1 for every merge that is a state dict of the template; `1 + (N - 1) P_early / P` "
            "for `preserve_first` and `weight_matching_preserve_first` (`P_early`: the "
            "parameters of the first `k + 1` = 2 layers, whose outputs every client computes; "
            "`P`: the model's); `N` for the reference ensembles (`ensemble`, `ensemble_equal`, "
            "`ensemble_calibrated`, `logit_ensemble`: every client's model runs)",
        ),
    )


def temperature_family() -> tuple[Column, ...]:
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


def merge_gap_family() -> tuple[Column, ...]:
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
            "merge rows, `logit_ensemble` and `ensemble_calibrated`, any number of clients",
            "`nll_calibrated` minus the mean of the clients' calibrated NLLs (each model with "
            "its own server-fitted temperature)",
            report_table="merge gap",
        ),
    )


ENSEMBLE_ACCURACIES = 5
"""The first columns of :func:`ensemble_family`: the reference ensembles' accuracy and NLL
(``results.csv`` puts them before the row's own metrics, the agreements after)."""


def ensemble_family() -> tuple[Column, ...]:
    """The reference ensembles and the row's agreement with the probability and logit ones."""
    every = "every row (the same value on every row of a cell)"
    agreement = "the fraction of test inputs on which the row's model predicts the same class as "
    return (
        Column(
            "ensemble_acc",
            "test accuracy of the sample-count-weighted probability ensemble",
            every,
            "`sum_i w_i softmax(z_i)` at T = 1 (row `ensemble`; N forward passes)",
        ),
        Column(
            "ensemble_nll",
            "test NLL of the sample-count-weighted probability ensemble",
            every,
            "`sum_i w_i softmax(z_i)` at T = 1 (row `ensemble`)",
        ),
        Column(
            "ensemble_equal_acc",
            "test accuracy of the equal-weight probability ensemble",
            every,
            "`(1/N) sum_i softmax(z_i)` at T = 1 (row `ensemble_equal`)",
        ),
        Column(
            "ensemble_calibrated_acc",
            "test accuracy of the per-member calibrated probability ensemble",
            every,
            "`sum_i w_i softmax(z_i / T_i)`, `T_i` client `i`'s own temperature fitted on the "
            "server split (row `ensemble_calibrated`)",
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
