"""End to end through Flower's simulation engine (Ray) on the embedded digits: two federations
as the cells of one simulation (the ServerApp and ClientApp of ``run_federation``, Ray started
once), and ``run_federation`` refusing a federation with too few survivors."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from fedlmc.averaging import average, load_state
from fedlmc.evaluation import predict_logits
from fedlmc.merging.calibrate import fit_temperature
from fedlmc.simulations.config import client_width, row_methods, validate_run_config
from fedlmc.simulations.records.training_file import read_training
from fedlmc.simulations.runs.federation import run_federation
from fedlmc.simulations.task import (
    build_from_config,
    client_calibration_data,
    client_data,
    client_seed,
    client_train_data,
    load_splits,
    train_options,
)
from fedlmc.strategies import NotEnoughClientsError
from fedlmc.train import train_model
from fedlmc.training_columns import TRAINING_COLUMNS
from tests.simulations.test_server_app_failures import ray_descendants, ray_is_down

pytestmark = pytest.mark.slow

TINY = {
    "dataset": "mnist5k",
    "model": "mlp",
    "width": 0.25,
    "depth": 2,
    "base-hidden": 64,
    "epochs": 1,
    "batch-size": 128,
    "lambdas": 3,
    "diagnostics": False,
    "timeout": 120.0,
}


def tensor_bytes(state) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


COMPARE = {
    **TINY,
    "epochs": 2,
    "num-clients": 2,
    "strategy": "compare",
    "methods": "average,average_t,weight_matching,ensemble,fedavg",
    "fedavg-rounds": 2,
    "diagnostics": True,
}
FAILED = {
    **TINY,
    "norm": "bn",
    "num-clients": 4,
    "client-widths": "0.25,0.25,0.5,0.5",
    "min-clients": 2,
    "strategy": "aligned",
    "align": "embed_average",
    "calibration": "federated",
    "inject-failure": "raise:1,nan:2",
}


@pytest.fixture(scope="module")
def federated(federations, tmp_path_factory):
    """The federations of :data:`COMPARE` and :data:`FAILED`, each with its own out-dir, as the
    cells of one Flower simulation (``tests/conftest.py``: ``run_federations``): by name, the
    validated config, the outcome and the out-dir."""
    outs = {name: tmp_path_factory.mktemp(name) for name in ("compare", "failed")}
    configs = {
        name: {**config, "out-dir": str(outs[name])}
        for name, config in (("compare", COMPARE), ("failed", FAILED))
    }
    outcomes = federations(configs)
    return {
        name: (validate_run_config(configs[name]), outcomes[name], outs[name]) for name in configs
    }


def test_compare_round_end_to_end(federated):
    config, outcome, out = federated["compare"]
    rows = outcome.table()
    assert list(rows["method"]) == ["average", "average_t", "weight_matching", "ensemble", "fedavg"]
    assert list(rows["method"]) == row_methods(config)  # what a sweep counts as a whole cell
    assert (rows["clients_survived"] == 2).all()
    assert (rows["clients_failed"] == "").all()
    assert rows["accuracy"].between(0, 1).all()
    curve = json.loads(rows.loc[rows.method == "average", "curve"].item())  # diagnostics on
    assert len(curve["lam"]) == config["lambdas"]
    assert "num-clients" not in rows  # config columns only on request (the sweep adds them)
    assert (outcome.table(with_config=True)["strategy"] == "compare").all()

    # Each client trained its own partition from its own seed: redo client 0 by hand.
    survivors = outcome.reports["compare"].survivors
    assert [u.partition_id for u in survivors] == [0, 1]
    splits = load_splits(config)
    model = build_from_config(config, splits, seed=client_seed(config["seed"], 0))
    model, history = train_model(
        model,
        client_data(config, 0, 2),
        **train_options(config),
        seed=client_seed(config["seed"], 0, 1),
        device="cpu",
    )
    for key, tensor in model.state_dict().items():
        assert torch.allclose(survivors[0].state[key], tensor, atol=1e-5), key
    first, second = survivors[0].state, survivors[1].state
    assert not any(torch.equal(first[k], second[k]) for k in first if k.endswith("weight"))

    # The merged weights on disk are what the strategy returned: the num-examples average.
    result_state = {
        k: torch.from_numpy(a.numpy()) for k, a in outcome.results["compare"].arrays.items()
    }
    on_disk = load_file(str(out / "merged-average.safetensors"))
    expected = average([u.state for u in survivors], [u.num_examples for u in survivors])
    assert set(on_disk) == set(result_state) == set(expected)
    for key in expected:
        assert torch.equal(on_disk[key], result_state[key])
        assert torch.allclose(on_disk[key], expected[key], atol=1e-7)
    assert (out / "merged-weight_matching.safetensors").exists()
    assert (out / "merged-fedavg.safetensors").exists()

    saved = pd.read_csv(out / "results.csv")
    assert list(saved["method"]) == list(rows["method"])
    assert (saved["num-clients"] == 2).all() and (saved["strategy"] == "compare").all()
    assert saved["accuracy"].tolist() == pytest.approx(rows["accuracy"].tolist())
    one_shot = rows[rows.method != "fedavg"]
    assert (one_shot["bytes_sent_by_clients"] == 2 * tensor_bytes(expected)).all()
    fedavg = rows[rows.method == "fedavg"].iloc[0]
    assert fedavg["bytes_sent_by_clients"] == 2 * 2 * tensor_bytes(expected)  # 2 rounds

    # training.csv: the run-config columns as results.csv names them (no cell_id in a run's
    # file), then the declared columns; one row per client x epoch, one per FedAvg round.
    training = read_training(out)
    config_names = [c for c in saved.columns if c in config]
    declared = [c.name for c in TRAINING_COLUMNS]
    assert list(training.columns) == [*config_names, *declared]
    clients = training[training["phase"] == "client_epoch"]
    assert clients[["client", "step"]].values.tolist() == [[0, 1], [0, 2], [1, 1], [1, 2]]
    # the history is the one train_model returns (client 0's, redone by hand above)
    first_client = clients[clients["client"] == 0]
    assert first_client["train_loss"].tolist() == pytest.approx(history.loss, rel=1e-5)
    assert first_client["train_accuracy"].tolist() == pytest.approx(history.accuracy, rel=1e-5)
    assert clients["calibration_loss"].isna().all()  # compare calibrates on the server
    assert clients["merged_test_loss"].isna().all()
    rounds = training[training["phase"] == "fedavg_round"]
    assert rounds["step"].tolist() == [1, 2] and rounds["client"].isna().all()
    assert rounds[["train_loss", "train_accuracy"]].isna().all().all()
    last = rounds.iloc[-1]  # the global model after the last round is the fedavg row's model
    assert last["merged_test_accuracy"] == pytest.approx(fedavg["accuracy"], abs=1e-12)
    assert last["merged_test_loss"] == pytest.approx(fedavg["nll"], rel=1e-9)
    assert rounds["clients_train_loss"].gt(0).all()


def test_failed_clients_are_dropped_and_federated_calibration_uses_survivors(federated):
    """Clients of different widths too (client-widths): the survivors 0 and 3 (widths 0.25 and
    0.5) are merged at the server width 0.5 by ``embed_average``, and every query runs on it."""
    config, outcome, out = federated["failed"]
    rows = outcome.table()
    assert list(rows["method"]) == ["embed_average", "embed_average_t"] == row_methods(config)
    assert (rows["clients_survived"] == 2).all()
    assert (rows["client_widths"] == "0.25,0.25,0.5,0.5").all() and (
        rows["server_width"] == 0.5
    ).all()
    report = outcome.reports["embed_average"]
    assert report.survivor_ids == [0, 3]
    first = [u.state["hidden.0.linear.weight"].shape[0] for u in report.survivors]
    assert first == [16, 32]  # each client trained its own width (base-hidden 64)
    assert [f.partition_id for f in report.failures] == [1, 2]
    assert "injected failure" in report.failures[0].reason
    assert "non-finite" in report.failures[1].reason
    assert "partition 1" in rows["clients_failed"].iloc[0]

    # The federated temperature equals the centralised fit on the survivors' held-out shares
    # (calibration-holdout = 0.1 of each partition, never trained on).
    merged = load_file(str(out / "merged-embed_average.safetensors"))
    splits = load_splits(config)
    model = load_state(build_from_config(config, splits), merged).eval()
    parts = [client_calibration_data(config, pid, 4) for pid in (0, 3)]
    x = torch.cat([p[0] for p in parts])
    y = torch.cat([p[1] for p in parts])
    assert len(y) == sum(round(0.1 * len(client_data(config, p, 4)[1])) for p in (0, 3))
    expected = fit_temperature(predict_logits(model, x), y)
    result = outcome.results["embed_average"]  # the strategy's OneShotResult
    metrics = result.train_metrics_clientapp[1]
    assert metrics["temperature"] == pytest.approx(expected, rel=1e-5)
    assert result.temperature == metrics["temperature"] and result.bn_source == "federated"
    assert result.calibration_history[0]["round"] == -1  # the grid round, then Newton rounds
    assert result.report is report and result.query_rounds == metrics["query-rounds"]
    calibrated = rows[rows.method == "embed_average_t"].iloc[0]
    assert calibrated["temperature"] == pytest.approx(metrics["temperature"])
    on_server = fit_temperature(predict_logits(model, splits.server[0]), splits.server[1])
    assert calibrated["temperature_server_split"] == pytest.approx(on_server, rel=1e-5)
    assert metrics["bn-reestimated"] == 1
    # Each survivor's per-epoch loss on its held-out share is in training.csv; the last one is
    # its trained model's loss on that share (eval mode: BatchNorm running statistics).
    curves = read_training(out)
    assert sorted(set(curves["client"])) == [0, 3]  # the failed clients sent no history
    for update in report.survivors:
        held_x, held_y = client_calibration_data(config, update.partition_id, 4)
        width = client_width(config, update.partition_id)  # its own width (0.25 or 0.5)
        own = load_state(build_from_config(config, splits, width=width), update.state).eval()
        loss = torch.nn.functional.cross_entropy(predict_logits(own, held_x), held_y)
        mine = curves[curves["client"] == update.partition_id]
        assert mine["calibration_loss"].iloc[-1] == pytest.approx(float(loss), rel=1e-5)
    # Clients trained on the rest: num-examples counts what they trained on.
    trained = [len(client_train_data(config, pid, 4)[1]) for pid in (0, 3)]
    assert [u.num_examples for u in report.survivors] == trained
    # Rounds: training, then a BatchNorm statistics round, the temperature grid, Newton rounds.
    assert calibrated["rounds"] == 1 + metrics["query-rounds"]
    assert 1 + 1 + 1 <= metrics["query-rounds"] <= 1 + 1 + 8


def test_too_few_survivors_is_a_clear_error(tmp_path):
    config = {
        **TINY,
        "num-clients": 3,
        "min-clients": 3,
        "strategy": "average",
        "calibration": "none",
        "inject-failure": "raise:0",
        "out-dir": str(tmp_path),
    }
    with pytest.raises(NotEnoughClientsError, match=r"only 2 client\(s\) survived.*partition 0"):
        run_federation(config)
    assert not (tmp_path / "results.csv").exists()
    assert ray_is_down(), ray_descendants()  # the failed run stopped its Ray


# ----------------------------------------------------------------------------- ClientApp, called
# directly with real Messages and a real Context (no Ray): fast checks of the handlers.


def call_client(message_type: str, config: dict, pid: int, arrays=None, partition=None):
    """The ClientApp's reply on a node with partition ``pid`` of 2; ``partition`` (a dict)
    adds the ConfigRecord the sweep engine sends with a cell's own partition."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

    from fedlmc.simulations.client_app import app

    content = RecordDict({"arrays": arrays or ArrayRecord(), "config": ConfigRecord(config)})
    if partition is not None:
        content["partition"] = ConfigRecord(partition)
    message = Message(content, dst_node_id=pid + 100, message_type=message_type)
    context = Context(
        run_id=7,
        node_id=pid + 100,
        state=RecordDict(),
        run_config={},
        node_config={"partition-id": pid, "num-partitions": 2},
    )
    return app(message, context)


def test_client_config_comes_from_context_then_message():
    from fedlmc.simulations.task import client_run_config

    config = client_run_config({"epochs": 3, "lr": 0.2, "not-a-key": 1}, {"epochs": 5, "x": 0})
    assert config["epochs"] == 5 and config["lr"] == 0.2
    seeds = {client_seed(0, p, r) for p in range(3) for r in range(3)}
    assert len(seeds) == 9 and client_seed(0, 1, 2) == client_seed(0, 1, 2)


def test_client_train_reply_and_failure_injection(task_identity):
    config = {**TINY, "num-clients": 2}
    reply = call_client("train", {**config, "server-round": 1}, pid=1)
    assert not reply.has_error()
    metrics = next(iter(reply.content.metric_records.values()))
    assert metrics["partition-id"] == 1
    assert metrics["num-examples"] == len(client_data(validate_run_config(config), 1, 2)[1])
    assert all(isinstance(metrics[k], float) for k in ("train-loss", "train-seconds"))
    # the per-epoch history, one value per configured epoch; no held-out share, no held-out loss
    assert metrics["epoch-train-loss"] == [metrics["train-loss"]]
    assert metrics["epoch-train-accuracy"] == [metrics["train-accuracy"]]
    assert "epoch-calibration-loss" not in metrics

    failed = call_client("train", {**config, "inject-failure": "raise:1"}, pid=1)
    assert failed.has_error() and "partition-id=1" in failed.error.reason
    poisoned = call_client("train", {**config, "inject-failure": "nan:1"}, pid=1)
    arrays = next(iter(poisoned.content.array_records.values()))
    assert all(torch.isnan(torch.from_numpy(a.numpy())).all() for a in arrays.values())


def test_client_trains_the_partition_its_message_names(task_identity):
    """The sweep engine names each cell's partition in the message: it wins over the node's."""
    config = {**TINY, "num-clients": 3}
    reply = call_client(
        "train",
        {**config, "server-round": 1},
        pid=0,
        partition={"partition-id": 2, "num-partitions": 3},
    )
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    metrics = next(iter(reply.content.metric_records.values()))
    assert metrics["partition-id"] == 2
    assert metrics["num-examples"] == len(client_data(validate_run_config(config), 2, 3)[1])
    assert metrics["num-examples"] != len(client_data(validate_run_config(config), 0, 2)[1])
    failed = call_client(
        "train",
        {**config, "inject-failure": "raise:2"},
        pid=0,
        partition={"partition-id": 2, "num-partitions": 3},
    )
    assert failed.has_error() and "partition-id=2" in failed.error.reason


def test_client_temperature_query_sums_its_own_data(task_identity):
    from fedlmc.merging.calibrate import temperature_statistics
    from fedlmc.strategies.protocol import state_to_record, temperature_stats_from_content

    config = validate_run_config({**TINY, "num-clients": 2})
    splits = load_splits(config)
    model = build_from_config(config, splits, seed=3)
    query = {**TINY, "num-clients": 2, "log-t": [-0.5, 0.25]}
    reply = call_client(
        "query.temperature", query, pid=0, arrays=state_to_record(model.state_dict())
    )
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    x, y = client_data(config, 0, 2)
    logits = predict_logits(model, x)
    expected = [temperature_statistics(logits, y, u) for u in (-0.5, 0.25)]
    assert temperature_stats_from_content(reply.content) == expected


def test_client_bn_stats_query_returns_its_batchnorm_moments(task_identity):
    from fedlmc.merging.calibrate import bn_statistics
    from fedlmc.strategies.protocol import bn_stats_from_content, state_to_record

    config = validate_run_config({**TINY, "num-clients": 2, "norm": "bn"})
    model = build_from_config(config, load_splits(config), seed=4)
    reply = call_client(
        "query.bn_stats",
        {**TINY, "num-clients": 2, "norm": "bn"},
        pid=1,
        arrays=state_to_record(model.state_dict()),
    )
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    expected = bn_statistics(model, client_data(config, 1, 2)[0])
    got = bn_stats_from_content(reply.content)
    assert set(got) == set(expected) and len(got) == 2
    for name, st in expected.items():
        assert got[name].count == st.count
        assert torch.allclose(got[name].sum, st.sum) and torch.allclose(got[name].sum_sq, st.sum_sq)
