"""The per-layer figures: blocks wrapped at three a line (no 10-panel strips), one legend for
all in a spare block, hidden layers labelled as such, a bias share without biases blanked."""

from __future__ import annotations

import json

import pandas as pd
from matplotlib.image import imread

from fedlmc.simulations.report.layer_figures import MECHANISM_PANELS, layer_figure
from fedlmc.simulations.report.plotting import _pyplot, block_grid, mark_empty

SETTINGS = {"dpi": 60, "error-bars": "std", "title": ""}


def mechanism_rows() -> pd.DataFrame:
    rows = []
    for bias in (False, True):
        for method in ("average", "average_lewc_bias", "weight_matching", "merge_many"):
            for width in (0.25, 4.0):
                share = (
                    [0.0] * 4 if not bias else [0.01 * width, 0.05, 0.1, 0.2 + len(method) / 100]
                )
                rows.append(
                    {
                        "cell_id": f"{bias}{width}",
                        "method": method,
                        "width": width,
                        "bias": bias,
                        "seed": 0,
                        "model": "mlp",
                        "base-hidden": 128,
                        "dead_unit_fraction_layers": json.dumps([0.0, width / len(method), 0.02]),
                        "bias_share_layers": json.dumps(share),
                    }
                )
    return pd.DataFrame(rows)


def test_blocks_wrap_at_three_and_leave_a_spare_for_the_legend():
    fig, blocks, spare = block_grid(5, rows=2)
    assert len(blocks) == 5 and all(len(b) == 2 for b in blocks) and len(spare) == 1
    assert fig.axes[0].get_gridspec().get_geometry() == (4, 3)  # 2 lines of 3 blocks
    assert blocks[4][1].get_shared_y_axes().joined(blocks[4][1], blocks[0][1])
    _pyplot().close(fig)


def test_a_panel_of_zeros_that_mean_no_biases_is_blanked_and_said():
    fig, (zeros, data, none) = _pyplot().subplots(1, 3)
    zeros.plot([1, 2, 3], [0.0, 0.0, 0.0])
    data.plot([1, 2, 3], [0.0, 0.1, 0.0])
    none.plot([1, 2], [float("nan")] * 2)
    for ax in (zeros, data, none):
        mark_empty(ax, "no value", "no biases")
    assert [t.get_text() for t in zeros.texts] == ["no biases"] and not zeros.lines
    assert data.lines and not data.texts  # real zeros beside real values stay
    assert [t.get_text() for t in none.texts] == ["no value"]
    _pyplot().close(fig)


def test_the_mechanism_figure_is_a_grid_not_a_strip(tmp_path):
    path = layer_figure(mechanism_rows(), tmp_path / "m.png", SETTINGS, MECHANISM_PANELS, "width")
    height, width = imread(path).shape[:2]
    # 8 blocks (4 methods x bias), 3 a line: the old layout was one column each, 5.6 : 1
    assert width / height < 1.0
    assert MECHANISM_PANELS[0].xlabel.startswith("hidden layer l")
    assert MECHANISM_PANELS[1].xlabel == "layer l (last = logits)"
