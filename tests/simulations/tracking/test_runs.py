"""A results folder read as tracker runs (:mod:`fedlmc.simulations.tracking.runs`): a ``fedlmc
run`` folder is one run keyed by its ``results.csv``, NaN values are not logged, the digest
follows what the run holds, and a folder without results is refused naming it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedlmc.simulations.config.schema import ConfigError
from fedlmc.simulations.tracking.runs import (
    TrackedRun,
    param_value,
    phase_prefix,
    step_metrics,
    tracked_runs,
    varying_label,
)


def run_folder(folder: Path, accuracy: float = 0.75) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {"method": "average", "width": 0.5, "seed": 3, "accuracy": accuracy, "ece": math.nan},
        {"method": "ensemble", "width": 0.5, "seed": 3, "accuracy": 0.875, "ece": 0.125},
    ]
    pd.DataFrame(rows).to_csv(folder / "results.csv", index=False)
    curves = [
        {"phase": "client_epoch", "client": 1, "step": 2, "train_loss": 0.5, "fedavg_accuracy": ""},
        {
            "phase": "fedavg_round",
            "client": "",
            "step": 1,
            "train_loss": "",
            "fedavg_accuracy": 0.25,
        },
    ]
    pd.DataFrame(curves).to_csv(folder / "training.csv", index=False)
    return folder


def test_a_run_folder_is_one_run_keyed_by_its_results(tmp_path):
    (run,) = tracked_runs(run_folder(tmp_path / "a"))
    assert run.kind == "run" and run.key.startswith("run-") and len(run.key) == 16
    assert run.params == {"width": 0.5, "seed": 3}
    assert run.row_metrics == (
        ("average/accuracy", 0.75),
        ("ensemble/accuracy", 0.875),
        ("ensemble/ece", 0.125),
    )  # the NaN ece of average is not logged
    assert set(run.step_metrics) == {
        ("client_epoch/client-1/train_loss", 2, 0.5),
        ("fedavg_round/fedavg_accuracy", 1, 0.25),
    }
    (same,) = tracked_runs(run_folder(tmp_path / "b"))
    (other,) = tracked_runs(run_folder(tmp_path / "c", accuracy=0.5))
    assert same.key == run.key and same.digest != run.digest  # the folder's name is in the run
    assert other.key != run.key


def test_the_digest_follows_the_figures_bytes(tmp_path):
    figure = tmp_path / "f.png"
    figure.write_bytes(b"one")
    run = TrackedRun(key="k", name="k", figures=(figure,))
    before = run.digest
    assert len(before) == 16 and run.digest == before
    figure.write_bytes(b"two")
    assert run.digest != before


def test_a_folder_without_results_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"holds no results\.csv; allowed: a sweep's"):
        tracked_runs(tmp_path)


def test_a_training_phase_outside_the_known_ones_is_refused():
    assert phase_prefix("client_epoch", 2) == "client_epoch/client-2"
    with pytest.raises(ConfigError, match="^training.csv phase 'warmup'; allowed: "):
        phase_prefix("warmup", 0)
    curves = pd.DataFrame([{"phase": "warmup", "client": 0, "step": 1, "loss": 1.0}])
    with pytest.raises(ConfigError):
        step_metrics(curves)


def test_params_as_trackers_take_them():
    assert param_value(np.float64(0.5)) == 0.5 and type(param_value(np.int64(3))) is int
    assert param_value(math.nan) == "" and param_value(None) == ""
    assert param_value(True) is True and param_value("mlp") == "mlp"
    assert varying_label({"seed": 0, "width": 2.0, "model": "mlp"}, ["width", "seed"]) == (
        "width=2.0 seed=0"
    )
