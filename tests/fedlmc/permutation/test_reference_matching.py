"""Tests of fedlmc.permutation.reference_matching (the textbook weight matching): it recovers a
planted permutation exactly, and the optimised descent of fedlmc.permutation.coordinate_descent
takes the same path (same permutations, same objectives) on planted and independent models."""

from __future__ import annotations

import pytest
import torch

from fedlmc.permutation import permutation_spec, weight_matching
from fedlmc.permutation.objective import matching_objective
from fedlmc.permutation.reference_matching import cost_matrix, reference_weight_matching
from tests.fedlmc.permutation.test_matching import (
    CIFAR,
    MNIST,
    assert_recovers,
    make,
    permuted_copy,
)

CASES = [
    ("mlp", 0.25, MNIST, "none"),
    ("vgg11", 0.125, CIFAR, "bn"),
    ("resnet20", 0.25, CIFAR, "ln"),
]
IDS = [f"{name}-{norm}" for name, _, _, norm in CASES]


@pytest.mark.parametrize(("name", "width", "in_shape", "norm"), CASES, ids=IDS)
def test_reference_and_optimised_recover_a_planted_permutation_exactly(name, width, in_shape, norm):
    spec, sd, permuted, applied = permuted_copy(make(name, width, in_shape, norm, seed=0), seed=3)
    reference = reference_weight_matching(spec, sd, permuted, seed=1)
    optimised = weight_matching(spec, sd, permuted, seed=1)
    assert_recovers(spec, sd, permuted, applied, reference)
    assert_recovers(spec, sd, permuted, applied, optimised)
    # both reach <W_a, W_a>, the maximum (the optimised sums float32 gains: 1e-6)
    assert reference.objectives[-1] == pytest.approx(optimised.objectives[-1], rel=1e-6)
    assert reference.objectives[-1] == pytest.approx(matching_objective(spec, sd, sd), rel=1e-6)


@pytest.mark.parametrize(
    ("name", "width", "in_shape", "norm"),
    [("mlp", 1.0, MNIST, "none"), ("vgg11", 0.125, CIFAR, "bn"), ("resnet20", 0.25, CIFAR, "ln")],
)
def test_optimised_descent_follows_the_reference_on_independent_models(name, width, in_shape, norm):
    """Skipping, low-rank updates and threaded solves do not change the descent's path (one
    descent: the ResNet's residual stream would otherwise get restarts)."""
    model_a = make(name, width, in_shape, norm, seed=0)
    model_b = make(name, width, in_shape, norm, seed=1)
    spec = permutation_spec(model_a)
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    expected = reference_weight_matching(spec, sd_a, sd_b, seed=4)
    found = weight_matching(spec, sd_a, sd_b, seed=4, restarts=1)
    assert list(found) == list(expected)
    for group in expected:
        assert torch.equal(found[group], expected[group]), group
    assert len(found.objectives) == len(expected.objectives)
    assert found.objectives == pytest.approx(expected.objectives, rel=1e-6)
    assert expected.objectives[-1] > matching_objective(spec, sd_a, sd_b)


def test_cost_matrix_leaves_out_batchnorm_statistics():
    """Changing model b's running statistics changes no cost matrix (they are not scored)."""
    model = make("vgg11", 0.125, CIFAR, "bn", seed=0)
    spec, sd, permuted, _ = permuted_copy(model, seed=2)
    shifted = {k: v + 5 if k.endswith("running_mean") else v for k, v in permuted.items()}
    perms = {g: torch.arange(len(p)) for g, p in permuted_copy(model, seed=2)[3].items()}
    for group in spec.perm_to_axes:
        assert torch.equal(
            cost_matrix(spec, group, sd, permuted, perms),
            cost_matrix(spec, group, sd, shifted, perms),
        ), group


def test_reference_refuses_bad_input():
    spec, sd, permuted, _ = permuted_copy(make("mlp", 0.25, MNIST, "none", seed=0), seed=1)
    with pytest.raises(ValueError, match="max_iter must be an integer >= 1, got 0"):
        reference_weight_matching(spec, sd, permuted, max_iter=0)
    missing = {k: v for k, v in permuted.items() if k != next(iter(spec.axes_to_perm))}
    with pytest.raises(ValueError):
        reference_weight_matching(spec, sd, missing)
