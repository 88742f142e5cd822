"""The report of a real (tiny) sweep: the figures whose data exists, report.md and
report_full.md."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.image import imread

from fedlmc.simulations.records.results_file import read_results
from fedlmc.simulations.records.row_groups import varying_keys
from fedlmc.simulations.records.training_file import read_training
from fedlmc.simulations.report.build import REPORT_MARKER, build_report
from fedlmc.simulations.report.markdown import markdown_table

try:  # rootdir on sys.path, or tests/ itself (pytest's default import mode)
    from tests.simulations.runs.test_sweep import shared_sweep
except ImportError:
    from tests.simulations.runs.test_sweep import shared_sweep


@pytest.fixture(scope="session")
def sweep_dir(tmp_path_factory) -> Path:
    # test_sweep's uninterrupted sweep, run once for every file that reads it
    return shared_sweep(tmp_path_factory)


@pytest.mark.slow
def test_report_writes_figures_and_markdown(tmp_path, sweep_dir):
    out = tmp_path / "sweep"
    shutil.copytree(sweep_dir, out)
    paths = build_report(out)
    names = {p.name for p in paths}
    # width varies, there are _t methods, two clients give barriers and lambda paths,
    # diagnostics give LEWC per layer; alpha and num-clients do not vary: no such figures;
    # two clients of equal weight: the merge gap is the barrier at 1/2, drawn once
    assert names == {
        "accuracy_vs_width.png",
        "barrier_vs_width.png",
        "temperature_vs_width.png",
        "lewc_layers.png",
        "lewc_vs_llfc.png",
        "dead_units_and_bias_share.png",
        "lambda_paths.png",
        "training_curves.png",
        "report.md",
        "report_full.md",
    }
    for path in paths:
        assert path.exists() and path.stat().st_size > 0
    pictures = [p for p in paths if p.suffix == ".png"]
    for path in pictures:
        image = imread(path)
        assert image.shape[0] > 100 and image.shape[1] > 100 and image.std() > 0
    short = (out / "report.md").read_text()
    assert "[report_full.md](report_full.md)" in short and len(short) < len(
        (out / "report_full.md").read_text()
    )
    assert all(f"](figures/{path.name})" in short for path in pictures)

    text = (out / "report_full.md").read_text()
    frame = read_results(out)
    assert text.startswith(f"{REPORT_MARKER}\n# tiny\n")  # fedlmc's report, recognisably
    assert "## Merged test accuracy" in text and "## Fitted temperature" in text
    # every LEWC number says which weights it measures
    scope = text.split("## What the LEWC and LLFC columns measure")[1].split("##")[0]
    assert "| average | combined weights (the evaluated merge) | defined |" in scope
    assert "merge_gap_vs_width is not drawn: on every row the merge gap equals" in text
    # the paper's Table 1: barriers at lambda = 1/2, per width, accuracy as a fraction (one
    # unit per quantity: the per-method tables show the same barrier)
    first = text.split("the paper's Table 1 layout")[1].split("##")[0]
    assert "| width | no permutation: accuracy barrier | no permutation: loss barrier |" in first
    # one seed per width: every cell names its count (n=1), with no spread
    accuracy = frame[frame["method"] == "average"].groupby("width")["accuracy_barrier_half"]
    for width, value in accuracy.mean().items():
        assert f"| {width:g} | {value:.4f} (n=1) | " in first
    plain = frame[frame["method"] == "average"].groupby("width")["loss_barrier_half"].mean()
    for width, value in plain.items():
        assert f"| {width:g} | " in first and f" {value:.4f} (n=1) |" in first
    assert "±" not in first.split("|", 1)[1]
    for path in pictures:
        assert f"](figures/{path.name})" in text
    # the table holds the mean accuracy of each method at each width, 4 decimals
    table = text.split("## Merged test accuracy")[1].split("##")[0]
    widths = sorted(frame["width"].unique())
    assert "| method | " + " | ".join(f"{w:g}" for w in widths) + " |" in table
    for method in ("average", "weight_matching", "ensemble"):
        accs = frame[frame["method"] == method].sort_values("width")["accuracy"]
        assert f"| {method} | " + " | ".join(f"{a:.4f} (n=1)" for a in accs) + " |" in table
    # the convergence section: per width, the clients' final-epoch loss from training.csv
    convergence = text.split("## Convergence of the clients' training")[1].split("##")[0]
    training = read_training(out)
    for width, losses in training.groupby("width")["train_loss"]:
        assert f"| {width:g} | 1 | {losses.mean():.4f} |" in convergence


@pytest.mark.slow
def test_report_draws_only_what_exists(tmp_path, sweep_dir):
    """Without diagnostics columns and with one width only, only the width plots remain."""
    out = tmp_path / "sweep"
    shutil.copytree(sweep_dir, out)
    frame = read_results(out)
    frame = frame[frame["width"] == frame["width"].min()]
    dropped = ["lewc_cos_layers", "lewc_cos_mean", "curve", "norm_ratio_layers"]
    dropped.append("dead_unit_fraction_layers")
    frame.drop(columns=dropped).to_csv(out / "results.csv", index=False)
    (out / "training.csv").unlink()  # a results folder from before training curves existed
    names = {p.name for p in build_report(out)}
    assert names == {
        "accuracy_vs_width.png",
        "barrier_vs_width.png",
        "temperature_vs_width.png",
        "report.md",
        "report_full.md",
    }
    text = (out / "report_full.md").read_text()
    assert "No training.csv in this folder" in text.split("## Convergence")[1]


def test_report_of_missing_results_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="results.csv"):
        build_report(tmp_path)


def test_markdown_table_and_varying_keys():
    frame = pd.DataFrame({"a": [1.0, 2.5]}, index=pd.Index(["x", "y"], name="method"))
    assert markdown_table(frame) == "| method | a |\n|---|---|\n| x | 1.0000 |\n| y | 2.5000 |"
    rows = pd.DataFrame({"width": [1.0, 2.0], "seed": [0, 0], "method": ["m", "m"]})
    assert varying_keys(rows) == ["width"]


def test_n_client_figures_are_drawn_from_their_columns(tmp_path):
    """Client-to-merge barriers against the number of clients, and the pairwise matrix."""
    import json

    from fedlmc.simulations.report.figure_table import draw_figures
    from fedlmc.simulations.report.markdown import report_markdown

    rows = []
    for clients in (3, 4):
        for seed in (0, 1):
            for method, base in (("average", 0.5), ("weight_matching", 0.1)):
                matrix = [
                    [0.0 if i == j else base * (i + j) for j in range(clients)]
                    for i in range(clients)
                ]
                rows.append(
                    {
                        "cell_id": f"c{clients}{seed}",
                        "status": "ok",
                        "method": method,
                        "width": 1.0,
                        "seed": seed,
                        "num-clients": clients,
                        "accuracy": 0.9 - base / clients,
                        "client_to_merge_path_loss_barrier_half_calibrated_mean": base * clients,
                        "client_to_merge_path_loss_barrier_half_calibrated_worst": 2
                        * base
                        * clients,
                        "pairwise_loss_barrier_half": json.dumps(matrix),
                    }
                )
    frame = pd.DataFrame(rows)
    settings = {"dpi": 60, "error-bars": "std", "title": ""}
    paths = {p.name: p for p in draw_figures(frame, tmp_path, settings)}
    assert {"client_barriers_vs_clients.png", "pairwise_barriers.png"} <= set(paths)
    for name in ("client_barriers_vs_clients.png", "pairwise_barriers.png"):
        assert imread(paths[name]).std() > 0
    text = report_markdown(frame, {}, list(paths.values()), tmp_path, settings)
    heading = (
        "## Barrier at 1/2 on the path client -> merge, calibrated, T refitted at every lambda, "
        "endpoints included, worst client"
    )
    assert heading in text


def paired_rows(gap_shift: float) -> pd.DataFrame:
    """Two-client rows of two methods at two widths and two bias values; without biases
    ``average_lewc_bias_t`` equals ``average`` (as by definition), the merge gaps equal the
    barriers at 1/2 plus ``gap_shift``."""
    rows = []
    for bias in (False, True):
        for width in (1.0, 2.0):
            for method in ("average", "average_lewc_bias_t"):
                shift = 0.1 if bias and method != "average" else 0.0
                barrier = 0.5 / width + shift
                rows.append(
                    {
                        "cell_id": f"{bias}{width}",
                        "status": "ok",
                        "method": method,
                        "dataset": "mnist5k",
                        "model": "mlp",
                        "num-clients": 2,
                        "epochs": 3,
                        "width": width,
                        "bias": bias,
                        "seed": 0,
                        "accuracy": 0.9 - barrier,
                        "nll": 0.3 + barrier,
                        "loss_barrier_half": barrier,
                        "merge_gap_loss": barrier + gap_shift,
                        "accuracy_barrier_half": barrier / 2,
                        "merge_gap_accuracy": barrier / 2 + gap_shift,
                    }
                )
    return pd.DataFrame(rows)


def test_a_figure_or_table_that_would_repeat_another_is_left_out_and_said_so(tmp_path):
    from fedlmc.simulations.report.figure_table import draw_figures
    from fedlmc.simulations.report.markdown import report_markdown

    settings = {"dpi": 60, "error-bars": "std", "title": ""}
    same = paired_rows(gap_shift=0.0)
    names = {p.name for p in draw_figures(same, tmp_path, settings)}
    assert "barrier_vs_width.png" in names and "merge_gap_vs_width.png" not in names
    text = report_markdown(same, {}, [tmp_path / n for n in names], tmp_path, settings)
    assert "merge_gap_vs_width is not drawn" in text
    notes = [line for line in text.splitlines() if " equals " in line and "every cell" in line]
    assert notes == [
        "average_lewc_bias_t equals average on every cell where bias=False (same accuracy and "
        "NLL: the figures draw them once)."
    ]
    barrier = text.split("## Loss barrier at lambda = 1/2 (signed), raw logits")[1]
    assert barrier.split("##")[0].strip().startswith('Equal to "Merge gap, loss')
    assert "| average (bias=False) |" not in barrier.split("##")[0]
    # gaps that differ from the barriers (unequal weights, three clients): both, and the
    # stale figure of the earlier report is gone
    stale = tmp_path / "merge_gap_vs_width.png"
    stale.write_bytes(b"old")
    differ = paired_rows(gap_shift=0.05)
    names = {p.name for p in draw_figures(differ, tmp_path, settings)}
    assert {"barrier_vs_width.png", "merge_gap_vs_width.png"} <= names
    assert stale.read_bytes() != b"old"
    text = report_markdown(differ, {}, [], tmp_path, settings)
    assert "Equal to" not in text and "is not drawn" not in text
    draw_figures(same, tmp_path, settings)
    assert not stale.exists()


def test_figures_are_titled_coinciding_methods_drawn_once_and_styles_in_the_legend():
    import matplotlib

    matplotlib.use("Agg")
    from fedlmc.simulations.report.data import aggregate, run_title
    from fedlmc.simulations.report.plotting import (
        coinciding,
        coinciding_label,
        figure_title,
        panel_grid,
        save,
        style_legend,
    )

    rows = paired_rows(gap_shift=0.0)
    assert run_title(rows) == "mnist5k, mlp, 2 clients, 3 epochs"
    assert run_title(rows.assign(partition="iid")) == (
        "mnist5k, mlp, 2 clients, partition iid, 3 epochs"
    )
    assert (
        run_title(rows.assign(**{"num-clients": [2, 4] * 4}))
        == "mnist5k, mlp, 2-4 clients, 3 epochs"
    )
    for bias, expected in ((False, [["average", "average_lewc_bias_t"]]), (True, None)):
        part = rows[rows["bias"] == bias]
        tables = {
            m: [aggregate(part[part["method"] == m], ["width"], "accuracy", "std")]
            for m in ("average", "average_lewc_bias_t")
        }
        groups = list(coinciding(tables).values())
        assert groups == (expected or [["average"], ["average_lewc_bias_t"]])
    assert coinciding_label(["average", "average_lewc_bias_t"]) == (
        "average = average_lewc_bias_t (identical here)"
    )
    fig, axes = panel_grid(2, sharey=True)
    axes[0, 0].plot([1, 2], [0, 1], label="average")
    axes[0, 1].plot([1, 2], [5, 6])
    assert axes[0, 0].get_ylim() == axes[0, 1].get_ylim()  # one y axis for one quantity
    style_legend(axes[0, 0], [("-", "raw logits"), ("--", "fitted temperature")])
    legend = [t.get_text() for t in axes[0, 0].get_legend().get_texts()]
    assert legend == ["average", "raw logits", "fitted temperature"]
    with figure_title("quick - mnist5k, mlp, 2 clients"):
        save(fig, Path(matplotlib.get_cachedir()) / "t.png", 40)
    assert fig._suptitle.get_text() == "quick - mnist5k, mlp, 2 clients"


def test_report_shows_auto_choices_temperature_gaps_and_communication(tmp_path):
    """auto's pick and cost against weight matching per width; log T gap to the server split
    per calibration-holdout; what the clients sent and the rounds per method."""

    from fedlmc.simulations.report.markdown import report_markdown

    rows = []
    for width in (1.0, 8.0):
        for seed in (0, 1):
            wide = width == 8.0
            for method, seconds in (("auto", 0.1 if wide else 1.2), ("weight_matching", 1.0)):
                rows.append(
                    {
                        "cell_id": f"{method}{width}{seed}",
                        "status": "ok",
                        "method": method,
                        "width": width,
                        "seed": seed,
                        "accuracy": 0.9,
                        "merge_seconds": seconds,
                        "auto_choice": ("average" if wide else "weight_matching")
                        if method == "auto"
                        else "",
                        "auto_nll_gap": (0.01 if wide else 0.3) if method == "auto" else math.nan,
                        "bytes_sent_by_clients": 2000 if method == "auto" else 1000,
                        "rounds": 4 if method == "auto" else 1,
                    }
                )
            for holdout, ratio in ((0.0, 0.5), (0.1, 1.0)):
                rows.append(
                    {
                        "cell_id": f"cal{width}{seed}{holdout}",
                        "status": "ok",
                        "method": "average_t",
                        "width": width,
                        "seed": seed,
                        "calibration-holdout": holdout,
                        "accuracy": 0.8,
                        "temperature": 2.0 * ratio,
                        "temperature_server_split": 2.0,
                    }
                )
    frame = pd.DataFrame(rows)
    settings = {"dpi": 60, "error-bars": "std", "title": ""}
    text = report_markdown(frame, {}, [], tmp_path, settings)

    auto = text.split("## auto: the merge it picked")[1].split("##")[0]
    assert (
        "| 1 | weight_matching x2 | 0.3000 ± 0.0000 (n=2) | 1.2000 ± 0.0000 (n=2) "
        "| 1.0000 ± 0.0000 (n=2) | 1.2000 |" in auto
    )
    assert (
        "| 8 | average x2 | 0.0100 ± 0.0000 (n=2) | 0.1000 ± 0.0000 (n=2) "
        "| 1.0000 ± 0.0000 (n=2) | 0.1000 |" in auto
    )

    gap = text.split("log T (as calibrated) - log T (fitted on the server split)")[1]
    gap = gap.split("##")[0]
    assert f"| average_t (calibration-holdout=0) | {math.log(0.5):.4f} ± 0.0000 (n=2) |" in gap
    assert "| average_t (calibration-holdout=0.1) | 0.0000 ± 0.0000 (n=2) |" in gap

    sent = text.split("## Communication")[1].split("##")[0]
    assert "| auto | 2.0 kB / 4 | 2.0 kB / 4 |" in sent
    assert "| weight_matching | 1.0 kB / 1 | 1.0 kB / 1 |" in sent


def curve_rows(cid: str, width: float, seed: int, losses: dict[int, list[float]]) -> list[dict]:
    return [
        {
            "cell_id": cid,
            "width": width,
            "seed": seed,
            "phase": "client_epoch",
            "client": client,
            "step": step,
            "train_loss": loss,
            "train_accuracy": 0.5,
        }
        for client, curve in losses.items()
        for step, loss in enumerate(curve, start=1)
    ]


def convergence_text(tmp_path, curves: pd.DataFrame) -> str:
    from fedlmc.simulations.report.markdown import report_markdown

    cells = curves.drop_duplicates("cell_id")
    rows = cells[["cell_id", "width", "seed"]].assign(status="ok", method="average", accuracy=0.8)
    settings = {"dpi": 60, "error-bars": "std", "title": ""}
    text = report_markdown(rows, {}, [], tmp_path, settings, curves)
    return text.split("## Convergence of the clients' training")[1].split("## ")[0]


def test_convergence_verdict_only_where_the_rule_is_defined(tmp_path):
    """A 2-epoch run (the issue's: never settled, losses 1.08 to 1.46) cannot be judged by a
    rule over the last 2 epochs: no 'had converged' verdict, the reason instead."""
    two_epochs = pd.DataFrame(
        curve_rows("aaaaaaaaaaaa", 1.0, 0, {0: [2.3, 1.46], 1: [2.2, 1.08]})
        + curve_rows("bbbbbbbbbbbb", 1.0, 1, {0: [2.1, 1.3], 1: [2.4, 1.2]})
    )
    section = convergence_text(tmp_path, two_epochs)
    assert "Every client had converged" not in section
    assert "Cannot tell whether every client had converged: 4 of 4 curves" in section
    assert "needs at least 3 epochs, the run had 2" in section
    assert "| cannot tell for 4 / 4 |" in section
    # three flat epochs: the rule is defined and true, so the verdict is stated
    flat = pd.DataFrame(curve_rows("aaaaaaaaaaaa", 1.0, 0, {0: [1.0, 0.99, 0.99]}))
    section = convergence_text(tmp_path, flat)
    assert "Every client had converged by this rule." in section and "Cannot tell" not in section
    # a run with one falling client is flagged whatever the unjudged curves are
    mixed = pd.DataFrame(
        curve_rows("aaaaaaaaaaaa", 1.0, 0, {0: [2.0, 1.5, 1.2, 1.0], 1: [1.0, float("nan")]})
    )
    section = convergence_text(tmp_path, mixed)
    assert "| aaaaaaaaaaaa | 1 | 0 (33.3%) |" in section and "Every client had" not in section
    assert "cannot judge 1 other curve" in section


def test_convergence_section_flags_a_falling_client_and_the_curves_are_drawn(tmp_path):
    from fedlmc.simulations.report.figure_table import draw_figures
    from fedlmc.simulations.report.markdown import report_markdown

    settled = [2.0, 1.0, 0.5, 0.498, 0.497, 0.4965]
    falling = [2.0, 1.5, 1.2, 1.0, 0.9, 0.8]
    curves = pd.DataFrame(
        curve_rows("aaaaaaaaaaaa", 1.0, 0, {0: settled, 1: settled})
        + curve_rows("bbbbbbbbbbbb", 2.0, 0, {0: settled, 1: falling})
        + curve_rows("cccccccccccc", 2.0, 1, {0: settled, 1: settled})
    )
    rows = pd.DataFrame(
        {
            "cell_id": ["aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"],
            "status": "ok",
            "method": "average",
            "width": [1.0, 2.0, 2.0],
            "seed": [0, 0, 1],
            "accuracy": [0.8, 0.85, 0.86],
        }
    )
    settings = {"dpi": 60, "error-bars": "std", "title": ""}
    paths = {p.name: p for p in draw_figures(rows, tmp_path, settings, curves)}
    assert imread(paths["training_curves.png"]).std() > 0
    assert "training_curves.png" not in {p.name for p in draw_figures(rows, tmp_path, settings)}
    text = report_markdown(rows, {}, list(paths.values()), tmp_path, settings, curves)
    section = text.split("## Convergence of the clients' training")[1].split("## ")[0]
    final = (0.4965 * 3 + 0.8) / 4
    assert "| 1 | 6 | 0.4965 | 0.4965 | 0.4965 | 3.0000 | 3.0000 | 0 / 2 | 0 / 2 |" in section
    assert f"| 2 | 6 | {final:.4f} | 0.4965 | 0.8000 | 3.0000 | 3.0000 | 1 / 4 | 1 / 4 |" in section
    assert "| bbbbbbbbbbbb | 2 | 1 (20.0%) |" in section
    assert "aaaaaaaaaaaa" not in section and "cccccccccccc" not in section
