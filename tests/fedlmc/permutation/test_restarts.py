"""fedlmc.permutation.coordinate_descent with fedlmc.permutation.restarts: weight matching's
restarts (issue 53).

Where one descent stalls (a ViT), the best of several finds a higher objective; the kept
objective is never below the single descent's; plain chains keep one descent; restarts are
deterministic per seed, stop at a provably optimal descent, and every merge that builds on
weight matching (MergeMany, REPAIR, auto, the mixed-width embeddings) runs them."""

from __future__ import annotations

import pytest
import torch

from fedlmc.merging.methods import merge_states
from fedlmc.models import build_model
from fedlmc.permutation import (
    apply_permutation,
    invert_permutation,
    permutation_spec,
    random_permutations,
    reference_weight_matching,
)
from fedlmc.permutation import matching as matching_module
from fedlmc.permutation.coordinate_descent import weight_matching
from fedlmc.permutation.matching import matching_objective, merge_many, reference_permutations
from fedlmc.permutation.restarts import STREAM_RESTARTS, default_restarts, upper_bound
from tests.fedlmc.permutation.test_matching import CIFAR, MNIST, make


def vit_pair(width: float, depth: int, seeds=(0, 1)):
    """``(spec, sd_a, sd_b)`` of two independently initialised ViTs."""
    states = []
    for seed in seeds:
        torch.manual_seed(seed)
        model = build_model("vit", width=width, depth=depth)
        states.append(model.state_dict())
    return permutation_spec(model), *states


def noisy_planted_vit():
    """A depth-4 ViT (one head) and a planted permutation of it with Gaussian noise of 1.5 times
    each tensor's standard deviation added: ``(spec, sd_a, sd_b, the planted inverse)``. One
    descent from seed 2 stops at about 0.84 of the planted permutation's objective."""
    torch.manual_seed(0)
    model = build_model("vit", width=0.25, depth=4)
    spec, sd = permutation_spec(model), model.state_dict()
    generator = torch.Generator().manual_seed(1)
    noisy = {
        key: value + 1.5 * value.std() * torch.randn(value.shape, generator=generator)
        if value.is_floating_point() and value.numel() > 1
        else value
        for key, value in sd.items()
    }
    planted = random_permutations(spec, sd, seed=3)
    inverse = {group: invert_permutation(perm) for group, perm in planted.items()}
    return spec, sd, apply_permutation(spec, planted, noisy), inverse


def test_restarts_find_a_higher_objective_where_one_descent_stalls():
    spec, sd_a, sd_b, planted = noisy_planted_vit()
    true = matching_objective(spec, sd_a, sd_b, planted)
    one = weight_matching(spec, sd_a, sd_b, seed=2, restarts=1)
    default = weight_matching(spec, sd_a, sd_b, seed=2)
    stalled = matching_objective(spec, sd_a, sd_b, one)
    found = matching_objective(spec, sd_a, sd_b, default)
    assert stalled < 0.9 * true  # one descent stops well below the planted permutation
    assert found > 0.99 * true  # the restarts reach it (or better: the noise)
    assert found > 1.1 * stalled
    # the textbook descent (one descent, as on main) stalls the same way
    textbook = reference_weight_matching(spec, sd_a, sd_b, seed=2)
    assert matching_objective(spec, sd_a, sd_b, textbook) < 0.9 * true


@pytest.mark.parametrize(
    ("name", "width", "in_shape", "norm"),
    [
        ("vit", 0.25, MNIST, "auto"),
        ("vit", 0.5, MNIST, "auto"),
        ("resnet20", 0.25, CIFAR, "ln"),
        ("mlp", 0.25, MNIST, "none"),
        ("vgg11", 0.125, CIFAR, "bn"),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_kept_objective_is_never_below_one_descent(name, width, in_shape, norm, seed):
    if name == "vit":
        spec, sd_a, sd_b = vit_pair(width, 2, seeds=(seed, seed + 10))
    else:
        model_a = make(name, width, in_shape, norm, seed=seed)
        model_b = make(name, width, in_shape, norm, seed=seed + 10)
        spec, sd_a, sd_b = permutation_spec(model_a), model_a.state_dict(), model_b.state_dict()
    one = weight_matching(spec, sd_a, sd_b, seed=seed, restarts=1)
    default = weight_matching(spec, sd_a, sd_b, seed=seed)
    single = matching_objective(spec, sd_a, sd_b, one)
    kept = matching_objective(spec, sd_a, sd_b, default)
    assert kept >= single
    assert len(default.descents) == default_restarts(spec, sd_a)
    assert default.descents[0] == pytest.approx(single, rel=1e-12)  # descent 0 is the single one
    assert max(default.descents) == pytest.approx(kept, rel=1e-12)
    if len(default.descents) == 1:  # a plain chain: the very same descent as before
        assert all(torch.equal(one[g], default[g]) for g in one)
        assert one.objectives == default.objectives


def test_streams_get_several_descents_and_plain_chains_one():
    for name, in_shape, expected in [
        ("vit", MNIST, STREAM_RESTARTS),
        ("resnet20", CIFAR, STREAM_RESTARTS),
        ("mlp", MNIST, 1),
        ("vgg11", CIFAR, 1),
    ]:
        model = build_model(name, width=0.25, in_shape=in_shape)
        assert default_restarts(permutation_spec(model), model.state_dict()) == expected, name
    assert STREAM_RESTARTS > 1


def test_restarts_are_deterministic_per_seed():
    spec, sd_a, sd_b = vit_pair(0.5, 2)
    first = weight_matching(spec, sd_a, sd_b, seed=4, restarts=4)
    second = weight_matching(spec, sd_a, sd_b, seed=4, restarts=4)
    assert all(torch.equal(first[g], second[g]) for g in first)
    assert first.objectives == second.objectives and first.descents == second.descents
    # more restarts extend the same sequence of descents
    more = weight_matching(spec, sd_a, sd_b, seed=4, restarts=6)
    assert more.descents[:4] == first.descents
    assert matching_objective(spec, sd_a, sd_b, more) >= matching_objective(spec, sd_a, sd_b, first)


def test_a_planted_permutation_ends_the_restarts_at_the_bound():
    torch.manual_seed(0)
    model = build_model("vit", width=0.5, depth=2)
    spec, sd = permutation_spec(model), model.state_dict()
    planted = random_permutations(spec, sd, seed=1)
    permuted = apply_permutation(spec, planted, sd)
    found = weight_matching(spec, sd, permuted, restarts=5)
    assert len(found.descents) == 1  # optimal: the Cauchy-Schwarz bound is reached
    assert found.descents[0] == pytest.approx(upper_bound(spec, sd, permuted), rel=1e-9)
    for group, perm in planted.items():
        assert torch.equal(found[group], invert_permutation(perm)), group


@pytest.mark.parametrize("restarts", [0, -1, 1.5, True, "3"])
def test_bad_restarts_are_refused(restarts):
    spec, sd_a, sd_b = vit_pair(0.25, 1)
    with pytest.raises((ValueError, TypeError), match="restarts"):
        weight_matching(spec, sd_a, sd_b, restarts=restarts)


@pytest.fixture
def descents_of_each_call(monkeypatch):
    """The number of descents of every :func:`weight_matching` call made through
    :mod:`fedlmc.permutation.matching` (where every merge imports it from)."""
    counts: list[int] = []

    def spy(*args, **kwargs):
        found = weight_matching(*args, **kwargs)
        counts.append(len(found.descents))
        return found

    monkeypatch.setattr(matching_module, "weight_matching", spy)
    return counts


def test_what_builds_on_weight_matching_runs_the_restarts(descents_of_each_call):
    counts = descents_of_each_call
    spec, sd_a, sd_b = vit_pair(0.25, 2)
    torch.manual_seed(0)
    template = build_model("vit", width=0.25, depth=2)
    states = [sd_a, sd_b]
    x = torch.randn(16, *MNIST, generator=torch.Generator().manual_seed(0))
    data = (x, torch.arange(16) % 10)
    reference_permutations(spec, states)
    assert counts == [STREAM_RESTARTS]
    merge_many(spec, states + [vit_pair(0.25, 2, seeds=(2, 3))[1]], max_iter=2)
    assert len(counts) > 1 and set(counts) == {STREAM_RESTARTS}
    for method, options in [
        ("weight_matching", {}),
        ("weight_matching_repair", {}),
        ("merge_many", {}),
        ("auto", {"auto_tolerance": -1e9}),  # always aligns
    ]:
        counts.clear()
        merge_states(method, template, states, server_data=data, options=options)
        assert counts and set(counts) == {STREAM_RESTARTS}, method
    wide = build_model("resnet20", width=0.25, in_shape=CIFAR, norm="bn")
    narrow = build_model("resnet20", width=0.125, in_shape=CIFAR, norm="bn")
    images = torch.randn(8, *CIFAR, generator=torch.Generator().manual_seed(1))
    for method in ("embed_weight_matching", "embed_weight_matching_repair"):
        counts.clear()
        states = [wide.state_dict(), narrow.state_dict()]
        merge_states(method, wide, states, server_data=(images, torch.arange(8) % 10))
        assert counts and set(counts) == {STREAM_RESTARTS}, method
