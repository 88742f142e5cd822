"""Figures and a markdown report from a sweep's ``results.csv``.

:func:`build_report` reads ``out_dir/results.csv`` (and ``config.json`` for the title and the
``[report]`` settings), keeps the ``ok`` rows and writes, under ``out_dir/figures/``, only the
figures whose data exists:

- ``accuracy_vs_width.png``: merged test accuracy per method against the width multiplier
  (log2 axis), mean over seeds with error bars (std or sem, ``[report] error-bars``); the mean
  endpoint (client model) accuracy and the ensemble accuracy are dashed reference lines.
  ``X_t`` methods are drawn only without ``X`` (temperature never changes the argmax).
- ``barrier_vs_width.png``: two-client cells, the loss barrier at lambda = 1/2 (signed, the
  paper's Table 1 quantity) with raw logits (solid) and a fitted temperature (dashed), per method.
- ``merge_gap_vs_width.png``: any number of clients, the merged model's test NLL minus the mean
  endpoint's, raw (solid) and calibrated (dashed), per method; not drawn when it equals the
  barrier figure on every row (two clients of equal weight), which ``report.md`` says.
- ``temperature_vs_width.png``: the fitted temperature of the ``_t`` methods (solid) and, where
  rows have it, the server split's temperature for the same merged model (dashed).
- ``lewc_layers.png``: LEWC cosine per layer (1 = the merged layer output equals the
  exponentially weighted prediction), one line per width, one panel per method and value of
  the other varying keys; top: for the same input (solid) and its baseline, the prediction for a
  shuffled input (dashed); bottom: centred on the mean over inputs (results folders without
  these columns: the raw cosine alone).
- ``lewc_vs_llfc.png``: per layer, on the combined weights (before BatchNorm re-estimation or
  REPAIR), top: the measured norm ratio ``||f_l(merged)|| / ||sum_i w_i f_l(theta_i)||``
  (solid) against LEWC's prediction of it (dashed; LLFC makes no claim about the scale);
  bottom: the relative error of LEWC's prediction (solid) and of LLFC's at its best positive
  scale (dashed); one line per width, one column per method and value of the other varying keys.
- ``dead_units_and_bias_share.png``: per layer of the plain average (and ``average_lewc_bias``),
  the fraction of hidden units never active on the diagnostic inputs (top) and the share of the
  pre-activation that comes from the bias (bottom); one line per client count (or width).
- ``accuracy_vs_alpha.png`` / ``accuracy_vs_clients.png``: when ``alpha`` / ``num-clients`` vary.
- ``merge_gap_by_init_vs_clients.png`` / ``merge_gap_by_init_vs_alpha.png``: when the
  initialisation (``init``, ``warmup-rounds``) and ``num-clients`` / ``alpha`` vary: the accuracy
  gap of ``average_t`` and ``merge_many_t`` to the clients' mean (solid) and to the ensemble
  (dashed), one line per width, one panel per method and initialisation setting, one y axis
  (:mod:`fedlmc.simulations.init_figures`; the IID cells right of the largest alpha).
- ``client_barriers_vs_clients.png``: cells of three or more clients, the calibrated loss
  barrier at lambda = 1/2 on each client's path to the merge (the path's shape, not the merge's
  quality), mean (solid) and worst client (dashed), against the number of clients.
- ``pairwise_barriers.png``: the N x N loss barrier at lambda = 1/2 between clients (raw), per
  method, for the widest width of the first cell that has the matrix.
- ``lambda_paths.png``: test accuracy and NLL (raw and calibrated) along
  ``theta(lam) = lam theta_a + (1 - lam) theta_b`` for two-client cells, one line per width,
  one column per method and value of the other varying keys.
- ``training_curves.png``: from ``training.csv``, each client's training loss per epoch (log
  scale), one panel per width, one line per client and seed; not drawn for a folder without
  ``training.csv``, whose ``report.md`` convergence section says so.
- ``width_mix.png``: when some cell's clients differ in width from the server
  (``client-widths``, ``server-width``): merged accuracy (with the clients' mean and the
  ensemble) and the calibrated barrier at lambda = 1/2 against the width mix ``"client widths ->
  server width"``, solid for ``init = independent``, dashed for ``shared``
  (:mod:`fedlmc.simulations.width_figures`).
- ``barrier_vs_weight_decay.png``: when the weight decay varies (two-client cells): the
  calibrated loss barrier at lambda = 1/2 and the accuracy gap of the plain average (solid) and
  weight matching (dashed), the clients' mean stable rank of the hidden weights and the
  reciprocal orthogonality of the unaligned clients against the weight decay (evenly spaced,
  0 included), one colour per width (:mod:`fedlmc.simulations._new_study_figures`).
- ``lewc_scale_vs_depth.png``: when the MLP's depth varies: the plain average's test accuracy
  (and the clients' mean), and the merge's fitted T over the logit ensemble's and the logit
  norm ratio against LEWC's prediction and its closed form ``N^(1-L)``, against the depth.

When a config key other than the x axis and ``seed`` varies too, figures get one panel per
value combination of those keys. Every figure is titled with what was run; panels of one
quantity share the y axis; coinciding methods are drawn once
(:mod:`fedlmc.simulations.figures`). ``report.md`` holds the tables (markdown) and links to the
figures.

The parts: the rows and tables in :mod:`fedlmc.simulations.report_data`, the drawing functions in
:mod:`fedlmc.simulations.figures`, which figure is drawn from which rows into which file in
:mod:`fedlmc.simulations.figure_table` (:data:`~fedlmc.simulations.figure_table.FIGURE_TABLE`, one
registration per figure), the text of ``report.md`` in :mod:`fedlmc.simulations.report_markdown`;
this module writes them (:func:`build_report`) and re-exports their public names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fedlmc.io import atomic_write_text
from fedlmc.simulations.figure_table import FIGURE_TABLE, draw_figures
from fedlmc.simulations.report_data import ok_rows
from fedlmc.simulations.report_markdown import markdown_table, report_markdown
from fedlmc.simulations.report_schema import REPORT_SCHEMA
from fedlmc.simulations.sweep import read_results, summary_table, varying_keys
from fedlmc.simulations.training_file import read_training

FIGURES = "figures"


def report_settings(record: dict[str, Any]) -> dict[str, Any]:
    """The ``[report]`` settings of ``config.json`` over the defaults."""
    settings = {k: spec.default for k, spec in REPORT_SCHEMA.items()}
    settings.update(record.get("report", {}))
    return settings


def build_report(out_dir: str | os.PathLike) -> list[Path]:
    """Write the figures and ``report.md`` of the sweep in ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    if not (out_dir / "results.csv").exists():
        raise ValueError(f"out_dir={str(out_dir)!r} has no results.csv; run the sweep first")
    results = read_results(out_dir)
    record = read_record(out_dir)
    settings = report_settings(record)
    rows = ok_rows(results)
    training = read_training(out_dir)
    figures = draw_figures(rows, out_dir / FIGURES, settings, training)
    report = out_dir / "report.md"
    text = report_markdown(results, record, figures, out_dir, settings, training)
    atomic_write_text(report, text)
    return [*figures, report]


def read_record(out_dir: Path) -> dict[str, Any]:
    """``config.json`` of the sweep, or an empty dict."""
    try:
        return json.loads((out_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


__all__ = [
    "FIGURES",
    "FIGURE_TABLE",
    "build_report",
    "draw_figures",
    "markdown_table",
    "ok_rows",
    "read_record",
    "report_markdown",
    "report_settings",
    "summary_table",
    "varying_keys",
]
