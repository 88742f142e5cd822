"""The reviewers' study figures (issue 34, ``simulations/report/study_figures.py``) on constructed
rows: LEWC's closed form at equal weights, the weight-decay axis that holds 0, the lines kept
apart, and when ``barrier_vs_weight_decay`` and ``lewc_scale_vs_depth`` are drawn."""

from __future__ import annotations

import pandas as pd
import pytest

from fedlmc.simulations.report.figure_table import FIGURE_TABLE, FigureInputs
from fedlmc.simulations.report.study_figures import (
    even_positions,
    has_depth_study,
    has_weight_decay_study,
    lewc_closed_form,
    line_labels,
)
from tests.simulations.report.test_study_tables import rows_of

SETTINGS = {"dpi": 40, "error-bars": "std", "title": ""}
NAMES = ("barrier_vs_weight_decay", "lewc_scale_vs_depth")


def drawn(rows, folder) -> set[str]:
    """The study figures the registered predicates draw from ``rows`` (non-empty files)."""
    inputs = FigureInputs.of(rows, SETTINGS)
    figures = [FIGURE_TABLE.get(n) for n in NAMES]
    paths = [f.draw(inputs, folder / f.file) for f in figures if f.drawn_when(inputs)]
    return {p.stem for p in paths if p is not None and p.stat().st_size > 0}


def test_lewc_closed_form_is_n_to_the_one_minus_l():
    # depth 3 = 4 linear layers: 2 clients 2^-3 (LEWC's 0.125 at lambda = 1/2), 4 clients 4^-3
    assert lewc_closed_form(3, 2) == pytest.approx(0.125)
    assert lewc_closed_form(3, 4) == pytest.approx(1 / 64)
    # lambda^L + (1 - lambda)^L at lambda = 1/2 for two clients, any depth
    for depth in range(1, 7):
        assert lewc_closed_form(depth, 2) == pytest.approx(2 * 0.5 ** (depth + 1))


def test_weight_decays_are_evenly_spaced_with_zero_first():
    assert even_positions([1e-2, 0.0, 1e-4, 0.0, 3e-3]) == {0.0: 0, 1e-4: 1, 3e-3: 2, 1e-2: 3}


def test_lines_are_widths_kept_apart_by_other_varying_keys():
    rows = rows_of(decays=(0.0, 1e-3), widths=(0.25, 4.0), biases=(False, True))
    labels = set(line_labels(rows, "weight-decay"))
    assert labels == {f"width={w}, bias={b}" for w in ("0.25", "4") for b in ("False", "True")}
    assert set(line_labels(rows_of(), "weight-decay")) == {"width=1", "width=4"}


def test_weight_decay_figure_only_when_the_weight_decay_varies(tmp_path):
    assert not has_weight_decay_study(rows_of())
    assert drawn(rows_of(), tmp_path) == set()
    rows = rows_of(decays=(0.0, 1e-4, 1e-2))
    assert has_weight_decay_study(rows)
    assert drawn(rows, tmp_path) == {"barrier_vs_weight_decay"}


def test_depth_figure_only_when_the_depth_varies(tmp_path):
    shallow, deep = rows_of(depth=1), rows_of(depth=4)
    assert not has_depth_study(deep)
    both = pd.concat([shallow, deep], ignore_index=True)
    both = both.assign(cell_id=both["cell_id"] + "-" + both["depth"].astype(str))
    both["accuracy"] = 0.9
    both["endpoint_acc_mean"] = 0.95
    both["logit_norm_ratio_logit_ensemble"] = 0.2
    assert has_depth_study(both)
    assert drawn(both, tmp_path) == {"lewc_scale_vs_depth"}
    residual = both.assign(lewc_temperature_ratio=float("nan"))  # a ViT's blocks: no LEWC depth
    assert not has_depth_study(residual)
    assert drawn(residual, tmp_path / "residual") == set()
