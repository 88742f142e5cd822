"""The reviewers' study tables of report.md (issue 34, ``simulations/report/study_tables.py``) on
constructed rows: the settings a table keeps apart, mean ± std over seeds with the spread named,
per-cell values counted once per cell, the mean stable rank, when each table appears, and the
Table 1 layout's spread (``report_data.table1``)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from fedlmc.simulations.report.data import mean_spread_text, table1
from fedlmc.simulations.report.markdown import markdown_table
from fedlmc.simulations.report.study_tables import (
    barrier_table,
    mean_stable_rank,
    setting_keys,
    spread_note,
    study_sections,
    temperature_table,
    weight_decay_table,
)

REFIT = "loss barrier, T refitted per lambda"


def rows_of(
    decays=(3e-3,), widths=(1.0, 4.0), seeds=(0, 1), biases=(False,), depth=3
) -> pd.DataFrame:
    """Two-client cells, methods average, average_t, weight_matching: every value a known
    function of the setting and the seed (seed 0 gives ``base``, seed 1 ``base + 0.2``)."""
    rows = []
    for decay in decays:
        for width in widths:
            for bias in biases:
                for seed in seeds:
                    cell = f"{decay}-{width}-{bias}-{seed}"
                    base = width / 10 + (0.5 if bias else 0.0) + 0.2 * seed
                    for method in ("average", "average_t", "weight_matching"):
                        rows.append(
                            {
                                "cell_id": cell,
                                "method": method,
                                "seed": seed,
                                "width": width,
                                "weight-decay": decay,
                                "bias": bias,
                                "depth": depth,
                                "num-clients": 2,
                                "temperature": base if method == "average_t" else 1.0,
                                "endpoint_temperature_mean": 2.0 + seed,
                                "temperature_ratio_logit_ensemble": base,
                                "lewc_temperature_ratio": 0.125,
                                "loss_barrier_half": base + 1.0,
                                "loss_barrier_half_calibrated": base
                                + (0.0 if method == "average" else -0.05),
                                "loss_barrier_max": base + 1.0,
                                "loss_barrier_max_calibrated": base,
                                "merge_gap_accuracy": base / 2,
                                "recip_orth_mean": 0.5,
                                "stable_rank_layers": json.dumps([width, 3 * width]),
                            }
                        )
    return pd.DataFrame(rows)


def test_mean_stable_rank_is_the_mean_over_layers_and_nan_without_it():
    rows = pd.DataFrame({"stable_rank_layers": ["[2.0, 4.0, 9.0]", "", "[]"]})
    ranks = mean_stable_rank(rows)
    assert ranks[0] == pytest.approx(5.0)
    assert math.isnan(ranks[1]) and math.isnan(ranks[2])
    assert mean_stable_rank(pd.DataFrame({"x": [1]})).isna().all()


def test_mean_spread_text_names_the_spread_and_the_count_below_three_values():
    assert mean_spread_text(pd.Series([1.0, 3.0, 5.0]), "std") == "3.0000 ± 2.0000"
    assert mean_spread_text(pd.Series([1.0, 3.0, 5.0]), "sem") == f"3.0000 ± {2 / 3**0.5:.4f}"
    assert mean_spread_text(pd.Series([1.0, 3.0]), "std") == "2.0000 ± 1.4142 (n=2)"
    assert mean_spread_text(pd.Series([1.0, 3.0]), "none") == "2.0000 (n=2)"
    assert mean_spread_text(pd.Series([2.0, math.nan]), "std") == "2.0000 (n=1)"
    assert mean_spread_text(pd.Series([math.nan]), "std") == ""


def test_settings_keep_every_varying_key_but_the_seed_apart():
    rows = rows_of(decays=(0.0, 1e-2), biases=(False, True))
    assert setting_keys(rows) == ["weight-decay", "width", "bias"]
    table = barrier_table(rows, "std")
    assert len(table) == 2 * 2 * 2  # decays x widths x biases, seeds averaged
    # width 4, bias: base 0.4 + 0.5 (+ 0.2 for seed 1): mean 1.0, std 0.1414
    label = "weight-decay=0.01, width=4, bias=true"
    assert table.loc[label, "max over lambda, T refitted per lambda"] == "1.0000 ± 0.1414 (n=2)"
    assert table.loc[label, "loss barrier at 1/2, raw"] == "2.0000 ± 0.1414 (n=2)"


def test_a_per_cell_value_counts_once_per_cell_not_once_per_method():
    table = temperature_table(rows_of(widths=(1.0,)), "std")
    # clients' T 2.0 and 3.0 in the two cells: std 0.7071 (0.6124 if each method row counted)
    assert table.loc["width=1", "clients' T (mean)"] == "2.5000 ± 0.7071 (n=2)"
    assert table.loc["width=1", "T of average_t"] == "0.2000 ± 0.1414 (n=2)"
    lewc = table.loc["width=1", "average: LEWC's prediction of that ratio"]
    assert lewc == "0.1250 ± 0.0000 (n=2)"


def test_weight_decay_table_only_when_the_weight_decay_varies():
    assert weight_decay_table(rows_of(), "std").empty
    table = weight_decay_table(rows_of(decays=(0.0, 5e-4), widths=(4.0,)), "std")
    assert list(table.index) == ["weight-decay=0, width=4", "weight-decay=0.0005, width=4"]
    row = table.loc["weight-decay=0, width=4"]
    assert row["stable rank of the hidden weights (mean)"] == "8.0000 ± 0.0000 (n=2)"
    assert row["average: calibrated barrier at 1/2"] == "0.5000 ± 0.1414 (n=2)"
    assert row["weight matching: calibrated barrier at 1/2"] == "0.4500 ± 0.1414 (n=2)"


def test_spread_is_named_in_each_heading():
    three = rows_of(seeds=(0, 1, 2), decays=(0.0, 1e-3))
    assert spread_note(three, "std") == "mean ± std over 3 seeds"
    assert spread_note(three, "none") == "mean over 3 seeds"
    assert spread_note(rows_of(seeds=(0,)), "std") == "one seed"
    lines = study_sections(three, "std", markdown_table)
    headings = [line for line in lines if line.startswith("## ")]
    assert headings == [
        "## Temperatures as numbers, per setting (mean ± std over 3 seeds)",
        "## The plain average's barriers per setting (mean ± std over 3 seeds)",
        "## Barriers against weight decay (mean ± std over 3 seeds)",
    ]


def test_no_table_without_its_columns():
    rows = rows_of().drop(columns=["loss_barrier_max", "temperature"])
    assert barrier_table(rows, "std").empty
    assert temperature_table(rows, "std").empty
    assert study_sections(rows, "std", markdown_table) == []


def test_table1_shows_the_spread_over_seeds_when_asked():
    rows = rows_of(widths=(4.0,))
    shown = table1(rows, "std")
    assert shown.loc[4.0, f"no permutation: {REFIT}"] == "0.5000 ± 0.1414 (n=2)"
    assert shown.loc[4.0, f"weight matching: {REFIT}"] == "0.4500 ± 0.1414 (n=2)"
    means = table1(rows)
    assert means.loc[4.0, f"no permutation: {REFIT}"] == pytest.approx(0.5)
    one_seed = table1(rows_of(widths=(4.0,), seeds=(1,)), "std")
    assert one_seed.loc[4.0, f"no permutation: {REFIT}"] == "0.6000 (n=1)"
