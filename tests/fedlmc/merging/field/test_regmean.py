"""RegMean (fedlmc.merging.field.regmean): the Gram matrices are those of each linear layer's
inputs; at alpha = 1 the merge is the weighted least-squares fit of the clients' outputs (numpy's
lstsq on the stacked data); clients whose inputs span disjoint subspaces each keep their own map
there; identical clients give that client even with a dead input; biases are averaged; alpha
scales the non-diagonal entries only; the secure parts' means give the same merge and the
bound covers a perturbation of them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedlmc.averaging import average
from fedlmc.merging.field.regmean import (
    gram_matrices,
    reduced_gram,
    regmean_error_bound,
    regmean_from_means,
    regmean_layers,
    regmean_merge,
    regmean_parts,
)
from fedlmc.models.classifiers import build_model


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", in_shape=(1, 3, 3), depth=2, base_hidden=6).eval()


def test_gram_matrices_are_those_of_each_layers_inputs():
    model = _mlp()
    x = torch.randn(30, 1, 3, 3, generator=torch.Generator().manual_seed(0))
    layers = regmean_layers(model)
    assert layers == ["hidden.0.linear", "hidden.1.linear", "classifier"]
    found = gram_matrices(model, x, layers)
    flat = x.reshape(30, -1).double()
    torch.testing.assert_close(
        found["hidden.0.linear"].double(), flat.T @ flat / 30, rtol=1e-5, atol=1e-6
    )
    h = torch.relu(model.hidden[0].linear(x.reshape(30, -1))).detach().double()
    torch.testing.assert_close(
        found["hidden.1.linear"].double(), h.T @ h / 30, rtol=1e-5, atol=1e-6
    )


def _linear_clients(seed: int = 0):
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(40, 5)), rng.normal(size=(25, 5)) * [1, 2, 1, 0.5, 1]]
    ws = [rng.normal(size=(3, 5)), rng.normal(size=(3, 5))]
    states = [
        {"fc.weight": torch.as_tensor(w), "fc.bias": torch.as_tensor(rng.normal(size=3))}
        for w in ws
    ]
    grams = [{"fc": torch.as_tensor(x.T @ x / len(x))} for x in xs]
    return xs, ws, states, grams


def test_alpha_one_is_the_weighted_least_squares_fit_of_the_clients_outputs():
    xs, ws, states, grams = _linear_clients()
    weights = [0.7, 0.3]
    merged = regmean_merge(states, grams, weights, alpha=1.0, ridge=1e-12)
    rows = [np.sqrt(w / len(x)) * x for w, x in zip(weights, xs, strict=True)]
    targets = [r @ wi.T for r, wi in zip(rows, ws, strict=True)]
    solution, *_ = np.linalg.lstsq(np.vstack(rows), np.vstack(targets), rcond=None)
    torch.testing.assert_close(
        merged["fc.weight"].double(), torch.as_tensor(solution.T), rtol=1e-7, atol=1e-9
    )
    torch.testing.assert_close(merged["fc.bias"], average(states, weights)["fc.bias"])


def test_clients_on_disjoint_input_subspaces_each_keep_their_own_map():
    rng = np.random.default_rng(3)
    x_a = np.hstack([rng.normal(size=(30, 2)), np.zeros((30, 2))])
    x_b = np.hstack([np.zeros((30, 2)), rng.normal(size=(30, 2))])
    w_a, w_b = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    states = [{"fc.weight": torch.as_tensor(w)} for w in (w_a, w_b)]
    grams = [{"fc": torch.as_tensor(x.T @ x / 30)} for x in (x_a, x_b)]
    merged = regmean_merge(states, grams, [1, 1], alpha=1.0, ridge=1e-9)["fc.weight"].numpy()
    np.testing.assert_allclose(x_a @ merged.T, x_a @ w_a.T, atol=1e-6)
    np.testing.assert_allclose(x_b @ merged.T, x_b @ w_b.T, atol=1e-6)
    plain = (w_a + w_b) / 2
    assert np.abs(x_a @ plain.T - x_a @ w_a.T).max() > 0.1


def test_identical_clients_give_that_client_even_with_a_dead_input():
    x = np.random.default_rng(4).normal(size=(20, 4))
    x[:, 2] = 0.0  # an input that never varies: the Gram matrix is singular
    w = np.random.default_rng(5).normal(size=(2, 4))
    state = {"fc.weight": torch.as_tensor(w)}
    gram = {"fc": torch.as_tensor(x.T @ x / 20)}
    for alpha in (1.0, 0.6):
        merged = regmean_merge([state, state], [gram, gram], [1, 2], alpha=alpha, ridge=1e-4)
        torch.testing.assert_close(merged["fc.weight"], state["fc.weight"], rtol=1e-7, atol=1e-9)


def test_alpha_scales_only_the_non_diagonal_entries():
    g = torch.tensor([[4.0, 2.0], [2.0, 9.0]])
    torch.testing.assert_close(
        reduced_gram(g, 0.25), torch.tensor([[4.0, 0.5], [0.5, 9.0]], dtype=torch.float64)
    )
    with pytest.raises(ValueError, match="regmean alpha = 1.5"):
        reduced_gram(g, 1.5)


def test_the_secure_parts_means_give_the_merge_and_the_bound_covers_their_error():
    _, _, states, grams = _linear_clients(7)
    shares, scale, alpha = [0.4, 0.6], 8.0 / 64.0, 0.6
    parts = [regmean_parts(sd, g, alpha, scale) for sd, g in zip(states, grams, strict=True)]
    means = [
        {k: sum(s * p[j][k] for s, p in zip(shares, parts, strict=True)) for k in parts[0][j]}
        for j in range(3)
    ]
    secure = regmean_from_means(*means, scale, 1e-4)
    clear = regmean_merge(states, grams, shares, alpha=alpha, ridge=1e-4)
    for key in clear:
        torch.testing.assert_close(secure[key], clear[key].double(), rtol=1e-9, atol=1e-12)
    # each secure mean off by at most delta (in its own units): the merge moves less than the bound
    delta_w, delta_s = 1e-6, 1e-6
    rng = np.random.default_rng(8)
    noisy = [
        {k: v + torch.as_tensor(rng.uniform(-1, 1, v.shape)) * d for k, v in m.items()}
        for m, d in zip(means, [delta_w, delta_s * scale, delta_s * scale], strict=True)
    ]
    moved = regmean_from_means(*noisy, scale, 1e-4)
    gap = max(float((moved[k] - secure[k]).abs().max()) for k in secure)
    summed = {"fc": means[1]["fc"] / scale}
    bound = regmean_error_bound(summed, moved, delta_w, delta_s, 1e-4)
    assert 0 < gap <= bound < 1e-3
