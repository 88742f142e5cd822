"""The report's figures as a table: one :class:`Figure` per file, registered with
:func:`figure` beside the function that draws it.

A figure has a ``name`` (its file is ``figures/<name>.png``), a predicate ``drawn_when``: true
only when its data exists in the rows, and ``draw(inputs, path)``, which writes the file and
returns its path (or None when, after all, nothing could be drawn). :func:`draw_figures` goes
through :data:`FIGURE_TABLE` in registration order, which is also the order of the figures in
``report.md`` and in the figures table of docs/sweeps.md (:func:`figures_markdown`, from each
figure's ``shows``). Every predicate and drawing reads one :class:`FigureInputs`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from fedlmc.registry import Registry
from fedlmc.simulations.records.row_groups import varying_keys
from fedlmc.simulations.report.data import (
    accuracy_methods,
    axis_rows,
    gaps_are_barriers,
    has_values,
    run_title,
)
from fedlmc.simulations.report.init_figures import has_init_panels, merge_gap_by_init_figure
from fedlmc.simulations.report.layer_figures import (
    LEWC_PANELS,
    MECHANISM_METHODS,
    MECHANISM_PANELS,
    layer_figure,
    lewc_cosine_panels,
)
from fedlmc.simulations.report.method_figures import accuracy_by_method_figure, has_field_methods
from fedlmc.simulations.report.plotting import (
    accuracy_by_width_lines,
    figure_title,
    lambda_path_figure,
    metric_vs_axis,
    pairwise_figure,
    temperature_series,
)
from fedlmc.simulations.report.study_figures import (
    barrier_vs_weight_decay_figure,
    has_depth_study,
    has_weight_decay_study,
    lewc_scale_vs_depth_figure,
)
from fedlmc.simulations.report.training import has_client_curves, training_curves_figure
from fedlmc.simulations.report.width_figures import has_mixed_widths, width_mix_figure


@dataclass(frozen=True)
class FigureInputs:
    """What the figures read: the ``ok`` rows, the ``[report]`` settings, the methods drawn on
    accuracy plots (:func:`~fedlmc.simulations.report.data.accuracy_methods`), the varying config
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
    shows: str
    """What it shows (Markdown, one line): its row in the figures table of docs/sweeps.md."""

    @property
    def file(self) -> str:
        return f"{self.name}.png"


FIGURE_TABLE: Registry[Figure] = Registry("figure")
"""Every figure, in the order they are drawn and listed in ``report.md``."""


def figure(
    name: str, drawn_when: Callable[[FigureInputs], bool], *, shows: str
) -> Callable[[Draw], Draw]:
    """Register the decorated ``draw(inputs, path)`` as figure ``name`` (file ``name.png``),
    drawn only when ``drawn_when(inputs)``; ``shows``: what it shows, for the docs' table
    (:func:`figures_markdown`)."""
    if not isinstance(shows, str) or not shows.strip() or "\n" in shows:
        raise ValueError(f"figure {name!r}: shows = {shows!r}; allowed: one non-empty line")

    def register(draw: Draw) -> Draw:
        FIGURE_TABLE.add(name, Figure(name, drawn_when, draw, shows))
        return draw

    return register


def figures_markdown() -> str:
    """Every registered figure, in report order, as a Markdown table (file, what it shows):
    the generated table of docs/sweeps.md (``python docs/gen_tables.py``)."""
    lines = ["| file | shows |", "|---|---|"]
    escaped = {f.file: f.shows.replace("|", "\\|") for f in FIGURE_TABLE}
    lines += [f"| `{file}` | {shows} |" for file, shows in escaped.items()]
    return "\n".join(lines)


def draw_figures(
    rows: pd.DataFrame,
    fig_dir: Path,
    settings: dict[str, Any],
    training: pd.DataFrame | None = None,
) -> list[Path]:
    """Every figure of :data:`FIGURE_TABLE` whose data exists (:func:`figures_to_draw`),
    written under ``fig_dir`` (``training``: the folder's ``training.csv``, for the training
    curves)."""
    inputs = _inputs(rows, settings, training)
    if inputs is None:
        return []
    fig_dir.mkdir(parents=True, exist_ok=True)
    wanted = _drawn_from(inputs)
    title = " - ".join(t for t in (settings.get("title", ""), run_title(rows)) if t)
    title = f"{title}\n{seeds_note(rows, settings.get('error-bars', 'none'))}".strip()
    with figure_title(title):
        drawn = [f.draw(inputs, fig_dir / f.file) for f in wanted]
    for stale in FIGURE_TABLE:  # a figure of an earlier report of this folder, not drawn now
        if fig_dir / stale.file not in drawn:
            (fig_dir / stale.file).unlink(missing_ok=True)
    return [p for p in drawn if p is not None]


def figures_to_draw(
    rows: pd.DataFrame, settings: dict[str, Any], training: pd.DataFrame | None = None
) -> list[Figure]:
    """The figures :func:`draw_figures` draws from these tables (their ``drawn_when`` rules),
    in report order, without drawing them."""
    inputs = _inputs(rows, settings, training)
    return [] if inputs is None else _drawn_from(inputs)


def _inputs(
    rows: pd.DataFrame, settings: dict[str, Any], training: pd.DataFrame | None
) -> FigureInputs | None:
    """What the figures are drawn from; None when the rows cannot draw any (no method or width
    column, or no row)."""
    if rows.empty or "method" not in rows or "width" not in rows:
        return None
    return FigureInputs.of(rows, settings, training)


def _drawn_from(inputs: FigureInputs) -> list[Figure]:
    return [f for f in FIGURE_TABLE if f.drawn_when(inputs)]


def seeds_note(rows: pd.DataFrame, kind: str) -> str:
    """What a figure's points are: ``3 seeds: lines their mean, error bars ± std (ddof = 1),
    unless a line names its seed``."""
    seeds = rows["seed"].nunique() if "seed" in rows else 1
    if seeds == 1:
        return "1 seed"
    bars = {"std": ", error bars ± std (ddof = 1)", "sem": ", error bars ± standard error"}
    return f"{seeds} seeds: lines their mean{bars.get(kind, '')}, unless a line names its seed"


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


@figure(
    "accuracy_vs_width",
    lambda d: has_values(d.rows, "accuracy"),
    shows=(
        "merged test accuracy per method vs width (log2 axis), mean over seeds with error bars "
        "(std or sem, `[report] error-bars`); dashed: the mean endpoint (client model) accuracy"
        " and the sample-count-weighted ensemble's; `X_t` methods drawn only without `X` "
        "(temperature never changes "
        "the argmax)"
    ),
)
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


@figure(
    "accuracy_by_method",
    lambda d: has_field_methods(d.rows),
    shows="merged accuracy per merge method, one panel per setting (width, clients, init, "
    "partition), SecAgg+ rows beside the clear ones, the best reference ensemble and the "
    "clients' mean as lines "
    "(when two of the field's methods ran: Fisher, RegMean, TA, TIES, DARE, OT fusion)",
)
def accuracy_by_method(d: FigureInputs, path: Path) -> Path | None:
    return accuracy_by_method_figure(d.rows, path, d.settings)


@figure(
    "barrier_vs_width",
    lambda d: has_values(_merged(d), "loss_barrier_half"),
    shows=(
        "two clients: the loss barrier at lambda = 1/2 (signed, the paper's Table 1 quantity), "
        "raw logits (solid) vs with a fitted temperature (dashed), per method"
    ),
)
def barrier_vs_width(d: FigureInputs, path: Path) -> Path | None:
    return metric_vs_axis(
        d.rows,
        "width",
        [
            ("loss_barrier_half", "raw logits"),
            ("loss_barrier_half_calibrated", "each model with its fitted temperature"),
        ],
        d.methods,
        "loss barrier at lambda = 1/2\n(signed, nats)",
        path,
        d.settings,
    )


@figure(
    "merge_gap_vs_width",
    lambda d: has_values(_merged(d), "merge_gap_loss") and not gaps_are_barriers(d.rows),
    shows=(
        "any number of clients: merged test NLL minus the mean endpoint's, raw (solid) and "
        "calibrated (dashed), per method; not drawn when it equals `barrier_vs_width` on every "
        "row (two clients of equal weight: the merge is the path's midpoint), and `report.md` "
        "says so"
    ),
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
        "merged NLL - mean endpoint NLL (nats)",
        path,
        d.settings,
    )


@figure(
    "temperature_vs_width",
    lambda d: has_values(d.rows[d.rows["method"].str.endswith("_t")], "temperature"),
    shows=(
        "fitted temperature T of the `_t` methods (solid) and, where rows have it, the server "
        "split's temperature for the same merged model (dashed)"
    ),
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
    shows=(
        "LEWC cosine per layer (1: the merged layer output equals the exponentially weighted "
        "prediction), one line per width, one panel per method and value of the other varying "
        "keys (diagnostics on); top: for the same input (solid) against its baseline, the "
        "prediction for a shuffled input (dashed); bottom: both sides centred on their mean "
        "over the inputs"
    ),
)
def lewc_layers(d: FigureInputs, path: Path) -> Path | None:
    return layer_figure(d.rows, path, d.settings, lewc_cosine_panels(list(d.rows.columns)))


@figure(
    "lewc_vs_llfc",
    lambda d: "norm_ratio_layers" in d.rows,
    shows=(
        "per layer, on the combined weights (before BatchNorm re-estimation or REPAIR): top, "
        "the measured norm ratio of the merged layer output to the weighted sum of the clients'"
        " (solid) vs LEWC's prediction of it (dashed; LLFC makes no claim about the scale); "
        "bottom, the relative error of LEWC's prediction (solid) vs LLFC's at its best positive"
        " scale (dashed)"
    ),
)
def lewc_vs_llfc(d: FigureInputs, path: Path) -> Path | None:
    return layer_figure(d.rows, path, d.settings, LEWC_PANELS)


@figure(
    "dead_units_and_bias_share",
    lambda d: "dead_unit_fraction_layers" in d.rows,
    shows=(
        "per layer of the plain average (and `average_lewc_bias`): the fraction of hidden units"
        " never active on the diagnostic inputs (top) and the bias share of the pre-activation "
        "(bottom); one line per client count (or width)"
    ),
)
def dead_units_and_bias_share(d: FigureInputs, path: Path) -> Path | None:
    return layer_figure(
        d.rows,
        path,
        d.settings,
        MECHANISM_PANELS,
        "num-clients" if "num-clients" in d.varying else "width",
        only=MECHANISM_METHODS,
    )


@figure(
    "accuracy_vs_alpha",
    lambda d: "alpha" in varying_keys(d.dirichlet),
    shows="merged accuracy vs Dirichlet alpha (when alpha varies)",
)
def accuracy_vs_alpha(d: FigureInputs, path: Path) -> Path | None:
    return accuracy_by_width_lines(d.dirichlet, "alpha", d.methods, path, d.settings, 10)


@figure(
    "accuracy_vs_clients",
    lambda d: "num-clients" in d.varying,
    shows="merged accuracy vs the number of clients (when it varies)",
)
def accuracy_vs_clients(d: FigureInputs, path: Path) -> Path | None:
    return accuracy_by_width_lines(d.rows, "num-clients", d.methods, path, d.settings, 2)


@figure(
    "merge_gap_by_init_vs_clients",
    lambda d: has_init_panels(d.rows, "num-clients"),
    shows=(
        "when `init` (and `warmup-rounds`) and the number of clients vary: the accuracy gap of "
        "`average_t` and `merge_many_t` to the clients' mean (solid: endpoints' mean - merged) "
        "and to the ensemble (dashed: ensemble - merged), one line per width, one panel per "
        "method and initialisation setting, one y axis; positive: the merge is worse"
    ),
)
def merge_gap_by_init_vs_clients(d: FigureInputs, path: Path) -> Path | None:
    return merge_gap_by_init_figure(d.rows, "num-clients", path, d.settings, 2)


@figure(
    "merge_gap_by_init_vs_alpha",
    lambda d: has_init_panels(d.rows, "alpha"),
    shows=(
        "the same against Dirichlet alpha (the IID cells right of the largest alpha); one line "
        "per width, per number of clients (`N = 8`) when that varies too, or per (width, N) "
        "when both vary"
    ),
)
def merge_gap_by_init_vs_alpha(d: FigureInputs, path: Path) -> Path | None:
    return merge_gap_by_init_figure(d.rows, "alpha", path, d.settings, 10)


@figure(
    "client_barriers_vs_clients",
    lambda d: (
        "num-clients" in d.varying
        and has_values(d.rows, "client_to_merge_path_loss_barrier_half_calibrated_mean")
    ),
    shows=(
        "three or more clients: the calibrated barrier at lambda = 1/2 on each client's path to"
        " the merge (the path's shape, not the merge's quality), mean (solid) and worst client "
        "(dashed), vs the number of clients"
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
        "barrier at 1/2 on the path client -> merge, nats,\n"
        "calibrated (path shape, not merge quality)",
        path,
        d.settings,
    )


@figure(
    "pairwise_barriers",
    lambda d: "pairwise_loss_barrier_half" in d.rows,
    shows=(
        "the N x N loss barrier at lambda = 1/2 between clients (raw), per method, for the "
        "widest width of the first cell that has the matrix"
    ),
)
def pairwise_barriers(d: FigureInputs, path: Path) -> Path | None:
    return pairwise_figure(d.rows, path, d.settings)


@figure(
    "lambda_paths",
    lambda d: "curve" in d.rows,
    shows=(
        "two-client cells: test accuracy and NLL (raw and calibrated) along theta(lam) = lam "
        "theta_a + (1 - lam) theta_b, one line per width, one column per method and value of "
        "the other varying keys"
    ),
)
def lambda_paths(d: FigureInputs, path: Path) -> Path | None:
    return lambda_path_figure(d.rows, path, d.settings)


@figure(
    "training_curves",
    lambda d: has_client_curves(d.training),
    shows=(
        "from `training.csv`: each client's training loss per epoch (log scale), one panel per "
        "width, one line per client and seed (colour: seed, line style: client); not drawn for "
        "a folder without `training.csv`, whose `report.md` convergence section says so"
    ),
)
def training_curves(d: FigureInputs, path: Path) -> Path | None:
    return training_curves_figure(d.training, path, d.settings)


@figure(
    "width_mix",
    lambda d: has_mixed_widths(d.rows),
    shows=(
        "when some cell's clients differ in width from the server (`client-widths`, "
        "`server-width`): merged accuracy (with the clients' mean and the ensemble) and the "
        'calibrated barrier at lambda = 1/2 against the width mix "client widths -> server '
        'width", solid for `init = independent`, dashed for `shared`'
    ),
)
def width_mix(d: FigureInputs, path: Path) -> Path | None:
    return width_mix_figure(d.rows, d.methods, path, d.settings)


@figure(
    "barrier_vs_weight_decay",
    lambda d: has_weight_decay_study(d.rows),
    shows=(
        "when the weight decay varies: the calibrated barrier at 1/2 and the accuracy gap of the "
        "plain average (solid) and weight matching (dashed), the clients' mean stable rank of "
        "the hidden weights and the reciprocal orthogonality, against the weight decay (evenly "
        "spaced, 0 included), one colour per width"
    ),
)
def barrier_vs_weight_decay(d: FigureInputs, path: Path) -> Path | None:
    return barrier_vs_weight_decay_figure(d.rows, path, d.settings)


@figure(
    "lewc_scale_vs_depth",
    lambda d: has_depth_study(d.rows),
    shows=(
        "when the MLP's depth varies: the plain average's accuracy (clients' mean dashed); the "
        "merge's fitted T over the logit ensemble's (solid) and its logits' norm over the logit "
        "ensemble's (dash-dot) "
        "against LEWC's prediction (dashed) and its closed form N^(1-L) at equal weights (grey "
        "dotted), log scale; not for a residual network (ResNet, ViT), which has no LEWC depth"
    ),
)
def lewc_scale_vs_depth(d: FigureInputs, path: Path) -> Path | None:
    return lewc_scale_vs_depth_figure(d.rows, path, d.settings)
