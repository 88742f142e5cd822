"""The field's merge methods as registered (fedlmc.merging.field.field_methods): Fisher merging and
RegMean through ``merge_states`` with in-memory clients equal their rules on the clients' own
statistics and report the bytes; a dropped client is left out; the task-vector methods need a
base and OT fusion a plain chain, both refused before any work; the secure forms' parts, summed
exactly, give the clear merge and have the shapes the server splits by; the registry's checks
of a secure form."""

from __future__ import annotations

import pytest
import torch

from fedlmc.merging.clients import LocalClients
from fedlmc.merging.field.field_methods import (
    FISHER_EPSILON,
    FISHER_LABELS,
    FISHER_SUMS,
    REGMEAN_ALPHA,
    REGMEAN_GROWTH,
    REGMEAN_RIDGE,
    REGMEAN_SUMS,
    TA_SCALING,
)
from fedlmc.merging.field.fisher import (
    bounded_sample,
    fisher_diagonal,
    fisher_merge,
    statistics_seed,
)
from fedlmc.merging.field.regmean import (
    gram_matrices,
    regmean_layers,
    regmean_merge,
    solution_growth,
)
from fedlmc.merging.field.task_vectors import task_arithmetic
from fedlmc.merging.methods import merge_states
from fedlmc.merging.sum_form import SecureSums, weighted_means
from fedlmc.models.classifiers import build_model
from fedlmc.strategies.secure_forms import register_secure_form, runs_securely, secure_form

SHAPE = (1, 4, 4)


def _model(seed: int, norm: str = "none") -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", in_shape=SHAPE, depth=2, base_hidden=8, norm=norm).eval()


def _clients(count: int = 3):
    models = [_model(s) for s in range(count)]
    data = []
    for s in range(count):
        generator = torch.Generator().manual_seed(10 + s)
        data.append(
            (
                torch.randn(60, *SHAPE, generator=generator),
                torch.randint(0, 10, (60,), generator=generator),
            )
        )
    states = [m.state_dict() for m in models]
    local = LocalClients(
        models[0],
        states,
        train_inputs=[x for x, _ in data],
        calibration=data,
        train_labels=[y for _, y in data],
        fisher_samples=40,
        regmean_samples=50,
        seed=5,
    )
    return models, states, data, local


def test_fisher_through_merge_states_is_the_rule_on_each_clients_own_fisher():
    models, states, data, local = _clients()
    merged, _, info = merge_states(
        "fisher", models[0], states, [1, 2, 3], clients=local, with_info=True
    )
    fishers = []
    for i, (model, (x, y)) in enumerate(zip(models, data, strict=True)):
        xs, ys = bounded_sample(x, y, 40, statistics_seed(5, i))
        fishers.append(fisher_diagonal(model, xs, ys))
    expected = fisher_merge(states, fishers, [1, 2, 3], FISHER_EPSILON)
    for key in expected:
        torch.testing.assert_close(merged[key], expected[key])
    parameters = sum(p.numel() for p in models[0].parameters())
    assert info["client_statistics_bytes"] == 3 * 4 * parameters


def test_regmean_through_merge_states_is_the_rule_on_each_clients_own_grams():
    models, states, data, local = _clients()
    merged, _, info = merge_states("regmean", models[0], states, clients=local, with_info=True)
    layers = regmean_layers(models[0])
    grams = [
        gram_matrices(m, bounded_sample(x, None, 50, statistics_seed(5, i))[0], layers)
        for i, (m, (x, _)) in enumerate(zip(models, data, strict=True))
    ]
    expected = regmean_merge(states, grams, [1, 1, 1], REGMEAN_ALPHA, REGMEAN_RIDGE)
    for key in expected:
        torch.testing.assert_close(merged[key], expected[key])
    sizes = sum(models[0].state_dict()[f"{n}.weight"].shape[1] ** 2 for n in layers)
    assert info["client_statistics_bytes"] == 3 * 4 * sizes
    assert local.refused == []  # honest clients: the solution is within the growth limit


def test_a_gram_that_blows_the_regmean_solution_up_is_refused_and_the_rest_merged():
    """Clients 0 and 1 see inputs along (1, 0), client 2 along (1, 0.01) with another map: the
    summed Gram is nearly singular along (0, 1), every Gram positive semi-definite and of the
    same scale, and the solution grows 16 times past the clients' weights; without client 2
    it is theirs."""
    template = torch.nn.Sequential(torch.nn.Linear(2, 1, bias=False))
    a = torch.linspace(0.5, 1.5, 8)[:, None]
    inputs = [a * torch.tensor([1.0, 0.0])] * 2 + [a * torch.tensor([1.0, 0.01])]
    rows = ([1.0, 0.0], [1.0, 0.0], [0.0, 1.0])
    states = [{"0.weight": torch.tensor([row])} for row in rows]
    labels = [(x, torch.zeros(len(x), dtype=torch.long)) for x in inputs]
    local = LocalClients(template, states, inputs, labels)
    grams = [gram_matrices(template, x, ["0"]) for x in inputs]
    blown = regmean_merge(states, grams, [1, 1, 1], REGMEAN_ALPHA, REGMEAN_RIDGE)
    assert solution_growth(blown, states, ["0"])["0"] > REGMEAN_GROWTH
    merged, aligned = merge_states("regmean", template, states, None, clients=local)
    ((index, reason),) = local.refused
    assert index == 2 and "RegMean's solution of layer '0'" in reason
    assert len(aligned) == 2
    torch.testing.assert_close(merged["0.weight"], torch.tensor([[1.0, 0.0]]), atol=1e-3, rtol=0)


class _DroppingClients:
    """Client queries whose second client's answers were dropped."""

    def __init__(self, local: LocalClients) -> None:
        self.local = local

    def fisher_diagonals(self):
        found = self.local.fisher_diagonals()
        return [found[0], None, found[2]]


def test_a_client_whose_answer_was_dropped_is_left_out():
    models, states, _, local = _clients()
    merged = merge_states("fisher", models[0], states, [1, 2, 3], clients=_DroppingClients(local))[
        0
    ]
    found = local.fisher_diagonals()
    expected = fisher_merge([states[0], states[2]], [found[0], found[2]], [1, 3], FISHER_EPSILON)
    for key in expected:
        torch.testing.assert_close(merged[key], expected[key])


def test_the_client_methods_and_the_task_vectors_are_refused_without_what_they_need():
    models, states, _, _ = _clients(2)
    with pytest.raises(
        ValueError, match="'fisher' runs on the clients; got none: allowed only in a federation"
    ):
        merge_states("fisher", models[0], states)
    for method in ("task_arithmetic", "ties", "dare"):
        with pytest.raises(ValueError, match=f"'{method}' needs the clients' common base model"):
            merge_states(method, models[0], states)
    base = models[0].state_dict()
    merged, _ = merge_states("task_arithmetic", models[0], states, base=base)
    expected = task_arithmetic(states, [1, 1], base, TA_SCALING)
    assert all(torch.equal(merged[k], expected[k]) for k in expected)
    norm = [_model(0, "ln"), _model(1, "ln")]
    with pytest.raises(ValueError, match="'ot_fusion': model 'MLP' is not supported"):
        merge_states("ot_fusion", norm[0], [m.state_dict() for m in norm])
    _, _, info = merge_states("ot_fusion", models[0], states, with_info=True)
    assert info["ot_map_softness"] == 0.0  # exact OT at equal widths: permutations


@pytest.mark.parametrize("method", ["fisher", "regmean"])
def test_the_secure_parts_summed_exactly_give_the_clear_merge(method):
    models, states, data, local = _clients()
    shares = [0.2, 0.3, 0.5]
    sums = secure_form(method).secure_sums
    options = {"clipping_range": 8.0, "statistics_range": 64.0, "fisher_samples": 40}
    options |= {"regmean_samples": 50, "entry_error": 1e-9}
    parts = [
        sums.client_parts(m, d, {**options, "statistics_seed": statistics_seed(5, i)})
        for i, (m, d) in enumerate(zip(models, data, strict=True))
    ]
    shapes = sums.part_shapes(models[0])
    assert [{k: tuple(v.shape) for k, v in p.items()} for p in parts[0]] == shapes
    assert all(float(v.abs().max()) <= 8.0 for p in parts for part in p for v in part.values())
    secure, bound = sums.merge(models[0], weighted_means(parts, shares), options)
    clear = merge_states(method, models[0], states, shares, clients=local)[0]
    for key in clear:
        torch.testing.assert_close(secure[key].float(), clear[key], rtol=1e-5, atol=1e-6)
    assert 0 < bound < 0.01  # an entry error of 1e-9: the bound is finite and small


def test_a_gram_entry_beyond_the_statistics_range_is_refused_naming_the_layer():
    models, _, data, _ = _clients(1)
    options = {"clipping_range": 8.0, "statistics_range": 0.01, "statistics_seed": 0}
    with pytest.raises(
        ValueError,
        match="'hidden.0.linear': a Gram entry of .* outside secagg-statistics-range 0.01",
    ):
        REGMEAN_SUMS.client_parts(models[0], data[0], options)


def test_the_declared_fisher_labels_are_the_ones_the_fisher_takes():
    models, _, data, _ = _clients(1)
    x, y = data[0]
    found = [fisher_diagonal(models[0], x[:8], y[:8], labels=labels) for labels in FISHER_LABELS]
    assert len(found) == 2 and not torch.equal(
        found[0]["classifier.weight"], found[1]["classifier.weight"]
    )


def test_the_registry_runs_the_secure_forms_and_refuses_a_misdeclared_one():
    assert runs_securely("fisher") and runs_securely("regmean")
    assert secure_form("fisher").secure_sums is FISHER_SUMS
    assert not runs_securely("task_arithmetic")
    assert "two secure rounds" in secure_form("ties").note
    with pytest.raises(ValueError, match="a secure form with server_sees = 'each model'"):
        register_secure_form("weight_matching", secure_sums=SecureSums(len, len, len))
