"""Tests of fedlmc.permutation.matching: exact recovery of known permutations, functional
equivalence of aligned models, monotone weight-matching objective, MergeMany on permuted copies,
input validation."""

from __future__ import annotations

import pytest
import torch

from fedlmc.averaging import load_state
from fedlmc.models.classifiers import build_model
from fedlmc.permutation import (
    apply_permutation,
    identity_permutations,
    invert_permutation,
    permutation_spec,
    random_permutations,
)
from fedlmc.permutation.matching import (
    ALIGNMENTS,
    activation_matching,
    align_to_reference,
    matching_objective,
    merge_many,
    weight_matching,
)

MNIST = (1, 28, 28)
CIFAR = (3, 32, 32)
CASES = [
    ("mlp", 0.25, MNIST, "none"),
    ("mlp", 0.25, MNIST, "ln"),
    ("mlp", 0.25, MNIST, "bn"),
    ("vgg11", 0.125, CIFAR, "bn"),
    ("vgg11", 0.125, CIFAR, "ln"),
    ("resnet20", 0.25, CIFAR, "bn"),
    ("resnet20", 0.25, CIFAR, "ln"),
    ("resnet20", 0.25, CIFAR, "none"),
]
IDS = [f"{name}-{norm}" for name, _, _, norm in CASES]


def make(name: str, width: float, in_shape, norm: str, seed: int) -> torch.nn.Module:
    """A model with random weights; for BN, running statistics of a batch of random inputs (so
    that in eval mode the units are normalised and none is dead on random data)."""
    torch.manual_seed(seed)
    model = build_model(name, width=width, in_shape=in_shape, norm=norm)
    if norm == "bn":
        norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        for bn in norms:
            bn.momentum = None  # cumulative average: the statistics of the batch below
        model.train()
        with torch.no_grad():
            model(torch.randn(64, *in_shape))
        for bn in norms:
            bn.momentum = 0.1
    return model.eval()


def permuted_copy(model: torch.nn.Module, seed: int):
    """``(spec, sd, permuted sd, applied perms)`` for a random permutation of ``model``."""
    spec = permutation_spec(model)
    sd = model.state_dict()
    perms = random_permutations(spec, sd, seed=seed)
    return spec, sd, apply_permutation(spec, perms, sd), perms


def assert_recovers(spec, sd, permuted, applied, found) -> None:
    """``found`` is the inverse of ``applied`` and restores every tensor bit for bit."""
    assert set(found) == set(spec.perm_to_axes)
    for group, perm in applied.items():
        assert torch.equal(found[group], invert_permutation(perm)), group
    restored = apply_permutation(spec, found, permuted)
    assert restored.keys() == sd.keys()
    for key in sd:
        assert torch.equal(restored[key], sd[key]), key


def logits(model: torch.nn.Module, in_shape, seed: int = 123) -> torch.Tensor:
    x = torch.randn(32, *in_shape, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model.eval()(x)


def rel_err(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x - y).norm() / y.norm())


@pytest.mark.parametrize(
    ("name", "width", "in_shape", "norm"),
    [
        ("mlp", 0.25, MNIST, "none"),
        ("mlp", 0.25, MNIST, "bn"),
        ("vgg11", 0.125, CIFAR, "bn"),
        ("resnet20", 0.25, CIFAR, "ln"),
    ],
)
def test_activation_matching_recovers_a_random_permutation_exactly(name, width, in_shape, norm):
    model = make(name, width, in_shape, norm, seed=1)
    spec, sd, permuted, applied = permuted_copy(model, seed=3)
    other = load_state(model, permuted)
    x = torch.randn(64, *in_shape, generator=torch.Generator().manual_seed(0))
    model.train()  # activation matching must evaluate in eval mode and restore the mode
    found = activation_matching(model, other, x, batch_size=24)
    assert model.training and not other.training
    assert_recovers(spec, sd, permuted, applied, found)


def test_activation_aligned_model_computes_the_same_function():
    model_a = make("vgg11", 0.125, CIFAR, "bn", seed=0)
    model_b = make("vgg11", 0.125, CIFAR, "bn", seed=1)
    spec = permutation_spec(model_a)
    x = torch.randn(16, *CIFAR, generator=torch.Generator().manual_seed(0))
    found = activation_matching(model_a, model_b, x)
    aligned = load_state(model_b, apply_permutation(spec, found, model_b.state_dict()))
    assert rel_err(logits(aligned, CIFAR), logits(model_b, CIFAR)) < 1e-5
    assert len(found.objectives) == 1


@pytest.mark.parametrize(
    ("name", "width", "in_shape", "norm"),
    [("mlp", 0.25, MNIST, "ln"), ("resnet20", 0.25, CIFAR, "bn")],
)
def test_merge_many_of_permuted_copies_is_the_model(name, width, in_shape, norm):
    model = make(name, width, in_shape, norm, seed=0)
    spec = permutation_spec(model)
    sd = model.state_dict()
    copies = [apply_permutation(spec, random_permutations(spec, sd, seed=s), sd) for s in (1, 2, 3)]
    merged, perms = merge_many(spec, copies, weights=[1.0, 2.0, 3.0], seed=0)
    assert len(perms) == 3
    # all copies end up identical, so the merge is a permutation of the model
    aligned = [apply_permutation(spec, p, c) for p, c in zip(perms, copies, strict=True)]
    for key in sd:
        assert torch.equal(aligned[1][key], aligned[0][key]), key
        assert torch.equal(aligned[2][key], aligned[0][key]), key
    merged_model = load_state(model, merged)
    assert rel_err(logits(merged_model, in_shape), logits(model, in_shape)) < 1e-5


def test_merge_many_differs_from_plain_average_for_independent_models():
    models = [make("mlp", 0.25, MNIST, "none", seed=s) for s in range(3)]
    spec = permutation_spec(models[0])
    sds = [m.state_dict() for m in models]
    merged, perms = merge_many(spec, sds)
    aligned = [apply_permutation(spec, p, sd) for p, sd in zip(perms, sds, strict=True)]
    for key, value in merged.items():  # the merge is the average of the aligned models
        expected = sum(a[key].double() for a in aligned) / 3
        assert torch.allclose(value.double(), expected, atol=1e-6), key
    mean_pairwise = sum(
        matching_objective(spec, aligned[i], aligned[j]) for i in range(3) for j in range(i)
    )
    unaligned = sum(matching_objective(spec, sds[i], sds[j]) for i in range(3) for j in range(i))
    assert mean_pairwise > unaligned


@pytest.mark.parametrize("method", ALIGNMENTS)
def test_align_to_reference_leaves_the_reference_and_aligns_the_rest(method):
    model = make("mlp", 0.25, MNIST, "bn", seed=0)
    spec = permutation_spec(model)
    sd = model.state_dict()
    copies = [apply_permutation(spec, random_permutations(spec, sd, seed=s), sd) for s in (1, 2)]
    state_dicts = [copies[0], sd, copies[1]]
    snapshot = [{k: v.clone() for k, v in s.items()} for s in state_dicts]
    models = [load_state(model, s) for s in state_dicts]
    x = torch.randn(64, *MNIST, generator=torch.Generator().manual_seed(0))
    aligned = align_to_reference(spec, state_dicts, reference=1, method=method, models=models, x=x)
    assert len(aligned) == 3
    for out in aligned:
        for key in sd:
            assert torch.equal(out[key], sd[key]), key
    for before, after in zip(snapshot, state_dicts, strict=True):  # inputs are not mutated
        assert all(torch.equal(before[k], after[k]) for k in before)
    if method == "weight":  # the forward start recovers the planted copies too
        forward = align_to_reference(spec, state_dicts, reference=1, start="forward")
        assert all(torch.equal(out[key], sd[key]) for out in forward for key in sd)


def test_bad_input_raises_value_error():
    model = make("mlp", 0.25, MNIST, "none", seed=0)
    wider = make("mlp", 0.5, MNIST, "none", seed=0)
    spec = permutation_spec(model)
    sd = model.state_dict()
    with pytest.raises(ValueError, match="shape"):
        weight_matching(spec, sd, wider.state_dict())
    missing = {k: v for k, v in sd.items() if k != next(iter(spec.axes_to_perm))}
    with pytest.raises(ValueError, match="key"):
        weight_matching(spec, sd, missing)
    with pytest.raises(ValueError, match="init_perms"):
        weight_matching(spec, sd, sd, init_perms={"no.such.group": torch.arange(3)})
    group = next(iter(spec.perm_to_axes))
    n = identity_permutations(spec, sd)[group].numel()
    for bad in (torch.zeros(n, dtype=torch.long), torch.arange(n - 1), torch.arange(1, n + 1)):
        with pytest.raises(ValueError, match=rf"init_perms: permutation for group '{group}'"):
            weight_matching(spec, sd, sd, init_perms={group: bad})
    with pytest.raises(ValueError, match="max_iter"):
        weight_matching(spec, sd, sd, max_iter=0)
    with pytest.raises(ValueError, match="method must be one of .*procrustes"):
        align_to_reference(spec, [sd, sd], method="procrustes")
    with pytest.raises(ValueError, match="models and x"):
        align_to_reference(spec, [sd, sd], method="activation")
    with pytest.raises(ValueError, match="reference"):
        align_to_reference(spec, [sd, sd], reference=2)
    with pytest.raises(ValueError, match="start = 'fwd': allowed: identity, forward"):
        align_to_reference(spec, [sd], start="fwd")  # refused even with nothing to match
    with pytest.raises(ValueError, match="start = 'forward' with method 'activation'"):
        align_to_reference(spec, [sd, sd], method="activation", start="forward")
    with pytest.raises(ValueError, match="at least 2"):
        merge_many(spec, [sd])
    with pytest.raises(ValueError, match="weights"):
        merge_many(spec, [sd, sd], weights=[1.0])
    with pytest.raises(ValueError, match="shape"):
        activation_matching(model, wider, torch.randn(4, *MNIST))


def with_random_statistics(sd: dict, seed: int) -> dict:
    """``sd`` with every BatchNorm running mean/var replaced by large arbitrary values."""
    generator = torch.Generator().manual_seed(seed)
    out = dict(sd)
    for key, value in sd.items():
        if key.endswith("running_mean"):
            out[key] = 100.0 * torch.randn(value.shape, generator=generator)
        elif key.endswith("running_var"):
            out[key] = 100.0 * torch.rand(value.shape, generator=generator) + 0.1
    return out


def test_merge_many_ignores_batchnorm_running_statistics():
    model = make("mlp", 0.25, MNIST, "bn", seed=0)
    others = [make("mlp", 0.25, MNIST, "bn", seed=s).state_dict() for s in (1, 2)]
    spec = permutation_spec(model)
    sds = [model.state_dict(), *others]
    odd = [with_random_statistics(sd, seed=10 + i) for i, sd in enumerate(sds)]
    _, perms = merge_many(spec, sds, seed=1)
    _, odd_perms = merge_many(spec, odd, seed=1)
    for p, q in zip(perms, odd_perms, strict=True):
        assert all(torch.equal(p[g], q[g]) for g in p)
