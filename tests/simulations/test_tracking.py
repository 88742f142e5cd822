"""The trackers, for real: a results folder exported to TensorBoard (read back with
TensorBoard's own ``EventAccumulator``) and to an MLflow store (queried with ``MlflowClient``);
exporting again adds nothing; the CLI refuses an unknown tracker and a missing extra before any
work.

The folder is written here in the shapes the sweep writes (``results.csv`` validated by
:func:`fedlmc.simulations.records.results_file.read_results`, ``training.csv`` as the ServerApp
writes it, real PNG figures); the slow test exports the tiny real sweep of ``test_sweep``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedlmc.simulations.cli import main
from fedlmc.simulations.records.results_file import read_results
from fedlmc.simulations.tracking import export_folder, tracker_names
from fedlmc.simulations.tracking.runs import tracked_runs

REPO = Path(__file__).resolve().parents[2]
CELLS = ("0123456789ab", "abcdef012345")
FAILED = "ffffffffffff"
NAN = float("nan")


def write_png(path: Path, seed: int) -> None:
    from matplotlib.image import imsave

    path.parent.mkdir(parents=True, exist_ok=True)
    imsave(path, np.random.default_rng(seed).random((12, 20, 3)))


def results_rows(cid: str, width: float) -> list[dict]:
    lead = {"cell_id": cid, "status": "ok", "error": "", "width": width, "seed": 0}
    lead |= {"epochs": 2, "methods": "average,ensemble", "diagnostics": True}
    return [
        {**lead, "method": "average", "accuracy": 0.5 + width, "nll": 1.25, "temperature": 1.5},
        {**lead, "method": "ensemble", "accuracy": 0.625 + width, "nll": 0.75, "temperature": NAN},
    ]


def training_rows(cid: str, width: float) -> list[dict]:
    lead = {"cell_id": cid, "width": width, "seed": 0}
    rows = []
    for client in (0, 1):
        for epoch in (1, 2):
            loss = 2.0 / epoch + 0.1 * client + width
            rows.append(
                {**lead, "phase": "client_epoch", "client": client, "step": epoch}
                | {"train_loss": loss, "train_accuracy": 0.3 * epoch, "fedavg_accuracy": NAN}
            )
    for step in (1, 2):
        rows.append(
            {**lead, "phase": "fedavg_round", "client": "", "step": step}
            | {"train_loss": NAN, "train_accuracy": NAN, "fedavg_accuracy": 0.4 * step}
        )
    return rows


def sweep_folder(root: Path, cells=CELLS) -> Path:
    """A sweep's out dir: config.json, results.csv (a failed cell too), training.csv, figures,
    report.md."""
    root.mkdir(parents=True, exist_ok=True)
    widths = [0.25 * (i + 1) for i in range(len(cells))]
    results = [row for cid, w in zip(cells, widths, strict=True) for row in results_rows(cid, w)]
    failed = {**results_rows(FAILED, 1.0)[0], "status": "failed", "method": NAN}
    failed |= {"error": "ValueError: too few clients", "accuracy": NAN, "nll": NAN}
    pd.DataFrame([*results, failed]).to_csv(root / "results.csv", index=False)
    training = [r for cid, w in zip(cells, widths, strict=True) for r in training_rows(cid, w)]
    pd.DataFrame(training).to_csv(root / "training.csv", index=False)
    record = {"name": "tiny-track", "grid": {"width": widths}, "cells": []}
    (root / "config.json").write_text(json.dumps(record))
    write_png(root / "figures" / "accuracy_vs_width.png", 0)
    write_png(root / "figures" / "training_curves.png", 1)
    (root / "report.md").write_text("# tiny-track\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    return root


def expected_steps(folder: Path, cid: str) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from training.csv, NaN left out."""
    frame = pd.read_csv(folder / "training.csv", dtype={"cell_id": str, "client": str})
    frame = frame[frame["cell_id"] == cid]
    found: dict[str, list[tuple[int, float]]] = {}
    for _, row in frame.iterrows():
        prefix = (
            f"client_epoch/client-{row['client']}"
            if row["phase"] == "client_epoch"
            else "fedavg_round"
        )
        for metric in ("train_loss", "train_accuracy", "fedavg_accuracy"):
            if not math.isnan(row[metric]):
                found.setdefault(f"{prefix}/{metric}", []).append((int(row["step"]), row[metric]))
    return found


def expected_rows(folder: Path, cid: str) -> dict[str, float]:
    """<method>/<column> -> value from results.csv, NaN left out."""
    frame = read_results(folder)
    found = {}
    for _, row in frame[frame["cell_id"] == cid].iterrows():
        for column in ("accuracy", "nll", "temperature"):
            if not math.isnan(row[column]):
                found[f"{row['method']}/{column}"] = row[column]
    return found


# ----------------------------------------------------------------------------- TensorBoard


def accumulator(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    return events


def hparams_of(events) -> dict:
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    values = HParamsPluginData.FromString(content).session_start_info.hparams
    return {k: getattr(v, v.WhichOneof("kind")) for k, v in values.items()}


def run_dir(cid: str, width: float) -> str:
    """A cell's TensorBoard run (log dir) name: its grid values, then its cell id."""
    return f"width={width} cell={cid}"


def test_tensorboard_event_files_read_back(tmp_path):
    folder = sweep_folder(tmp_path / "sweep")
    summary = export_folder(folder, "tensorboard")
    track_dir = folder / "tensorboard"
    assert summary.written == (*CELLS, "report") and summary.skipped == ()
    dirs = {cid: run_dir(cid, w) for cid, w in zip(CELLS, (0.25, 0.5), strict=True)}
    assert sorted(p.name for p in track_dir.iterdir()) == sorted([*dirs.values(), "report"])
    for cid in CELLS:
        events = accumulator(track_dir / dirs[cid])
        steps, rows = expected_steps(folder, cid), expected_rows(folder, cid)
        assert set(events.Tags()["scalars"]) == set(steps) | set(rows)  # NaN: no tag
        for tag, points in steps.items():
            got = [(e.step, e.value) for e in events.Scalars(tag)]
            assert got == [(s, float(np.float32(v))) for s, v in points], tag  # float32
        for tag, value in rows.items():
            assert [(e.step, e.value) for e in events.Scalars(tag)] == [
                (0, float(np.float32(value)))
            ]
        width = read_results(folder).query("cell_id == @cid")["width"].iloc[0]
        assert hparams_of(events) == {
            "width": width,
            "seed": 0,
            "epochs": 2,
            "methods": "average,ensemble",
            "diagnostics": True,
        }
    report = accumulator(track_dir / "report")
    images = report.Tags()["images"]
    assert sorted(images) == ["figures/accuracy_vs_width", "figures/training_curves"]
    for tag in images:
        (image,) = report.Images(tag)
        png = (folder / "figures" / f"{tag.split('/')[1]}.png").read_bytes()
        assert image.encoded_image_string == png and (image.width, image.height) == (20, 12)
    assert report.Tags()["tensors"] == ["report/text_summary"]


def test_tensorboard_export_is_idempotent_and_adds_new_cells(tmp_path):
    folder = sweep_folder(tmp_path / "sweep", cells=CELLS[:1])
    export_folder(folder, "tensorboard")
    track_dir = folder / "tensorboard"
    files = {p: p.stat().st_mtime_ns for p in track_dir.rglob("*")}
    again = export_folder(folder, "tensorboard")
    assert again.written == () and again.skipped == (CELLS[0], "report")
    assert {p: p.stat().st_mtime_ns for p in track_dir.rglob("*")} == files  # nothing rewritten

    # a resumed sweep: one more cell, a new report; a killed export left its marker pending
    sweep_folder(folder, cells=CELLS)
    (track_dir / "report" / ".fedlmc-exported").write_text("pending\n")
    third = export_folder(folder, "tensorboard")
    assert third.written == (CELLS[1], "report") and third.skipped == (CELLS[0],)
    assert len(list((track_dir / "report").glob("events.out.tfevents.*"))) == 1  # replaced
    first = track_dir / run_dir(CELLS[0], 0.25)
    assert len(list(first.glob("events.out.tfevents.*"))) == 1


def test_cli_track_refuses_a_users_folder_at_a_run_name_and_deletes_nothing(tmp_path, capsys):
    folder = sweep_folder(tmp_path / "sweep", cells=CELLS[:1])
    mine = tmp_path / "tb" / "report"
    mine.mkdir(parents=True)
    (mine / "draft.md").write_text("mine\n")
    code = main(["track", str(folder), "--to", "tensorboard", "--track-dir", str(tmp_path / "tb")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "'report' there was not written" in err
    assert "allowed: " in err
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["report"]  # nothing written
    assert (mine / "draft.md").read_text() == "mine\n"


def test_tensorboard_run_names_carry_the_grid_values_and_replace_older_names(tmp_path):
    """A cell's run is named by its grid keys (a linked axis gives each of its keys), as in
    MLflow; a log dir an older export named by the cell id alone is replaced, not duplicated."""
    folder = sweep_folder(tmp_path / "sweep")
    record = {"name": "t", "grid": {"seed": [0], "width+epochs": [[0.25, 2], [0.5, 2]]}}
    (folder / "config.json").write_text(json.dumps(record))
    old = folder / "tensorboard" / CELLS[0]  # how fedlmc named it before
    old.mkdir(parents=True)
    (old / ".fedlmc-exported").write_text("0123\n")
    runs = {run.key: run for run in tracked_runs(folder)}
    assert runs[CELLS[1]].name == f"{CELLS[1]} seed=0 width=0.5 epochs=2"  # MLflow's name
    export_folder(folder, "tensorboard")
    names = sorted(p.name for p in (folder / "tensorboard").iterdir())
    assert names == [
        "report",
        f"seed=0 width=0.25 epochs=2 cell={CELLS[0]}",
        f"seed=0 width=0.5 epochs=2 cell={CELLS[1]}",
    ]


def test_a_run_folder_is_one_run(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    rows = pd.DataFrame(results_rows("", 0.5)).drop(columns=["cell_id", "status", "error"])
    rows.to_csv(folder / "results.csv", index=False)
    training = pd.DataFrame(training_rows("", 0.5)).drop(columns=["cell_id"])
    training.to_csv(folder / "training.csv", index=False)
    (run,) = tracked_runs(folder)
    assert run.key.startswith("run-") and len(run.key) == 16 and run.kind == "run"
    assert dict(run.row_metrics)["ensemble/accuracy"] == 0.625 + 0.5
    assert ("client_epoch/client-1/train_loss", 2, 1.0 + 0.1 + 0.5) in run.step_metrics
    assert export_folder(folder, "tensorboard").written == (run.key,)
    assert accumulator(folder / "tensorboard" / run.key).Scalars("fedavg_round/fedavg_accuracy")


# ----------------------------------------------------------------------------- MLflow


def test_mlflow_store_queried_through_its_client(tmp_path):
    from mlflow.tracking import MlflowClient

    folder = sweep_folder(tmp_path / "sweep", cells=CELLS[:1])
    first = export_folder(folder, "mlflow")
    assert first.destination == f"sqlite:///{folder.resolve() / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=first.destination)
    experiment = client.get_experiment_by_name("tiny-track")
    (cell,) = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`fedlmc.cell_id` = '{CELLS[0]}'"
    )
    assert cell.info.run_name == f"{CELLS[0]} width=0.25"
    assert cell.data.params == {
        "width": "0.25",
        "seed": "0",
        "epochs": "2",
        "methods": "average,ensemble",
        "diagnostics": "True",
    }
    steps, rows = expected_steps(folder, CELLS[0]), expected_rows(folder, CELLS[0])
    assert set(cell.data.metrics) == set(steps) | set(rows)
    for tag, points in steps.items():
        history = client.get_metric_history(cell.info.run_id, tag)
        assert sorted((m.step, m.value) for m in history) == points, tag  # float64, exact
    for tag, value in rows.items():
        assert [(m.step, m.value) for m in client.get_metric_history(cell.info.run_id, tag)] == [
            (0, value)
        ]
    (report,) = client.search_runs(
        [experiment.experiment_id], filter_string="tags.`fedlmc.kind` = 'report'"
    )
    listed = [a.path for a in client.list_artifacts(report.info.run_id, "figures")]
    assert listed == ["figures/accuracy_vs_width.png", "figures/training_curves.png"]
    assert "report.md" in [a.path for a in client.list_artifacts(report.info.run_id)]
    local = client.download_artifacts(report.info.run_id, "figures/training_curves.png", tmp_path)
    assert Path(local).read_bytes() == (folder / "figures" / "training_curves.png").read_bytes()

    # idempotent: the same folder again adds no run; a resumed sweep adds its new cell only
    assert export_folder(folder, "mlflow").written == ()
    sweep_folder(folder, cells=CELLS)
    third = export_folder(folder, "mlflow")
    assert third.written == (CELLS[1],) and third.skipped == (CELLS[0], "report")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.tags["fedlmc.cell_id"] for r in runs) == sorted([*CELLS, "report"])

    # an export killed before its last tag: that run is deleted and written again
    client.delete_tag(cell.info.run_id, "fedlmc.exported")
    assert export_folder(folder, "mlflow").written == (CELLS[0],)
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.tags["fedlmc.cell_id"] for r in runs) == sorted([*CELLS, "report"])
    assert cell.info.run_id not in {r.info.run_id for r in runs}


# ----------------------------------------------------------------------------- CLI


def test_cli_refuses_an_unknown_tracker_and_another_trackers_option(tmp_path, capsys):
    folder = sweep_folder(tmp_path / "sweep", cells=CELLS[:1])
    assert main(["track", str(folder), "--to", "wandb"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"fedlmc: error: --to 'wandb': unknown tracker; allowed: {', '.join(tracker_names())}\n"
    )
    assert tracker_names() == ("tensorboard", "mlflow")
    assert main(["track", str(folder), "--to", "tensorboard", "--tracking-uri", "x"]) == 2
    assert "--tracking-uri is not an option of --to tensorboard" in capsys.readouterr().err
    assert not (folder / "tensorboard").exists()

    config = tmp_path / "one.toml"
    config.write_text('name = "one"\n[run]\nepochs = 1\n')
    out = tmp_path / "never"
    assert main(["sweep", str(config), "--out", str(out), "--track", "wandb"]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not out.exists()  # before any work

    assert main(["track", str(folder), "--to", "tensorboard"]) == 0
    assert capsys.readouterr().out.startswith("tensorboard: 2 run(s) exported, 0 already there")


@pytest.mark.slow
def test_cli_refuses_a_missing_extra_before_the_sweep(tmp_path):
    """The extra hidden from the CLI's Python (``sys.modules[name] = None``: import and
    ``find_spec`` both see no such module), ``fedlmc sweep`` fails before the sweep starts."""
    out = tmp_path / "never"
    config = tmp_path / "one.toml"
    config.write_text('name = "one"\n[run]\nepochs = 1\n')
    code = (
        "import sys; sys.modules['mlflow'] = None\n"
        "from fedlmc.simulations.cli import main\n"
        "raise SystemExit(main(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "sweep", str(config), "--out", str(out), "--track", "mlflow"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        "fedlmc: error: --track mlflow: the 'mlflow' extra is not installed (no module "
        'mlflow); install it with: pip install -e ".[mlflow]"\n'
    )
    assert not out.exists()


def test_run_refuses_a_missing_extra_before_the_federation(tmp_path, capsys, monkeypatch):
    """The same block in this process, for ``fedlmc run --track tensorboard``."""
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    out = tmp_path / "never"
    assert main(["run", f"out-dir={out}", "epochs=1", "--track", "tensorboard"]) == 2
    assert capsys.readouterr().err == (
        "fedlmc: error: --track tensorboard: the 'tensorboard' extra is not installed (no "
        'module tensorboard); install it with: pip install -e ".[tensorboard]"\n'
    )
    assert not out.exists()


# ----------------------------------------------------------------------------- a real sweep


try:  # rootdir on sys.path, or tests/ itself (pytest's default import mode)
    from tests.simulations.runs.test_sweep import shared_sweep
except ImportError:
    from tests.simulations.runs.test_sweep import shared_sweep


@pytest.mark.slow
def test_the_tiny_sweep_exported_by_fedlmc_sweep_track(tmp_path_factory, tmp_path):
    """``test_sweep``'s shared sweep runs with ``--track tensorboard``: one run per cell, with
    its rows' metrics; ``fedlmc track`` to MLflow gives the same runs."""
    sweep = shared_sweep(tmp_path_factory)
    folder = tmp_path / "sweep"
    shutil.copytree(sweep, folder, ignore=shutil.ignore_patterns("cells"))
    frame = read_results(folder)
    ids = sorted(frame["cell_id"].unique())
    dirs = {p.name.rsplit("cell=", 1)[-1]: p for p in (folder / "tensorboard").iterdir()}
    assert sorted(dirs) == sorted([*ids, "report"])
    assert dirs[ids[0]].name.startswith("width=")  # named by the grid values, then the cell id
    events = accumulator(dirs[ids[0]])
    row = frame[(frame["cell_id"] == ids[0]) & (frame["method"] == "average")].iloc[0]
    (accuracy,) = events.Scalars("average/accuracy")
    assert accuracy.value == float(np.float32(row["accuracy"]))
    assert hparams_of(events)["width"] == row["width"]
    training = pd.read_csv(folder / "training.csv", dtype={"cell_id": str})
    curve = training[(training["cell_id"] == ids[0]) & (training["client"] == 0)]
    logged = events.Scalars("client_epoch/client-0/train_loss")  # the real clients' curves
    assert [e.step for e in logged] == curve["step"].tolist() and len(logged) >= 1
    assert [e.value for e in logged] == [float(np.float32(v)) for v in curve["train_loss"]]

    assert main(["track", str(folder), "--to", "mlflow"]) == 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder.resolve() / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.tags["fedlmc.cell_id"] for r in runs) == sorted([*ids, "report"])
