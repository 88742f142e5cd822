"""Every figure of the report keeps its text inside its canvas
(:mod:`fedlmc.simulations.report.figure_table`): each registered figure is drawn from small
results tables in the report's tidy format, once as a one-panel sweep and once with a second
varying key (several panels), under the long two-line title a real sweep gets; every visible,
non-empty text of the drawn figure (titles, labels, ticks, legends) lies within the figure."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
from matplotlib.figure import Figure

from fedlmc.simulations.report.figure_table import FIGURE_TABLE, draw_figures, figures_to_draw
from tests.simulations.report.test_init_figures import client_rows, skew_by_clients_rows
from tests.simulations.report.test_method_figures import _rows as field_method_rows
from tests.simulations.report.test_study_tables import rows_of
from tests.simulations.report.test_training import SETTLED, curves
from tests.simulations.report.test_width_figures import rows as width_mix_rows

matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402  (pyplot wraps Figure.savefig when imported: before the test patches it)

SETTINGS = {"dpi": 40, "error-bars": "std", "title": "quick"}
LAYERS = 3


def layers(scale: float) -> str:
    return json.dumps([scale * (i + 1) / LAYERS for i in range(LAYERS)])


def quick_rows(widths=(0.5, 4.0), seeds=(0, 1), biases=(False,)) -> pd.DataFrame:
    """A sweep like configs/quick.toml: two clients, width varies, raw and ``_t`` methods, every
    measurement the quick sweep writes (barriers, temperatures, lambda paths, per-layer LEWC
    and mechanism columns); ``biases`` of two values give a second varying key."""
    rows = []
    for bias in biases:
        for width in widths:
            for seed in seeds:
                cell = f"{bias}-{width}-{seed}"
                base = 0.8 + 0.02 * width - 0.01 * seed
                for i, method in enumerate(
                    ("average", "average_t", "weight_matching", "weight_matching_t")
                ):
                    barrier = 0.5 / width + 0.1 * (i // 2) + 0.05 * seed
                    rows.append(
                        {
                            "cell_id": cell,
                            "status": "ok",
                            "method": method,
                            "dataset": "mnist5k",
                            "model": "mlp",
                            "num-clients": 2,
                            "partition": "iid",
                            "epochs": 12,
                            "width": width,
                            "base-hidden": 128,
                            "bias": bias,
                            "seed": seed,
                            "accuracy": base - 0.05 * (i // 2),
                            "endpoint_acc_mean": base + 0.05,
                            "ensemble_acc": base + 0.06,
                            "loss_barrier_half": barrier,
                            "loss_barrier_half_calibrated": barrier / 2,
                            "merge_gap_loss": barrier + 0.01,
                            "merge_gap_loss_calibrated": barrier / 2 + 0.01,
                            "temperature": 1.5 + 0.1 * width if method.endswith("_t") else None,
                            "temperature_server_split": 1.4 + 0.1 * width,
                            "curve": json.dumps(
                                {
                                    "lam": [0.0, 0.5, 1.0],
                                    "accuracy": [base, base - barrier / 4, base],
                                    "nll": [0.3, 0.3 + barrier, 0.3],
                                    "nll_calibrated": [0.3, 0.3 + barrier / 2, 0.3],
                                }
                            ),
                            "lewc_cos_layers": layers(0.9),
                            "lewc_cos_shuffled_layers": layers(0.3),
                            "lewc_cos_centred_layers": layers(0.6),
                            "norm_ratio_layers": layers(0.5 / width),
                            "lewc_norm_ratio_layers": layers(0.5),
                            "lewc_error_layers": layers(0.1),
                            "llfc_scaled_error_layers": layers(0.2),
                            "dead_unit_fraction_layers": layers(0.1 / width),
                            "bias_share_layers": layers(0.2 if bias else 0.0),
                        }
                    )
    return pd.DataFrame(rows)


def study_rows() -> pd.DataFrame:
    """The weight-decay and depth studies' rows (test_study_figures' tables)."""
    deep = pd.concat([rows_of(depth=1), rows_of(depth=4)], ignore_index=True)
    deep = deep.assign(cell_id=deep["cell_id"] + "-" + deep["depth"].astype(str))
    return deep.assign(accuracy=0.9, endpoint_acc_mean=0.95, logit_norm_ratio_logit_ensemble=0.2)


def n_client_rows() -> pd.DataFrame:
    """Three and four clients: barriers on each client's path to the merge, the pairwise
    matrix."""
    rows = []
    for clients in (3, 4):
        for seed in (0, 1):
            for method, base in (("average", 0.5), ("weight_matching", 0.1)):
                matrix = [[base * (i + j) * (i != j) for j in range(clients)] for i in range(4)]
                rows.append(
                    {"cell_id": f"c{clients}{seed}", "status": "ok", "method": method}
                    | {"width": 1.0, "seed": seed, "num-clients": clients}
                    | {"accuracy": 0.9 - base / clients}
                    | {"client_to_merge_path_loss_barrier_half_calibrated_mean": base * clients}
                    | {"client_to_merge_path_loss_barrier_half_calibrated_worst": base * 2}
                    | {"pairwise_loss_barrier_half": json.dumps(matrix[:clients])}
                )
    return pd.DataFrame(rows)


def skew_rows(widths: tuple[float, ...]) -> pd.DataFrame:
    """The label-skew study (test_init_figures') at alpha 0.1 and 1."""
    rows = skew_by_clients_rows(widths)
    wide = rows[rows["partition"] == "dirichlet"].assign(alpha=1.0)
    wide = wide.assign(cell_id=wide["cell_id"] + "-1")
    return pd.concat([rows, wide], ignore_index=True)


SAME_PANELS = {
    "client_barriers_vs_clients",
    "pairwise_barriers",
    "width_mix",
    "lewc_scale_vs_depth",
}
"""Figures whose panels do not multiply with another varying key: drawn in the one-panel case."""


Table = tuple[pd.DataFrame, pd.DataFrame | None]


def tables(several_panels: bool) -> dict[str, Callable[[], Table]]:
    """By name, what builds the ``(rows, training)`` tables that between them draw every
    registered figure with one panel each (a figure of fixed panels, :data:`SAME_PANELS`, its
    own), or (``several_panels``) every other with a second varying key. Each table is a test
    of its own, so that pytest-xdist can spread the drawing over its workers."""
    biases = (False, True) if several_panels else (False,)
    widths = (0.5, 4.0) if several_panels else (4.0,)

    def quick() -> Table:
        training = curves({(f"c{w}", w, c): SETTLED for w in widths for c in ("0", "1")})
        return quick_rows(biases=biases), training

    def fields() -> Table:
        rows = field_method_rows()
        return (rows if several_panels else rows.query("width == 1.0 and init == 'shared'")), None

    common = {
        "quick": quick,
        "clients": lambda: (
            client_rows() if several_panels else client_rows().query("init == 'shared'"),
            None,
        ),
        "label skew": lambda: (skew_rows(widths), None),
        "field methods": fields,
        "weight decay": lambda: (rows_of(decays=(0.0, 1e-4, 1e-2), biases=biases), None),
    }
    if several_panels:
        return common
    return common | {
        "n clients": lambda: (n_client_rows(), None),
        "width mix": lambda: (width_mix_rows().assign(width=1.0), None),
        "studies": lambda: (study_rows(), None),
    }


CASES = [(several, name) for several in (False, True) for name in tables(several)]
"""Every ``(several_panels, table name)``: one test each."""


def texts_outside(fig: Figure) -> list[str]:
    """The texts of ``fig``, drawn, whose window extent leaves the figure's: every visible,
    non-empty text of a visible parent, each axis's tick labels as the axis draws them (those
    of the ticks in view)."""
    fig.draw_without_rendering()  # the layout and every text's place, no pixels
    renderer = fig.canvas.get_renderer()
    bounds = fig.bbox.padded(0.5)  # half a pixel of rounding
    ticks = {label for ax in fig.axes for axis in _axes(ax) for label in _tick_labels(axis)}
    extents = [
        (repr(text.get_text()), text.get_window_extent(renderer))
        for text in fig.findobj(matplotlib.text.Text)
        if text not in ticks and _drawn(text)
    ]
    extents += [
        (f"{axis.axis_name} tick labels of {ax.get_title()!r}", axis.get_tightbbox(renderer))
        for ax in fig.axes
        if ax.get_visible() and ax.axison
        for axis in _axes(ax)
    ]
    return [
        f"{name} at {box.bounds} in {bounds.bounds}"
        for name, box in extents
        if box is not None and box.width > 0 and not _inside(box, bounds)
    ]


def _axes(ax) -> list:
    return [ax.xaxis, ax.yaxis]


def _tick_labels(axis) -> list:
    ticks = axis.get_major_ticks() + axis.get_minor_ticks()
    return [label for tick in ticks for label in (tick.label1, tick.label2)]


def _drawn(text) -> bool:
    """Visible, non-empty, and in no hidden axes or legend."""
    parents = [text.axes, getattr(text, "_legend", None)]
    return (
        text.get_visible()
        and bool(text.get_text().strip())
        and all(p.get_visible() for p in parents if p is not None)
        and (text.axes is None or text.axes.axison or text in text.axes.texts)
    )


def _inside(box, bounds) -> bool:
    return (
        box.x0 >= bounds.x0 and box.y0 >= bounds.y0 and box.x1 <= bounds.x1 and box.y1 <= bounds.y1
    )


def drawn_files(rows: pd.DataFrame, training: pd.DataFrame | None) -> set[str]:
    """The files of the figures :func:`draw_figures` draws from ``rows``, without drawing."""
    return {f.file for f in figures_to_draw(rows, SETTINGS, training)}


@pytest.mark.parametrize("several_panels", [False, True], ids=["one panel", "several panels"])
def test_the_tables_draw_every_figure(several_panels):
    drawn = set().union(*(drawn_files(*make()) for make in tables(several_panels).values()))
    fixed = {f"{name}.png" for name in SAME_PANELS} if several_panels else set()
    assert drawn == {f.file for f in FIGURE_TABLE} - fixed


@pytest.mark.parametrize(
    ("several_panels", "table"),
    CASES,
    ids=[f"{'several panels' if s else 'one panel'}: {name}" for s, name in CASES],
)
def test_every_figure_keeps_its_text_inside_the_canvas(
    tmp_path, monkeypatch, several_panels, table
):
    checked: dict[str, list[str]] = {}

    def draw_and_check(fig: Figure, path, dpi: float, **_) -> None:
        """Draw the figure at the dpi it would be written with, and check it (no PNG)."""
        fig.set_dpi(dpi)
        checked[Path(path).name] = texts_outside(fig)

    monkeypatch.setattr(Figure, "savefig", draw_and_check)
    rows, training = tables(several_panels)[table]()
    draw_figures(rows, tmp_path, SETTINGS, training)
    assert set(checked) == drawn_files(rows, training)  # each figure it should draw, drawn
    outside = {name: out for name, out in checked.items() if out}
    assert not outside, "\n".join(f"{k}: {v}" for k, v in outside.items())
