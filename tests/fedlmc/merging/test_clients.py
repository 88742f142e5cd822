"""fedlmc.merging.clients: in-memory clients answer the merge methods' queries: activation
matching recovers a planted permutation, summed statistics equal those of the pooled data, the
calibrated NLL is the grid's best, and bad input is refused naming the counts."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedlmc.averaging import load_state
from fedlmc.merging.calibrate import bn_statistics, temperature_grid
from fedlmc.merging.clients import LocalClients
from fedlmc.models.classifiers import build_model
from fedlmc.permutation import (
    apply_permutation,
    invert_permutation,
    permutation_spec,
    random_permutations,
)

IN_SHAPE = (1, 4, 4)


def tiny(seed: int, norm: str = "none") -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", width=1.0, in_shape=IN_SHAPE, depth=2, base_hidden=8, norm=norm)


def data(seed: int, n: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *IN_SHAPE, generator=g), torch.randint(0, 10, (n,), generator=g)


def clients(template, states, **kwargs) -> LocalClients:
    sets = [data(10 + i) for i in range(len(states))]
    return LocalClients(template, states, [x for x, _ in sets], sets, grid_points=201, **kwargs)


def test_activation_matching_recovers_a_planted_permutation_for_client_one():
    model = tiny(0).eval()
    spec, state = permutation_spec(model), model.state_dict()
    planted = random_permutations(spec, state, seed=4)
    local = clients(model, [state, apply_permutation(spec, planted, state)])
    found = local.activation_permutations(state)
    assert found[0] == {}
    for group, perm in planted.items():
        assert torch.equal(found[1][group], invert_permutation(perm)), group


def test_the_clients_batchnorm_sums_are_those_of_their_pooled_inputs():
    model = tiny(1, norm="bn").eval()
    local = clients(model, [model.state_dict()] * 3)
    summed = local.bn_statistics(model)
    # train-mode BN: equal to the pooled inputs' sums taken in the clients' batches (48 each)
    pooled = bn_statistics(model, torch.cat(list(local.train_inputs)), batch_size=48)
    assert summed.keys() == pooled.keys() and summed
    for name, stats in summed.items():
        assert stats.count == pooled[name].count
        assert torch.allclose(stats.sum, pooled[name].sum)
        assert torch.allclose(stats.sum_sq, pooled[name].sum_sq)


def test_the_calibrated_nll_is_the_best_over_the_grid_of_the_pooled_calibration_data():
    model = tiny(2).eval()
    local = clients(model, [model.state_dict(), tiny(3).state_dict()])
    nlls = local.calibrated_nlls([model.state_dict()], [False])
    x = torch.cat([x for x, _ in local.calibration])
    y = torch.cat([y for _, y in local.calibration])
    with torch.no_grad():
        logits = load_state(model, model.state_dict())(x)
    by_hand = min(float(F.cross_entropy(logits / math.exp(u), y)) for u in temperature_grid(201))
    assert nlls == [pytest.approx(by_hand, rel=1e-5)]
    temperature, _ = local.temperature(model)
    assert float(F.cross_entropy(logits / temperature, y)) <= by_hand + 1e-4


def test_bad_client_lists_are_refused_naming_the_counts():
    model = tiny(0)
    state = model.state_dict()
    x, y = data(0)
    with pytest.raises(ValueError, match="2 client states need 2 train_inputs and 2 calibration"):
        LocalClients(model, [state, state], [x], [(x, y), (x, y)])
    with pytest.raises(ValueError, match="2 client states need 2 train_labels; got 1"):
        LocalClients(model, [state, state], [x, x], [(x, y)] * 2, train_labels=[y])
    with pytest.raises(ValueError, match="temperature_grid_points = 1"):
        LocalClients(model, [state], [x], [(x, y)], grid_points=1)
    with pytest.raises(ValueError, match="the Fisher needs the clients' train_labels"):
        LocalClients(model, [state], [x], [(x, y)]).fisher_diagonals()
