"""Tables over results rows (:mod:`fedlmc.simulations.records.row_groups`): the keys that vary
where they apply, the labels that keep experiments apart, the method x width summary and a
cell's one-line summary."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fedlmc.simulations.config import run_schema
from fedlmc.simulations.records.row_groups import (
    applicable,
    cell_summary,
    split_labels,
    summary_table,
    varying_keys,
)


def rows() -> pd.DataFrame:
    """Two widths x two seeds x bias true/false, two methods each; ``alpha`` differs but does
    not apply (partition = iid); methods differs but never splits."""
    records = []
    for width in (0.5, 1.0):
        for seed in (0, 1):
            for bias in ("true", "false"):
                cid = f"{width}-{seed}-{bias}"
                for method, acc in (("average", 0.5), ("ensemble", 0.75)):
                    records.append(
                        {"cell_id": cid, "status": "ok", "width": width, "seed": seed}
                        | {"bias": bias, "partition": "iid", "alpha": 0.1 + seed}
                        | {"methods": f"m{seed}", "method": method}
                        | {"accuracy": acc + width / 10 + (0.01 if bias == "true" else 0.0)}
                    )
    return pd.DataFrame(records)


def test_varying_keys_are_those_that_vary_where_they_apply():
    assert varying_keys(rows()) == ["width", "bias", "seed"]  # in schema order
    assert "alpha" not in varying_keys(rows()) and "methods" not in varying_keys(rows())
    dirichlet = rows().assign(partition="dirichlet")
    assert "alpha" in varying_keys(dirichlet)


@pytest.mark.parametrize(
    "values",
    [
        [0.5, 0.5, 0.5],
        [0.0, -0.0],  # equal numbers, different texts
        [0.5, math.nan, 0.5],
        [math.nan, math.nan],
        [1, 1, 2],
        [7, 7],
        [True, True],
        [True, False],
        ["iid", "iid"],
        ["iid", "dirichlet"],
        ["iid", None, "iid"],
        [1, 1.0, True],  # equal objects, three texts
        ["1", 1],
        [],
    ],
    ids=repr,
)
def test_a_key_varies_exactly_when_its_values_differ_as_text(values):
    """The shortcut for columns of one value gives what comparing the texts gives, on the
    columns where the two could part: signed zeros, missing values, mixed types."""
    for series in (pd.Series(values), pd.Series(values, dtype=object)):
        table = rows().iloc[: len(values)].assign(seed=series.to_numpy())
        as_text = series.astype(str).nunique() > 1
        assert ("seed" in varying_keys(table)) == as_text, (series.dtype, as_text)


def test_a_missing_value_of_a_nullable_column_is_none_to_the_rules():
    """In nullable or Arrow columns a missing value is ``pd.NA``, which no rule can compare:
    the rules see None (as ``to_dict`` gives it), so ``alpha`` applies to the Dirichlet row
    only and, differing nowhere else, does not vary."""
    table = pd.DataFrame(
        {"partition": ["dirichlet", None, None], "alpha": [0.1, 0.2, 0.3], "method": ["a"] * 3}
    )
    for dtypes in ("numpy_nullable", "pyarrow"):
        typed = table.convert_dtypes(dtype_backend=dtypes)
        assert applicable(typed, {"alpha": run_schema()["alpha"]}) == {
            "alpha": [True, False, False]
        }
        assert "alpha" not in varying_keys(typed)


def test_split_labels_keep_apart_what_the_table_does_not_average_over():
    labels = split_labels(rows(), ["width"])
    assert set(labels) == {"bias=true", "bias=false"}
    assert split_labels(rows().query("bias == 'true'"), ["width"]) is None


def test_the_summary_is_the_mean_per_method_and_width_split_by_bias():
    table = summary_table(rows())
    assert list(table.columns) == [0.5, 1.0]
    assert list(table.index) == [
        "average (bias=false)",
        "average (bias=true)",
        "ensemble (bias=false)",
        "ensemble (bias=true)",
    ]
    assert math.isclose(table.loc["average (bias=true)", 1.0], 0.5 + 0.1 + 0.01)
    assert summary_table(rows().assign(status="failed")).empty


def test_a_cell_summary_is_one_line_with_each_method_or_the_failure():
    config = {"width": 0.5, "num-clients": 2, "client-widths": ""}
    cell = rows().iloc[:2]
    line = cell_summary({"width": 0.5, "seed": 0}, config, cell, 12.4)
    assert line == "width=0.5 clients=2 seed=0 | average=0.560 ensemble=0.810 (12 s)"
    failed = pd.DataFrame([{"status": "failed", "error": "ValueError: no"}])
    assert (
        cell_summary({}, config, failed, 3.0)
        == "width=0.5 clients=2 | FAILED: ValueError: no (3 s)"
    )
