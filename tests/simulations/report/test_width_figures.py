"""Mixed client widths in the report (:mod:`fedlmc.simulations.report.width_figures`): which
rows mix widths, their labels in client-count order, and the figure (a PNG) drawn from them."""

from __future__ import annotations

import pandas as pd
from matplotlib.image import imread

from fedlmc.simulations.report.width_figures import (
    MIX,
    has_mixed_widths,
    is_mixed,
    mix_label,
    mix_order,
    width_mix_figure,
    with_mix,
)

MIXES = [("1,1", 1.0), ("0.5,4", 8.0), ("0.5,1,2", 2.0), ("0.5,4", 4.0)]


def rows(mixes=MIXES) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"cell_id": f"c{i}", "status": "ok", "method": m, "seed": 0}
            | {"client_widths": widths, "server_width": server}
            | {"accuracy": 0.5 + 0.1 * i + (0.05 if m == "ensemble" else 0.0)}
            for i, (widths, server) in enumerate(mixes)
            for m in ("average", "ensemble")
        ]
    )


def test_a_mix_is_a_client_width_other_than_the_servers():
    assert mix_label("0.5,4", 8) == "0.5,4 -> 8"
    assert is_mixed("0.5,4", 4.0) and not is_mixed("1,1", 1.0)
    assert has_mixed_widths(rows()) and not has_mixed_widths(rows([("1,1", 1.0)]))
    assert not has_mixed_widths(pd.DataFrame({"accuracy": [0.5]}))  # no width columns


def test_the_mixes_are_labelled_and_ordered_by_client_count_then_widths():
    labelled = with_mix(rows())
    assert labelled[MIX].iloc[0] == "1,1 -> 1" and len(labelled) == 8
    assert mix_order(labelled) == ["0.5,4 -> 4", "0.5,4 -> 8", "1,1 -> 1", "0.5,1,2 -> 2"]


def test_the_width_mix_figure_is_a_png_and_nothing_without_widths(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    settings = {"dpi": 50, "error-bars": "std", "title": ""}
    path = width_mix_figure(rows(), ["average", "ensemble"], tmp_path / "mix.png", settings)
    assert path == tmp_path / "mix.png" and imread(path).std() > 0
    no_widths = (
        rows()
        .drop(columns=["client_widths", "server_width"])
        .assign(client_widths=None, server_width=None)
    )
    assert width_mix_figure(no_widths, ["average"], tmp_path / "none.png", settings) is None
