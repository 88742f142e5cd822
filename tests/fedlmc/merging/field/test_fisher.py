"""Fisher merging (fedlmc.merging.field.fisher): the batched per-sample Fisher equals a loop of
single backward passes and, for a softmax regression, the closed form; the merge weights every entry
by the clients' normalised Fisher (a client whose data moves an entry takes it), falls back to the
plain average where no data moves an entry, ignores a client's Fisher scale; the secure parts'
means give the same merge; the quantisation bound refuses a floor below its resolution."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedlmc.averaging import average
from fedlmc.merging.field.fisher import (
    bounded_sample,
    fisher_diagonal,
    fisher_error_bound,
    fisher_from_means,
    fisher_merge,
    fisher_parts,
    fisher_weights,
)
from fedlmc.models.classifiers import build_model


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", in_shape=(1, 4, 4), depth=2, base_hidden=8).eval()


def _data(n: int = 40, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 4, 4, generator=generator), torch.randint(
        0, 10, (n,), generator=generator
    )


def test_the_batched_fisher_equals_a_loop_of_single_backward_passes():
    model = _mlp()
    x, y = _data()
    found = fisher_diagonal(model, x, y, chunk=7)  # chunks that do not divide the count
    expected = {k: torch.zeros_like(p) for k, p in model.named_parameters()}
    for xi, yi in zip(x, y, strict=True):
        model.zero_grad()
        torch.log_softmax(model(xi[None]), dim=1)[0, yi].backward()
        for k, p in model.named_parameters():
            expected[k] += p.grad.square() / len(x)
    assert set(found) == set(expected)
    for key in expected:
        torch.testing.assert_close(found[key], expected[key], rtol=1e-4, atol=1e-9)


def test_softmax_regression_fisher_is_the_closed_form():
    r"""For logits :math:`z = W x`, :math:`\partial_{W_{kj}} \log p_y = (1[k=y] - p_k) x_j`."""
    model = nn.Linear(3, 4, bias=False)
    x = torch.randn(25, 3, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 4, (25,), generator=torch.Generator().manual_seed(2))
    probs = torch.softmax(model(x).detach(), dim=1)
    residual = nn.functional.one_hot(y, 4).float() - probs
    expected = (residual.square().T @ x.square()) / len(x)
    torch.testing.assert_close(fisher_diagonal(model, x, y)["weight"], expected, rtol=1e-5, atol=0)


def test_sampled_labels_are_seeded_and_differ_from_the_true_ones():
    model, (x, y) = _mlp(), _data()
    a = fisher_diagonal(model, x, y, labels="sampled", seed=3)
    b = fisher_diagonal(model, x, y, labels="sampled", seed=3)
    true = fisher_diagonal(model, x, y)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.allclose(a[k], true[k]) for k in a)
    with pytest.raises(ValueError, match="labels = 'model': allowed: data, sampled"):
        fisher_diagonal(model, x, y, labels="model")


def test_the_merge_gives_each_entry_to_the_client_whose_data_moves_it():
    states = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 6.0])}]
    fishers = [{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([0.0, 1.0])}]
    eps = 1e-3
    merged = fisher_merge(states, fishers, [1, 1], eps)
    low = eps / (1 + eps)  # u of an entry without Fisher; 1 where the whole unit norm sits
    expected = torch.tensor([(1 + low * 3) / (1 + low), (low * 2 + 6) / (low + 1)])
    torch.testing.assert_close(merged["w"], expected)
    assert abs(float(merged["w"][0]) - 1) < 0.01 and abs(float(merged["w"][1]) - 6) < 0.01


def test_no_fisher_anywhere_and_buffers_give_the_plain_average():
    states = [
        {
            "w": torch.tensor([1.0, 2.0]),
            "bn.running_mean": torch.tensor([1.0]),
            "n": torch.tensor(3),
        },
        {
            "w": torch.tensor([3.0, 6.0]),
            "bn.running_mean": torch.tensor([5.0]),
            "n": torch.tensor(7),
        },
    ]
    zero = {"w": torch.zeros(2)}
    merged = fisher_merge(states, [zero, zero], [1, 3], 1e-6)
    plain = average(states, [1, 3])
    for key in plain:
        torch.testing.assert_close(merged[key], plain[key])


def test_a_clients_fisher_scale_does_not_change_the_merge():
    model, (x, y) = _mlp(), _data()
    other = _mlp(1)
    fishers = [fisher_diagonal(model, x, y), fisher_diagonal(other, x, y)]
    states = [model.state_dict(), other.state_dict()]
    scaled = [{k: 100 * v for k, v in fishers[0].items()}, fishers[1]]
    a, b = fisher_merge(states, fishers, [2, 1], 1e-6), fisher_merge(states, scaled, [2, 1], 1e-6)
    for key in a:
        torch.testing.assert_close(a[key], b[key])
    assert any(not torch.allclose(a[k], average(states, [2, 1])[k]) for k in a)


def test_the_secure_parts_means_give_the_merge_and_lie_in_the_range():
    model, (x, y) = _mlp(), _data()
    others = [_mlp(1), _mlp(2)]
    states = [m.state_dict() for m in [model, *others]]
    fishers = [fisher_diagonal(m, x, y) for m in [model, *others]]
    shares, c = [0.2, 0.5, 0.3], 8.0
    parts = [fisher_parts(sd, f, c, 1e-6) for sd, f in zip(states, fishers, strict=True)]
    for values, masses in parts:
        assert all(float(v.abs().max()) <= c for v in [*values.values(), *masses.values()])
    means = [
        {k: sum(s * p[j][k] for s, p in zip(shares, parts, strict=True)) for k in parts[0][j]}
        for j in range(2)
    ]
    secure = fisher_from_means(*means, c)
    clear = fisher_merge(states, fishers, shares, 1e-6)
    for key in clear:
        torch.testing.assert_close(secure[key].float(), clear[key], rtol=1e-6, atol=1e-7)


def test_values_are_scaled_by_the_weight_range_and_a_weight_beyond_it_is_refused():
    state, fisher = {"w": torch.tensor([0.5, -0.25])}, {"w": torch.tensor([1.0, 1.0])}
    values, masses = fisher_parts(state, fisher, 8.0, 1e-6, weight_range=0.5)
    torch.testing.assert_close(
        values["w"] / masses["w"],
        torch.tensor([1.0, -0.5], dtype=torch.float64),  # theta / b
    )
    merged = fisher_from_means(values, masses, 8.0, 0.5)
    torch.testing.assert_close(merged["w"], state["w"].double())
    with pytest.raises(ValueError, match="'w' holds 0.5, beyond the weight range 0.25"):
        fisher_parts(state, fisher, 8.0, 1e-6, weight_range=0.25)


def test_the_error_bound_and_its_infinity_below_the_resolution():
    delta = 3 * 2 * 8.0 / 2**30
    bound = fisher_error_bound(delta, 8.0, 1e-6)
    assert bound == pytest.approx(2 * delta / (1e-6 / (1 + 1e-6) - delta / 8.0))
    assert fisher_error_bound(delta, 8.0, 1e-6, weight_range=1.0) == pytest.approx(bound / 8)
    assert fisher_error_bound(3 * 8 * 8.0 / 2**22, 8.0, 1e-6) == math.inf  # 2^22 levels: too coarse


def test_weights_are_at_most_one_and_refuse_a_bad_epsilon():
    u = fisher_weights({"w": torch.ones(3)}, {"w": torch.tensor([0.0, 3.0, 4.0])}, 1e-6)
    assert float(u["w"].max()) <= 1.0 and float(u["w"][0]) > 0
    torch.testing.assert_close(
        u["w"][2], torch.tensor((0.8 + 1e-6) / (1 + 1e-6), dtype=torch.float64)
    )
    with pytest.raises(ValueError, match="fisher epsilon = 0: allowed: > 0"):
        fisher_weights({"w": torch.ones(1)}, {"w": torch.ones(1)}, 0)


def test_bounded_sample_is_a_seeded_subset():
    x, y = torch.arange(50).float()[:, None], torch.arange(50)
    a, ay = bounded_sample(x, y, 10, seed=4)
    b, _ = bounded_sample(x, y, 10, seed=4)
    assert len(a) == 10 and torch.equal(a, b) and torch.equal(a[:, 0].long(), ay)
    assert len(set(a[:, 0].tolist())) == 10
    full, _ = bounded_sample(x, y, 80, seed=4)
    assert torch.equal(full, x)
    with pytest.raises(ValueError, match="samples = 0"):
        bounded_sample(x, y, 0, seed=4)
