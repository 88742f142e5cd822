"""The field's merge methods in the study (fedlmc.study.compare): with a federation's clients
(in-memory here) and the clients' shared starting model, ``fisher``, ``regmean`` and the
task-vector methods are rows; their merges are the ones merge_states makes, and without the
clients or the base they are refused before any work. Real MNIST digits, tiny shared-init MLPs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fedlmc.averaging import load_state
from fedlmc.data.loading import load_dataset
from fedlmc.evaluation import metrics_from_logits, predict_logits
from fedlmc.merging.clients import LocalClients
from fedlmc.merging.methods import merge_states
from fedlmc.models.classifiers import build_model
from fedlmc.study.compare import compare_methods
from fedlmc.train import train_model

METHODS = ["average", "fisher", "fisher_t", "regmean", "task_arithmetic", "ties", "dare"]


@pytest.fixture(scope="module")
def federation():
    full = load_dataset("mnist5k")
    splits = replace(full, train=(full.train[0][:600], full.train[1][:600]))
    torch.manual_seed(0)
    template = build_model("mlp", width=0.25, num_classes=10, in_shape=splits.in_shape)
    base = {k: v.clone() for k, v in template.state_dict().items()}
    states, parts = [], []
    for i in range(2):
        model = load_state(template, base)
        part = (splits.train[0][i::2], splits.train[1][i::2])
        train_model(
            model, part, epochs=5, lr=0.1, weight_decay=3e-3, batch_size=32, seed=i, device="cpu"
        )
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        parts.append(part)
    clients = LocalClients(
        template, states, [x for x, _ in parts], parts, train_labels=[y for _, y in parts]
    )
    return splits, template, base, states, clients


def test_the_client_and_task_vector_methods_are_rows_of_their_own_merges(federation):
    splits, template, base, states, clients = federation
    comparison = compare_methods(
        template,
        states,
        [1, 1],
        splits,
        METHODS,
        diagnostics=False,
        lambdas=3,
        clients=clients,
        base=base,
        device="cpu",
    )
    rows = {r["method"]: r for r in comparison.rows}
    assert list(rows) == METHODS
    for method in ("fisher", "regmean", "task_arithmetic", "ties", "dare"):
        merged, _ = merge_states(method, template, states, [1, 1], clients=clients, base=base)
        found = comparison.merged[method]
        assert all(torch.allclose(found[k], merged[k]) for k in merged), method
        logits = predict_logits(load_state(template, merged).eval(), splits.test[0])
        accuracy = metrics_from_logits(logits, splits.test[1], 1.0)["accuracy"]
        assert rows[method]["accuracy"] == pytest.approx(accuracy)
        assert rows[method]["server_sees"] == "sum"
    assert rows["fisher"]["accuracy"] == rows["fisher_t"]["accuracy"]
    assert (
        rows["fisher"]["client_statistics_bytes"] > 0
        and rows["regmean"]["client_statistics_bytes"] > 0
    )
    assert rows["fisher"]["accuracy"] > 0.5 and rows["regmean"]["accuracy"] > 0.5


def test_without_the_clients_or_the_base_they_are_refused_before_any_work(federation):
    splits, template, base, states, clients = federation
    with pytest.raises(
        ValueError, match="'fisher' runs on the clients; got none: allowed only in a federation"
    ):
        compare_methods(template, states, None, splits, ["average", "fisher"], base=base)
    with pytest.raises(ValueError, match="'ties_t' needs the clients' common base model; got none"):
        compare_methods(template, states, None, splits, ["average", "ties_t"], clients=clients)
