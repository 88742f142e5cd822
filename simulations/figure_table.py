"""The report's figures as a table: one :class:`Figure` per file, registered with
:func:`figure` beside the function that draws it.

A figure has a ``name`` (its file is ``figures/<name>.png``), a predicate ``drawn_when``: true
only when its data exists in the rows, and ``draw(inputs, path)``, which writes the file and
returns its path (or None when, after all, nothing could be drawn). :func:`draw_figures` goes
through :data:`FIGURE_TABLE` in registration order, which is also the order of the figures in
``report.md``. Every predicate and drawing reads one :class:`FigureInputs`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from fedlmc.registry import Registry
from fedlmc.simulations._new_study_figures import (
    barrier_vs_weight_decay_figure,
    has_depth_study,
    has_weight_decay_study,
    lewc_scale_vs_depth_figure,
)
from fedlmc.simulations.figures import (
    LEWC_PANELS,
    MECHANISM_METHODS,
    MECHANISM_PANELS,
    accuracy_by_width_lines,
    figure_title,
    lambda_path_figure,
    layer_figure,
    lewc_cosine_panels,
    metric_vs_axis,
    pairwise_figure,
    temperature_series,
)
from fedlmc.simulations.init_figures import has_init_panels, merge_gap_by_init_figure
from fedlmc.simulations.report_data import (
    accuracy_methods,
    axis_rows,
    gaps_are_barriers,
    has_values,
    run_title,
)
from fedlmc.simulations.report_training import has_client_curves, training_curves_figure
from fedlmc.simulations.sweep import varying_keys
from fedlmc.simulations.width_figures import has_mixed_widths, width_mix_figure


@dataclass(frozen=True)
class FigureInputs:
    """What the figures read: the ``ok`` rows, the ``[report]`` settings, the methods drawn on
    accuracy plots (:func:`~fedlmc.simulations.report_data.accuracy_methods`), the varying config
    keys, the Dirichlet rows (those where ``alpha`` matters) and the folder's ``training.csv``
    (``None`` when it has none)."""

    rows: pd.DataFrame
    settings: dict[str, Any]
    methods: list[str]
    varying: list[str]
    dirichlet: pd.DataFrame
    training: pd.DataFrame | None = field(default=None)

    @classmethod
    def of(
        cls, rows: pd.DataFrame, settings: dict[str, Any], training: pd.DataFrame | None = None
    ) -> FigureInputs:
        return cls(
            rows,
            settings,
            accuracy_methods(rows),
            varying_keys(rows),
            axis_rows(rows, "alpha"),
            training,
        )


Draw = Callable[[FigureInputs, Path], "Path | None"]


@dataclass(frozen=True)
class Figure:
    """One figure of the report (see the module docstring)."""

    name: str
    drawn_when: Callable[[FigureInputs], bool]
    draw: Draw

    @property
    def file(self) -> str:
        return f"{self.name}.png"


FIGURE_TABLE: Registry[Figure] = Registry("figure")
"""Every figure, in the order they are drawn and listed in ``report.md``."""


def figure(name: str, drawn_when: Callable[[FigureInputs], bool]) -> Callable[[Draw], Draw]:
    """Register the decorated ``draw(inputs, path)`` as figure ``name`` (file ``name.png``),
    drawn only when ``drawn_when(inputs)``."""

    def register(draw: Draw) -> Draw:
        FIGURE_TABLE.add(name, Figure(name, drawn_when, draw))
        return draw

    return register


def draw_figures(
    rows: pd.DataFrame,
    fig_dir: Path,
    settings: dict[str, Any],
    training: pd.DataFrame | None = None,
) -> list[Path]:
    """Every figure of :data:`FIGURE_TABLE` whose data exists, written under ``fig_dir``
    (``training``: the folder's ``training.csv``, for the training curves)."""
    if rows.empty or "method" not in rows or "width" not in rows:
        return []
    fig_dir.mkdir(parents=True, exist_ok=True)
    inputs = FigureInputs.of(rows, settings, training)
    wanted = [f for f in FIGURE_TABLE if f.drawn_when(inputs)]
    title = " - ".join(t for t in (settings.get("title", ""), run_title(rows)) if t)
    with figure_title(title):
        drawn = [f.draw(inputs, fig_dir / f.file) for f in wanted]
    for stale in FIGURE_TABLE:  # a figure of an earlier report of this folder, not drawn now
        if fig_dir / stale.file not in drawn:
            (fig_dir / stale.file).unlink(missing_ok=True)
    return [p for p in drawn if p is not None]


def omitted_figures(rows: pd.DataFrame) -> list[str]:
    """Why a figure that would repeat another is not drawn (one line each, for report.md)."""
    if has_values(rows, "merge_gap_loss") and gaps_are_barriers(rows):
        return [
            "merge_gap_vs_width is not drawn: on every row the merge gap equals the barrier at "
            "lambda = 1/2 (two clients of equal weight: the merged model is the midpoint of "
            "the path between them), drawn in barrier_vs_width."
        ]
    return []


def _merged(inputs: FigureInputs) -> pd.DataFrame:
    """The rows of the methods drawn on accuracy plots."""
    return inputs.rows[inputs.rows["method"].isin(inputs.methods)]


def _calibrated_methods(rows: pd.DataFrame) -> list[str]:
    """The ``_t`` methods, in order of appearance."""
    return [m for m in dict.fromkeys(rows["method"]) if m.endswith("_t")]


# ----------------------------------------------------------------------------- the figures


@figure("accuracy_vs_width", lambda d: has_values(d.rows, "accuracy"))
def accuracy_vs_width(d: FigureInputs, path: Path) -> Path | None:
    return metric_vs_axis(
        d.rows,
        "width",
        [("accuracy", "")],
        d.methods,
        "merged test accuracy",
        path,
        d.settings,
        references=True,
    )


@figure("barrier_vs_width", lambda d: has_values(_merged(d), "loss_barrier_half"))
def barrier_vs_width(d: FigureInputs, path: Path) -> Path | None:
    return metric_vs_axis(
        d.rows,
        "width",
        [
            ("loss_barrier_half", "raw logits"),
            ("loss_barrier_half_calibrated", "each model with its fitted temperature"),
        ],
        d.methods,
        "loss barrier at lambda = 1/2 (signed)",
        path,
        d.settings,
    )


@figure(
    "merge_gap_vs_width",
    lambda d: has_values(_merged(d), "merge_gap_loss") and not gaps_are_barriers(d.rows),
)
def merge_gap_vs_width(d: FigureInputs, path: Path) -> Path | None:
    return metric_vs_axis(
        d.rows,
        "width",
        [
            ("merge_gap_loss", "raw logits"),
            ("merge_gap_loss_calibrated", "each model with its fitted temperature"),
        ],
        d.methods,
        "merged NLL - mean endpoint NLL",
        path,
        d.settings,
    )


@figure(
    "temperature_vs_width",
    lambda d: has_values(d.rows[d.rows["method"].str.endswith("_t")], "temperature"),
)
def temperature_vs_width(d: FigureInputs, path: Path) -> Path | None:
    return metric_vs_axis(
        d.rows,
        "width",
        temperature_series(d.rows),
        _calibrated_methods(d.rows),
        "fitted temperature T",
        path,
        d.settings,
    )


@figure(
    "lewc_layers",
    lambda d: has_values(d.rows, "lewc_cos_mean") or "lewc_cos_layers" in d.rows,
)
def lewc_layers(d: FigureInputs, path: Path) -> Path | None:
    return layer_figure(d.rows, path, d.settings, lewc_cosine_panels(list(d.rows.columns)))


@figure("lewc_vs_llfc", lambda d: "norm_ratio_layers" in d.rows)
def lewc_vs_llfc(d: FigureInputs, path: Path) -> Path | None:
    return layer_figure(d.rows, path, d.settings, LEWC_PANELS)


@figure("dead_units_and_bias_share", lambda d: "dead_unit_fraction_layers" in d.rows)
def dead_units_and_bias_share(d: FigureInputs, path: Path) -> Path | None:
    return layer_figure(
        d.rows,
        path,
        d.settings,
        MECHANISM_PANELS,
        "num-clients" if "num-clients" in d.varying else "width",
        only=MECHANISM_METHODS,
    )


@figure("accuracy_vs_alpha", lambda d: "alpha" in varying_keys(d.dirichlet))
def accuracy_vs_alpha(d: FigureInputs, path: Path) -> Path | None:
    return accuracy_by_width_lines(d.dirichlet, "alpha", d.methods, path, d.settings, 10)


@figure("accuracy_vs_clients", lambda d: "num-clients" in d.varying)
def accuracy_vs_clients(d: FigureInputs, path: Path) -> Path | None:
    return accuracy_by_width_lines(d.rows, "num-clients", d.methods, path, d.settings, 2)


@figure("merge_gap_by_init_vs_clients", lambda d: has_init_panels(d.rows, "num-clients"))
def merge_gap_by_init_vs_clients(d: FigureInputs, path: Path) -> Path | None:
    return merge_gap_by_init_figure(d.rows, "num-clients", path, d.settings, 2)


@figure("merge_gap_by_init_vs_alpha", lambda d: has_init_panels(d.rows, "alpha"))
def merge_gap_by_init_vs_alpha(d: FigureInputs, path: Path) -> Path | None:
    return merge_gap_by_init_figure(d.rows, "alpha", path, d.settings, 10)


@figure(
    "client_barriers_vs_clients",
    lambda d: (
        "num-clients" in d.varying
        and has_values(d.rows, "client_to_merge_path_loss_barrier_half_calibrated_mean")
    ),
)
def client_barriers_vs_clients(d: FigureInputs, path: Path) -> Path | None:
    return metric_vs_axis(
        d.rows[pd.to_numeric(d.rows["num-clients"]) > 2],
        "num-clients",
        [
            ("client_to_merge_path_loss_barrier_half_calibrated_mean", "mean over clients"),
            ("client_to_merge_path_loss_barrier_half_calibrated_worst", "worst client"),
        ],
        d.methods,
        "barrier at 1/2 on the path client -> merge,\ncalibrated (path shape, not merge quality)",
        path,
        d.settings,
    )


@figure("pairwise_barriers", lambda d: "pairwise_loss_barrier_half" in d.rows)
def pairwise_barriers(d: FigureInputs, path: Path) -> Path | None:
    return pairwise_figure(d.rows, path, d.settings)


@figure("lambda_paths", lambda d: "curve" in d.rows)
def lambda_paths(d: FigureInputs, path: Path) -> Path | None:
    return lambda_path_figure(d.rows, path, d.settings)


@figure("training_curves", lambda d: has_client_curves(d.training))
def training_curves(d: FigureInputs, path: Path) -> Path | None:
    return training_curves_figure(d.training, path, d.settings)


@figure("width_mix", lambda d: has_mixed_widths(d.rows))
def width_mix(d: FigureInputs, path: Path) -> Path | None:
    return width_mix_figure(d.rows, d.methods, path, d.settings)


@figure("barrier_vs_weight_decay", lambda d: has_weight_decay_study(d.rows))
def barrier_vs_weight_decay(d: FigureInputs, path: Path) -> Path | None:
    return barrier_vs_weight_decay_figure(d.rows, path, d.settings)


@figure("lewc_scale_vs_depth", lambda d: has_depth_study(d.rows))
def lewc_scale_vs_depth(d: FigureInputs, path: Path) -> Path | None:
    return lewc_scale_vs_depth_figure(d.rows, path, d.settings)
