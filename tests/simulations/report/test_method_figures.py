"""The field-methods figure (simulations/report/method_figures.py) on constructed rows: one panel
per setting of the clients (not per seed, nor per merge key such as the secure cells'
``strategy``), the methods in their order, a ``_t`` row counted once, and when the registered
``accuracy_by_method`` figure is drawn."""

from __future__ import annotations

import pandas as pd
import pytest

from fedlmc.simulations.report.figure_table import FIGURE_TABLE, FigureInputs
from fedlmc.simulations.report.method_figures import (
    _methods,
    _one_row_per_merge,
    best_ensemble,
    has_field_methods,
    setting_panels,
)

SETTINGS = {"dpi": 40, "error-bars": "std", "title": ""}
CLEAR = ("average", "average_t", "weight_matching_t", "regmean", "regmean_t", "fisher", "ensemble")


def _rows() -> pd.DataFrame:
    """Two widths x two inits x two seeds of compare cells, and a secure fisher cell for each:
    accuracy a known function of the setting, the method and the seed."""
    rows = []
    for width in (1.0, 4.0):
        for init in ("shared", "independent"):
            for seed in (0, 1):
                base = 0.5 + width / 20 + (0.1 if init == "shared" else 0.0) + 0.01 * seed
                cell = f"{width}-{init}-{seed}"
                common = {"seed": seed, "width": width, "init": init, "num-clients": 2}
                common["base-hidden"] = 128
                for i, method in enumerate(CLEAR):
                    rows.append(
                        {**common, "cell_id": cell, "method": method, "accuracy": base + 0.01 * i}
                        | {"strategy": "compare", "secure-aggregation": "off"}
                        | {"endpoint_acc_mean": 0.9}
                    )
                for method in ("fisher", "fisher_t"):
                    rows.append(
                        {**common, "cell_id": cell + "-s", "method": method, "accuracy": base}
                        | {
                            "strategy": "aligned",
                            "secure-aggregation": "secagg+",
                            "align": "fisher",
                        }
                    )
    return pd.DataFrame(rows)


def test_one_panel_per_setting_not_per_seed_or_merge_key():
    panels = setting_panels(_rows())
    assert len(panels) == 4
    assert [title for title, _ in panels] == [
        "128 units, independent init",
        "128 units, shared init",
        "512 units, independent init",
        "512 units, shared init",
    ]
    assert all(len(group["seed"].unique()) == 2 for _, group in panels)


def test_methods_in_order_and_a_t_row_counted_once():
    rows = _rows()
    assert _methods(rows) == ["average", "weight_matching", "fisher", "regmean"]
    merges = _one_row_per_merge(rows)
    per_cell = merges.groupby(["cell_id", "_base"]).size()
    assert (per_cell == 1).all()
    assert set(merges[merges["_secure"]]["_base"]) == {"fisher"}


def test_the_figure_is_drawn_when_two_field_methods_ran(tmp_path):
    rows = _rows()
    assert has_field_methods(rows)
    figure = FIGURE_TABLE.get("accuracy_by_method")
    inputs = FigureInputs.of(rows, SETTINGS)
    assert figure.drawn_when(inputs)
    path = figure.draw(inputs, tmp_path / figure.file)
    assert path.stat().st_size > 0
    plain = rows[~rows["method"].str.startswith(("fisher", "regmean"))]
    assert not has_field_methods(plain)
    assert not figure.drawn_when(FigureInputs.of(plain, SETTINGS))


def test_the_reference_line_is_the_best_ensemble_of_the_panel():
    """The dashed line is the reference ensemble with the highest mean accuracy over the seeds
    (here the equal-weight one, above the sample-count-weighted ``ensemble``), never a merge."""
    rows = pd.DataFrame(
        {
            "method": ["ensemble", "ensemble_equal", "ensemble_calibrated", "regmean"] * 2,
            "accuracy": [0.60, 0.70, 0.66, 0.90, 0.62, 0.74, 0.64, 0.95],
            "seed": [0] * 4 + [1] * 4,
        }
    )
    name, accuracy = best_ensemble(rows)
    assert name == "ensemble_equal" and accuracy == pytest.approx(0.72)
    assert best_ensemble(rows[rows["method"] == "regmean"]) is None
