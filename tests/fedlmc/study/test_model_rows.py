"""The rows of one merged model (raw and ``_t``) for every mode's shape, and the one evaluator
the study and the ServerApp share."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from fedlmc.averaging import average, load_state
from fedlmc.data.loading import load_dataset
from fedlmc.evaluation import metrics_from_logits, predict_logits
from fedlmc.merging.calibrate import fit_temperature
from fedlmc.models.classifiers import build_model
from fedlmc.study.compare import compare_methods
from fedlmc.study.model_rows import endpoint_metrics, merge_rows
from fedlmc.study.rows import row_columns
from fedlmc.train import train_model

ENDPOINT = ("endpoint_acc_mean", "endpoint_acc_min", "endpoint_acc_max", "endpoint_nll_mean")
GAP = ("merge_gap_accuracy", "merge_gap_loss", "merge_gap_loss_calibrated")
CPU = torch.device("cpu")


def subsample(data, count: int, seed: int):
    index = torch.randperm(len(data[1]), generator=torch.Generator().manual_seed(seed))[:count]
    return data[0][index], data[1][index]


@pytest.fixture(scope="module")
def splits():
    full = load_dataset("mnist5k")
    return replace(
        full,
        train=subsample(full.train, 400, 0),
        server=subsample(full.server, 150, 1),
        test=subsample(full.test, 200, 2),
    )


def mlp(splits, seed: int):
    torch.manual_seed(seed)
    return build_model("mlp", width=0.25, num_classes=splits.num_classes, in_shape=splits.in_shape)


@pytest.fixture(scope="module")
def clients(splits):
    """Two clients trained briefly on the two halves of the pool."""
    x, y = splits.train
    states = []
    for i in range(2):
        model = mlp(splits, 10 + i)
        train_model(
            model, (x[i::2], y[i::2]), epochs=2, lr=0.1, weight_decay=0.0, batch_size=32, seed=i
        )
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return states


@pytest.fixture(scope="module")
def merged(splits, clients):
    return load_state(mlp(splits, 0), average(clients, [1, 1])).eval()


def test_the_t_row_is_the_raw_row_at_the_given_temperature(splits, merged):
    raw, cal = merge_rows("average", merged, splits, device=CPU, calibrated=True, temperature=1.7)
    direct = metrics_from_logits(predict_logits(merged, splits.test[0]), splits.test[1], 1.7)
    at_one = metrics_from_logits(predict_logits(merged, splits.test[0]), splits.test[1])
    assert (raw["method"], cal["method"]) == ("average", "average_t")
    assert tuple(raw) == tuple(cal) == row_columns()
    assert cal["nll"] == cal["nll_calibrated"] == pytest.approx(direct["nll"], rel=1e-12)
    assert cal["ece"] == pytest.approx(direct["ece"], rel=1e-12) and cal["temperature"] == 1.7
    assert raw["accuracy"] == cal["accuracy"] == direct["accuracy"]
    assert raw["nll"] == raw["nll_raw"] == cal["nll_raw"] == pytest.approx(at_one["nll"])
    assert raw["temperature"] == 1.0 and raw["nll"] != cal["nll"]


def test_without_a_temperature_the_t_row_uses_the_server_split_fit(splits, merged):
    raw, cal = merge_rows("fedavg", merged, splits, device=CPU, calibrated=True, num_clients=3)
    fitted = fit_temperature(predict_logits(merged, splits.server[0]), splits.server[1])
    assert cal["temperature"] == pytest.approx(fitted, rel=1e-9)
    assert raw["nll_calibrated"] == cal["nll"]  # the raw row reports the fit's NLL beside
    assert raw["num_clients"] == cal["num_clients"] == 3
    assert "temperature_server_split" not in cal


def test_a_clear_one_shot_round_has_endpoint_and_gap_columns(splits, clients, merged):
    endpoints = endpoint_metrics([mlp(splits, 0)] * 2, clients, splits, CPU)
    rows = merge_rows(
        "average",
        merged,
        splits,
        device=CPU,
        num_clients=2,
        calibrated=True,
        temperature=0.8,
        temperature_server_split=1.25,
        endpoints=endpoints,
    )
    accuracies = [e["accuracy"] for e in endpoints]
    for row in rows:
        assert row["endpoint_acc_min"] == min(accuracies) < max(accuracies)
        assert row["merge_gap_accuracy"] == pytest.approx(
            sum(accuracies) / 2 - row["accuracy"], abs=1e-12
        )
    raw, cal = rows
    assert raw["merge_gap_loss"] == cal["merge_gap_loss"]
    assert raw["merge_gap_loss_calibrated"] != cal["merge_gap_loss_calibrated"]
    assert list(cal)[-1] == "temperature_server_split" and cal["temperature_server_split"] == 1.25
    assert "temperature_server_split" not in raw


def test_fedavg_has_one_row_without_endpoints(splits, merged):
    [row] = merge_rows("fedavg", merged, splits, device=CPU, num_clients=4)
    assert row["method"] == "fedavg" and row["num_clients"] == 4 and row["temperature"] == 1.0
    assert all(math.isnan(row[c]) for c in ENDPOINT + GAP)
    assert row["at_chance"] == 0.0 and row["temperature_at_bound"] == ""


def test_secure_and_dp_rows_keep_a_nan_server_split_temperature(splits, merged):
    rows = merge_rows(
        "average",
        merged,
        splits,
        device=CPU,
        calibrated=True,
        temperature=2.0,
        temperature_server_split=math.nan,
    )
    assert [r["method"] for r in rows] == ["average", "average_t"]
    assert math.isnan(rows[1]["temperature_server_split"])
    assert all(math.isnan(r[c]) for r in rows for c in ENDPOINT + GAP)


def test_the_study_rows_come_from_the_same_evaluator(splits, clients):
    template = mlp(splits, 0)
    found = compare_methods(
        template, clients, [1, 1], splits, ["average", "average_t"], diagnostics=False
    )
    model = load_state(template, found.merged["average"]).eval()
    built = merge_rows("average", model, splits, device=CPU, num_clients=2, calibrated=True)
    metric = ("accuracy", "nll", "ece", "temperature", "nll_raw", "nll_calibrated")
    for study_row, row in zip(found.rows, built, strict=True):
        assert {c: study_row[c] for c in metric} == {c: row[c] for c in metric}


def test_a_row_needs_a_method_name(splits, merged):
    with pytest.raises(ValueError, match="method must be a non-empty string, got ''"):
        merge_rows("", merged, splits, device=CPU)
