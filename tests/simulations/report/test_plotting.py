"""The drawing helpers of the report (:mod:`fedlmc.simulations.report.plotting`): a saved PNG with
its title, a log axis with a tick at every value, an empty panel blanked with its reason, and
methods with equal series drawn once."""

from __future__ import annotations

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.image import imread

from fedlmc.simulations.report.plotting import (
    coinciding,
    coinciding_label,
    figure_title,
    log_axis,
    mark_empty,
    panel_grid,
    save,
)

matplotlib.use("Agg")


def test_a_figure_saved_inside_figure_title_is_a_titled_png(tmp_path):
    fig, axes = panel_grid(2, sharey=True)
    axes.flat[0].plot([1, 2], [0, 1])
    axes.flat[1].plot([1, 2], [5, 6])
    assert axes.flat[0].get_ylim() == axes.flat[1].get_ylim()
    with figure_title("quick - mnist5k, mlp"):
        path = save(fig, tmp_path / "a.png", 40)
    assert fig._suptitle.get_text() == "quick - mnist5k, mlp"
    image = imread(path)
    assert image.shape[:2] == (round(fig.get_figheight() * 40), round(fig.get_figwidth() * 40))
    fig, _ = panel_grid(1)
    save(fig, tmp_path / "b.png", 40)
    assert fig._suptitle is None  # no title outside the block


def test_a_log_axis_has_a_tick_at_every_value_with_its_units():
    fig, axes = panel_grid(1)
    ax = axes.flat[0]
    log_axis(ax, [2.0, 0.5, 1.0, 2.0], base=2, units={1.0: "1x (64 units)"})
    assert ax.get_xscale() == "log"
    assert list(ax.get_xticks()) == [0.5, 1.0, 2.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.5", "1x\n64", "2"]
    matplotlib.pyplot.close(fig)


def test_an_axis_without_a_finite_value_is_blanked_with_its_reason():
    fig, axes = panel_grid(3)
    empty, zeros, fine = axes.flat[:3]
    empty.plot([1, 2], [np.nan, np.nan])
    zeros.plot([1, 2], [0.0, 0.0])
    fine.plot([1, 2], [0.0, 1.0])
    mark_empty(empty, "no barrier measured")
    mark_empty(zeros, "no barrier measured", zero_means="every barrier is 0")
    mark_empty(fine, "no barrier measured", zero_means="every barrier is 0")
    assert [t.get_text() for t in empty.texts] == ["no barrier measured"]
    assert [t.get_text() for t in zeros.texts] == ["every barrier is 0"]
    assert not fine.texts and len(fine.get_lines()) == 1
    matplotlib.pyplot.close(fig)


def test_methods_with_equal_series_are_grouped_and_labelled_once():
    def series(means):
        return pd.DataFrame({"width": [1.0, 2.0], "mean": means, "spread": [0.0, 0.0]})

    tables = {
        "average": [series([0.5, 0.6])],
        "ensemble": [series([0.7, 0.8])],
        "average_lewc_bias_t": [series([0.5, 0.6])],
    }
    assert coinciding(tables) == {
        "average": ["average", "average_lewc_bias_t"],
        "ensemble": ["ensemble"],
    }
    assert coinciding_label(["average", "average_lewc_bias_t"]) == (
        "average = average_lewc_bias_t (identical here)"
    )
    assert coinciding_label(["ensemble"]) == "ensemble"
