"""The clients' training in the report (:mod:`fedlmc.simulations.report.training`): one summary
row per client curve, the verdict stated only where the rule is defined, the per-width table and
the curves figure (a PNG with one panel per width, log loss over epochs)."""

from __future__ import annotations

import pandas as pd
from matplotlib.image import imread

from fedlmc.simulations.report.training import (
    client_curves,
    convergence_summary,
    convergence_verdict,
    has_client_curves,
    per_width_table,
    training_curves_figure,
)

SETTLED = [2.0, 1.0, 0.5, 0.498, 0.497, 0.4965]
FALLING = [2.0, 1.5, 1.2, 1.0, 0.9, 0.8]


def curves(losses: dict[tuple[str, float, int], list[float]]) -> pd.DataFrame:
    """``(cell, width, client) -> losses by epoch`` as training.csv rows, a FedAvg row too."""
    rows = [
        {"cell_id": cid, "width": width, "seed": 0, "phase": "client_epoch"}
        | {"client": client, "step": step, "train_loss": loss}
        for (cid, width, client), curve in losses.items()
        for step, loss in enumerate(curve, start=1)
    ]
    rows.append({"cell_id": "a", "width": 1.0, "seed": 0, "phase": "fedavg_round", "step": 1})
    return pd.DataFrame(rows)


def test_one_summary_row_per_client_curve_in_width_order():
    training = curves({("b", 2.0, 0): SETTLED, ("a", 1.0, 0): SETTLED, ("a", 1.0, 1): FALLING})
    assert len(client_curves(training)) == 18  # the fedavg_round row left out
    summary = convergence_summary(training)
    assert summary[["cell_id", "client"]].values.tolist() == [["a", 0], ["a", 1], ["b", 0]]
    assert summary["group"].tolist() == ["1", "1", "2"]
    assert summary["not_converged"].tolist() == [False, True, False]
    assert convergence_verdict(summary) is None  # a falling client: listed, no verdict
    table = per_width_table(summary)
    assert table.loc["1", "not converged"] == "1 / 2" and table.loc["2", "not converged"] == "0 / 1"
    assert table.loc["1", "final train loss, mean"] == (0.4965 + 0.8) / 2


def test_the_verdict_is_stated_only_where_every_curve_can_be_judged():
    settled = convergence_summary(curves({("a", 1.0, 0): SETTLED}))
    assert convergence_verdict(settled) == "Every client had converged by this rule."
    short = convergence_summary(curves({("a", 1.0, 0): [2.0, 1.0]}))
    verdict = convergence_verdict(short)
    assert verdict.startswith("Cannot tell whether every client had converged: 1 of 1 curves")
    assert "the run had 2" in verdict


def test_no_client_curves_no_summary_and_no_figure(tmp_path):
    empty = pd.DataFrame({"phase": ["fedavg_round"], "step": [1], "train_loss": [float("nan")]})
    assert not has_client_curves(empty) and not has_client_curves(None)
    assert convergence_summary(None).empty
    assert training_curves_figure(empty, tmp_path / "t.png", {"dpi": 50}) is None


def test_the_curves_figure_is_a_png_with_a_panel_per_width(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    training = curves({("a", 1.0, 0): SETTLED, ("b", 2.0, 0): FALLING})
    assert has_client_curves(training)
    path = training_curves_figure(training, tmp_path / "curves.png", {"dpi": 50})
    assert path == tmp_path / "curves.png" and imread(path).std() > 0
