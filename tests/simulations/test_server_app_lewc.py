"""``calibration = "lewc"`` through the ServerApp in process (the real ServerApp and ClientApp
on a Grid that hands each message to the ClientApp, no Ray): the ``average_t`` row's temperature
is LEWC's prediction from the merge weights and the depth, and it is applied to the merged
model's logits (the row's NLL and ECE are those of ``softmax(z / T)``); from a shared start the
run says why T is 1."""

from __future__ import annotations

import logging

import pytest

from fedlmc.averaging import load_state
from fedlmc.evaluation import metrics_from_logits, predict_logits
from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.server_app import run_server
from fedlmc.simulations.task import build_from_config, load_splits
from tests.simulations.test_client_app_warmup import TINY, ClientAppGrid

CELL = {**TINY, "num-clients": 3, "epochs": 1, "init": "independent"}
CELL |= {"strategy": "average", "calibration": "lewc"}


def merged_logits(outcome, config):
    splits = load_splits(config)
    model = load_state(build_from_config(config, splits), outcome.merged["average"]).eval()
    return predict_logits(model, splits.test[0]), splits.test[1]


def test_the_lewc_temperature_is_applied_to_the_merged_logits(task_identity):
    config = validate_run_config(CELL)
    outcome = run_server(ClientAppGrid(3), config, simulated=True)
    rows = outcome.table().set_index("method")
    result = outcome.results["average"]
    expected = sum(w**3 for w in result.weights)  # depth 2: 3 weight layers
    assert rows.loc["average_t", "temperature"] == pytest.approx(expected)
    assert rows.loc["average", "temperature"] == 1.0
    assert rows.loc["average_t", "rounds"] == 1  # the training round: no query
    logits, labels = merged_logits(outcome, config)
    at_t = metrics_from_logits(logits, labels, expected)
    raw = metrics_from_logits(logits, labels)
    assert rows.loc["average_t", "nll"] == pytest.approx(at_t["nll"], abs=1e-6)
    assert rows.loc["average_t", "ece"] == pytest.approx(at_t["ece"], abs=1e-6)
    assert rows.loc["average", "nll"] == pytest.approx(raw["nll"], abs=1e-6)
    assert abs(at_t["nll"] - raw["nll"]) > 1e-3  # T is not 1
    fitted = rows.loc["average_t", "temperature_server_split"]  # the server split's, kept apart
    at_fitted = metrics_from_logits(logits, labels, fitted)
    assert rows.loc["average", "nll_calibrated"] == pytest.approx(at_fitted["nll"], abs=1e-6)


def test_a_shared_start_runs_at_t_1_and_the_run_says_why(task_identity, caplog):
    with caplog.at_level(logging.WARNING):
        outcome = run_server(ClientAppGrid(3), {**CELL, "init": "shared"}, simulated=True)
    rows = outcome.table().set_index("method")
    assert rows.loc["average_t", "temperature"] == 1.0
    assert "one basin" in caplog.text and "T = 1" in caplog.text
