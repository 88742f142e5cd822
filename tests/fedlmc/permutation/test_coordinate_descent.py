"""fedlmc.permutation.coordinate_descent: weight matching recovers a planted permutation exactly,
its aligned model computes the same function, the objective never decreases; float32 and
float64 costs agree; BatchNorm running statistics are permuted but never scored; a trained ViT
of depth 2, 4 and 6 is recovered from every seed (the first sweep visits its residual stream
first; restarts: test_restarts.py). The forward start: its pass is the layer-wise matching
computed by hand, the optimised descent follows the textbook one from it, it recovers planted
permutations and beats the published start on trained MLPs, bad ``start`` values are refused,
and the default descent is the published one (the cost matrices: test_cost_matrices.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from fedlmc.averaging import load_state
from fedlmc.data.loading import load_dataset
from fedlmc.models import build_model
from fedlmc.permutation import (
    apply_permutation,
    identity_permutations,
    invert_permutation,
    permutation_spec,
    random_permutations,
    reference_weight_matching,
)
from fedlmc.permutation.coordinate_descent import weight_matching
from fedlmc.permutation.cost_matrices import CostMatrices
from fedlmc.permutation.objective import (
    START_MODES,
    Matching,
    is_scored,
    matching_objective,
    residual_stream,
    scored_keys,
)
from fedlmc.train import train_model
from tests.fedlmc.permutation.test_matching import (
    CASES,
    CIFAR,
    IDS,
    MNIST,
    assert_recovers,
    logits,
    make,
    permuted_copy,
    rel_err,
    with_random_statistics,
)


@pytest.mark.parametrize(("name", "width", "in_shape", "norm"), CASES, ids=IDS)
def test_weight_matching_recovers_a_random_permutation_exactly(name, width, in_shape, norm):
    model = make(name, width, in_shape, norm, seed=0)
    spec, sd, permuted, applied = permuted_copy(model, seed=7)
    found = weight_matching(spec, sd, permuted)
    assert isinstance(found, Matching)
    assert_recovers(spec, sd, permuted, applied, found)
    assert found.objectives[-1] == pytest.approx(matching_objective(spec, sd, sd), rel=1e-6)


@pytest.mark.parametrize(("name", "width", "in_shape", "norm"), CASES, ids=IDS)
def test_weight_aligned_model_computes_the_same_function(name, width, in_shape, norm):
    model_a = make(name, width, in_shape, norm, seed=0)
    model_b = make(name, width, in_shape, norm, seed=1)
    spec = permutation_spec(model_a)
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    found = weight_matching(spec, sd_a, sd_b, seed=5)
    aligned = load_state(model_b, apply_permutation(spec, found, sd_b))
    assert rel_err(logits(aligned, in_shape), logits(model_b, in_shape)) < 1e-5
    # the descent never loses ground and ends above the unaligned objective
    at_identity = matching_objective(spec, sd_a, sd_b)
    objectives = found.objectives
    assert all(b >= a - 1e-12 * abs(a) for a, b in zip(objectives, objectives[1:], strict=False))
    assert objectives[-1] > at_identity
    final = matching_objective(spec, sd_a, sd_b, found)  # exact, float64
    assert final > at_identity
    assert objectives[-1] == pytest.approx(final, rel=1e-6)
    # at convergence no single group can be improved: re-running from the result changes nothing
    again = weight_matching(spec, sd_a, sd_b, seed=9, init_perms=found)
    assert all(torch.equal(again[g], found[g]) for g in found)


@pytest.mark.parametrize(
    ("name", "width", "in_shape", "norm"),
    [("mlp", 1.0, MNIST, "none"), ("vgg11", 0.125, CIFAR, "bn"), ("resnet20", 0.25, CIFAR, "ln")],
)
def test_float32_cost_matrices_take_the_float64_path(name, width, in_shape, norm):
    """Cost matrices held in float32 (the default) give the float64 matrices' permutations and
    objectives, on a planted permutation (recovered exactly) and on independent models."""
    model_a = make(name, width, in_shape, norm, seed=0)
    spec, sd, permuted, applied = permuted_copy(model_a, seed=2)
    for float64_costs in (False, True):
        found = weight_matching(spec, sd, permuted, float64_costs=float64_costs)
        assert_recovers(spec, sd, permuted, applied, found)
    sd_b = make(name, width, in_shape, norm, seed=1).state_dict()
    single = weight_matching(spec, sd, sd_b, seed=3)
    double = weight_matching(spec, sd, sd_b, seed=3, float64_costs=True)
    for group in single:
        assert torch.equal(single[group], double[group]), group
    assert single.objectives == pytest.approx(double.objectives, rel=1e-7)  # gains from A_p
    perms = identity_permutations(spec, sd)
    group = next(iter(spec.perm_to_axes))
    assert CostMatrices(spec, sd, sd_b).matrix(group, perms).dtype == torch.float32
    assert CostMatrices(spec, sd, sd_b, True).matrix(group, perms).dtype == torch.float64


def test_weight_matching_is_deterministic_and_seed_controls_the_order():
    model_a = make("mlp", 0.5, MNIST, "none", seed=0)
    model_b = make("mlp", 0.5, MNIST, "none", seed=1)
    spec = permutation_spec(model_a)
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    first = weight_matching(spec, sd_a, sd_b, seed=3)
    second = weight_matching(spec, sd_a, sd_b, seed=3)
    assert all(torch.equal(first[g], second[g]) for g in first)
    assert first.objectives == second.objectives


def test_max_iter_bounds_the_number_of_sweeps():
    model_a = make("mlp", 0.5, MNIST, "none", seed=0)
    model_b = make("mlp", 0.5, MNIST, "none", seed=1)
    spec = permutation_spec(model_a)
    found = weight_matching(spec, model_a.state_dict(), model_b.state_dict(), max_iter=1)
    assert len(found.objectives) == 1


@pytest.mark.parametrize(
    ("name", "width", "in_shape", "norm"),
    [
        ("mlp", 0.25, MNIST, "bn"),
        ("vgg11", 0.125, (1, 8, 8), "bn"),
        ("resnet20", 0.25, CIFAR, "bn"),
    ],
)
def test_weight_matching_ignores_batchnorm_running_statistics(name, width, in_shape, norm):
    model_a = make(name, width, in_shape, norm, seed=0)
    model_b = make(name, width, in_shape, norm, seed=1)
    spec = permutation_spec(model_a)
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    statistics = [k for k in spec.axes_to_perm if k.endswith(("running_mean", "running_var"))]
    assert statistics and not any(is_scored(k) for k in statistics)
    assert set(scored_keys(spec)) == set(spec.axes_to_perm) - set(statistics)
    assert all(is_scored(k) for k in sd_a if k.endswith((".weight", ".bias")))
    odd_b = with_random_statistics(sd_b, seed=2)
    found = weight_matching(spec, sd_a, sd_b, seed=3)
    odd = weight_matching(spec, with_random_statistics(sd_a, seed=4), odd_b, seed=3)
    for group in found:
        assert torch.equal(found[group], odd[group]), group
    assert odd.objectives == pytest.approx(found.objectives, rel=1e-12)
    assert matching_objective(spec, sd_a, odd_b, found) == pytest.approx(
        matching_objective(spec, sd_a, sd_b, found), rel=1e-12
    )
    # a permuted copy whose statistics were replaced is still recovered exactly, statistics
    # permuted along with their units
    spec, sd, permuted, applied = permuted_copy(model_a, seed=5)
    odd_permuted = with_random_statistics(permuted, seed=6)
    recovered = weight_matching(spec, sd, odd_permuted)
    for group, perm in applied.items():
        assert torch.equal(recovered[group], invert_permutation(perm)), group
    restored = apply_permutation(spec, recovered, odd_permuted)
    odd_original = apply_permutation(
        spec, {g: invert_permutation(p) for g, p in applied.items()}, odd_permuted
    )
    for key in sd:
        assert torch.equal(restored[key], odd_original[key]), key
        if is_scored(key):
            assert torch.equal(restored[key], sd[key]), key


_TRAINED_VITS: dict[int, torch.nn.Module] = {}


def trained_vit(depth: int) -> torch.nn.Module:
    """A ViT of ``depth`` blocks (2 heads of 8 dims) trained for one epoch on 512 real digits,
    once per test session: before the residual stream was visited first, matching seeds 0 and 2
    stopped at about half of J on the depth-4 one."""
    if depth not in _TRAINED_VITS:
        x, y = load_dataset("mnist5k").train
        torch.manual_seed(0)
        model = build_model("vit", width=0.5, depth=depth)
        common = {"epochs": 1, "lr": 3e-3, "weight_decay": 0.05, "batch_size": 32}
        trained = train_model(model, (x[:512], y[:512]), optimizer="adamw", seed=0, **common)
        _TRAINED_VITS[depth] = trained[0]
    return _TRAINED_VITS[depth]


@pytest.mark.parametrize(("permutation_seed", "seed"), [(0, 0), (0, 2), (1, 0), (1, 2)])
def test_the_textbook_descent_recovers_a_trained_deep_vit_from_every_seed(permutation_seed, seed):
    spec, sd, permuted, applied = permuted_copy(trained_vit(4), seed=permutation_seed)
    found = reference_weight_matching(spec, sd, permuted, seed=seed)
    assert_recovers(spec, sd, permuted, applied, found)
    assert found.objectives[-1] == pytest.approx(matching_objective(spec, sd, sd), rel=1e-6)


@pytest.mark.parametrize("depth", [2, 4, 6])
@pytest.mark.parametrize("restarts", [1, None])
def test_a_trained_vit_is_recovered_from_every_seed(depth, restarts):
    """Planted permutations 0 and 1 of a trained ViT at depth 2, 4 and 6, matched from seeds 0
    to 3: one descent (stream first) and the default (restarts) recover every one."""
    for permutation_seed in (0, 1):
        spec, sd, permuted, applied = permuted_copy(trained_vit(depth), seed=permutation_seed)
        for seed in range(4):
            found = weight_matching(spec, sd, permuted, seed=seed, restarts=restarts)
            assert_recovers(spec, sd, permuted, applied, found)
            assert found.objectives[-1] == pytest.approx(matching_objective(spec, sd, sd), rel=1e-6)
            assert len(found.descents) == 1  # the first descent reaches the bound: no restart


def test_the_residual_stream_is_found_only_where_layers_share_units():
    """A ViT's embedding dimension and a ResNet's widest stage are streams; no MLP or VGG group
    is (their descent is unchanged)."""
    cases = {
        ("vit", MNIST): "stream",
        ("resnet20", CIFAR): "stage3",
        ("mlp", MNIST): None,
        ("vgg11", CIFAR): None,
    }
    for (name, in_shape), stream in cases.items():
        model = build_model(name, width=0.25, in_shape=in_shape)
        assert residual_stream(permutation_spec(model), model.state_dict()) == stream, name


# ----------------------------------------------------------------------------- forward start


def layerwise_matching(sd_a, sd_b, depth: int = 3) -> dict[str, torch.Tensor]:
    """The forward pass of an MLP written out: hidden layer l matched (scipy, float64) on its
    incoming weights and bias, the previous layer's permutation applied to the inputs; the
    last hidden layer also on the classifier's weights."""
    perms: dict[str, torch.Tensor] = {}
    previous = None
    for layer in range(depth):
        w_a = sd_a[f"hidden.{layer}.linear.weight"].double()
        w_b = sd_b[f"hidden.{layer}.linear.weight"].double()
        if previous is not None:
            w_b = w_b[:, previous]
        cost = w_a @ w_b.T
        cost += torch.outer(
            sd_a[f"hidden.{layer}.linear.bias"], sd_b[f"hidden.{layer}.linear.bias"]
        )
        if layer == depth - 1:
            cost += sd_a["classifier.weight"].double().T @ sd_b["classifier.weight"].double()
        previous = torch.from_numpy(linear_sum_assignment(cost.numpy(), maximize=True)[1])
        perms[f"hidden.{layer}"] = previous
    return perms


def test_the_forward_pass_is_the_layerwise_matching():
    model_a = make("mlp", 0.5, MNIST, "none", seed=0)
    model_b = make("mlp", 0.5, MNIST, "none", seed=1)
    spec = permutation_spec(model_a)
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    expected = layerwise_matching(sd_a, sd_b)
    assert any(not torch.equal(p, torch.arange(len(p))) for p in expected.values())
    for found in (
        weight_matching(spec, sd_a, sd_b, max_iter=1, start="forward", float64_costs=True),
        weight_matching(spec, sd_a, sd_b, max_iter=1, start="forward"),
        reference_weight_matching(spec, sd_a, sd_b, max_iter=1, start="forward"),
    ):
        for group, perm in expected.items():
            assert torch.equal(found[group], perm), group
        exact = matching_objective(spec, sd_a, sd_b, expected)
        assert found.objectives == [pytest.approx(exact, rel=1e-12)]


@pytest.mark.parametrize(
    ("name", "width", "in_shape", "norm"),
    [
        ("mlp", 1.0, MNIST, "none"),
        ("vgg11", 0.125, CIFAR, "bn"),
        ("resnet20", 0.25, CIFAR, "ln"),
        ("vit", 0.5, MNIST, "ln"),
    ],
)
def test_the_optimised_descent_follows_the_reference_from_the_forward_start(
    name, width, in_shape, norm
):
    """Partial matrices, terms added whole later, skipping and low-rank updates: the textbook
    descent's path, sweep by sweep."""
    model_a = make(name, width, in_shape, norm, seed=0)
    model_b = make(name, width, in_shape, norm, seed=1)
    spec = permutation_spec(model_a)
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    expected = reference_weight_matching(spec, sd_a, sd_b, seed=4, start="forward")
    found = weight_matching(spec, sd_a, sd_b, seed=4, restarts=1, start="forward")
    for group in expected:
        assert torch.equal(found[group], expected[group]), group
    assert found.objectives == pytest.approx(expected.objectives, rel=1e-6)
    assert all(b >= a for a, b in zip(found.objectives[1:], found.objectives[2:], strict=False))
    # at convergence: the published descent from the result changes nothing
    again = weight_matching(spec, sd_a, sd_b, seed=9, init_perms=found, restarts=1)
    assert all(torch.equal(again[g], found[g]) for g in found)


class ResidualSquare(torch.nn.Module):
    """``h + relu(fc2(h))``: a square map inside the stream, so tracing gives ``fc2.weight``
    the stream's group on both axes (J is then quadratic in that group's permutation)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.head = (
            torch.nn.Linear(20, 16),
            torch.nn.Linear(16, 16),
            torch.nn.Linear(16, 5),
        )

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.head(h + torch.relu(self.fc2(h)))


@pytest.mark.parametrize("start", START_MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_group_on_both_axes_of_a_tensor_is_judged_on_the_objective_itself(start, seed):
    """Its A_p is only J's linearisation at the current permutation: a step is kept when J
    rises (before, the tracked objective climbed while J fell), and the group is re-solved
    after it moves; the textbook descent does the same, step for step."""
    torch.manual_seed(seed)
    model_a, other = ResidualSquare(), ResidualSquare()
    spec = permutation_spec(model_a, example_input=torch.randn(2, 20))
    assert spec.axes_to_perm["fc2.weight"] == ("fc1", "fc1")
    sd_a = model_a.state_dict()
    noisy = {k: v + 1.5 * other.state_dict()[k] for k, v in sd_a.items()}
    sd_b = apply_permutation(spec, random_permutations(spec, sd_a, seed=seed + 2), noisy)
    found = weight_matching(spec, sd_a, sd_b, seed=seed, start=start, restarts=1)
    textbook = reference_weight_matching(spec, sd_a, sd_b, seed=seed, start=start)
    assert all(torch.equal(found[g], textbook[g]) for g in textbook)
    assert found.objectives == pytest.approx(textbook.objectives, rel=1e-9)
    assert all(b >= a for a, b in zip(found.objectives, found.objectives[1:], strict=False))
    assert found.objectives[-1] == pytest.approx(matching_objective(spec, sd_a, sd_b, found))


def test_a_group_solved_on_a_partial_matrix_is_solved_again_on_its_whole_one():
    """The forward pass solves hidden.0 without hidden.1's term; when hidden.1 then keeps the
    identity (its version never changes), hidden.0 must still be re-solved on its whole
    matrix. Built so that the partial optimum (the rows' permutation sigma, read off the
    first layer alone) and the whole one (the identity, which the strong second layer
    demands) differ."""
    torch.manual_seed(0)
    model = build_model("mlp", width=0.25, in_shape=MNIST, depth=2)
    spec = permutation_spec(model)
    sd_a = {k: v.clone() for k, v in model.state_dict().items()}
    sd_a["hidden.1.linear.weight"] *= 30  # hidden.0 held at the identity through W1
    sd_a["classifier.weight"] *= 100  # hidden.1 held at the identity
    sigma = torch.randperm(
        len(sd_a["hidden.0.linear.bias"]), generator=torch.Generator().manual_seed(1)
    )
    sd_b = {k: v.clone() for k, v in sd_a.items()}
    for key in ("hidden.0.linear.weight", "hidden.0.linear.bias"):  # only the first layer's rows
        sd_b[key] = sd_a[key][sigma]
    first_pass = weight_matching(spec, sd_a, sd_b, max_iter=1, start="forward")
    assert torch.equal(first_pass["hidden.0"], torch.argsort(sigma))
    assert torch.equal(first_pass["hidden.1"], torch.arange(len(first_pass["hidden.1"])))
    found = weight_matching(spec, sd_a, sd_b, start="forward")
    textbook = reference_weight_matching(spec, sd_a, sd_b, start="forward")
    assert torch.equal(found["hidden.0"], textbook["hidden.0"])
    assert not torch.equal(found["hidden.0"], first_pass["hidden.0"])  # re-solved, moved
    assert found.objectives[-1] > first_pass.objectives[0]
    assert found.objectives[-1] == pytest.approx(matching_objective(spec, sd_a, sd_b, found))


@pytest.mark.parametrize(("name", "width", "in_shape", "norm"), CASES, ids=IDS)
def test_the_forward_start_recovers_a_planted_permutation(name, width, in_shape, norm):
    model = make(name, width, in_shape, norm, seed=0)
    spec, sd, permuted, applied = permuted_copy(model, seed=7)
    found = weight_matching(spec, sd, permuted, start="forward")
    assert_recovers(spec, sd, permuted, applied, found)


def trained_mlp(seed: int, data) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = build_model("mlp", width=4, in_shape=MNIST, norm="none")
    common = {"epochs": 3, "lr": 0.05, "weight_decay": 3e-3, "batch_size": 128}
    return train_model(model, data, seed=seed, **common)[0]


def test_the_forward_start_beats_the_published_start_on_trained_mlps():
    """Two 512-unit MLPs trained on disjoint halves of 1,800 digits: the forward start ends at
    a higher objective than the published descent from the identity (by about 5 % on the
    benchmark's pairs) whatever the published descent's seed."""
    x, y = load_dataset("mnist5k").train
    model_a = trained_mlp(0, (x[:900], y[:900]))
    model_b = trained_mlp(1, (x[900:1800], y[900:1800]))
    spec = permutation_spec(model_a)
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    forward = matching_objective(
        spec, sd_a, sd_b, weight_matching(spec, sd_a, sd_b, start="forward")
    )
    published = [
        matching_objective(spec, sd_a, sd_b, weight_matching(spec, sd_a, sd_b, seed=seed))
        for seed in range(3)
    ]
    assert forward > 1.01 * max(published), (forward, published)


def test_a_bad_start_is_refused_before_any_work():
    spec, sd, permuted, _ = permuted_copy(make("mlp", 0.25, MNIST, "none", seed=0), seed=1)
    assert START_MODES == ("identity", "forward")
    for matcher in (weight_matching, reference_weight_matching):
        with pytest.raises(ValueError, match="start = 'fwd': allowed: identity, forward"):
            matcher(spec, sd, permuted, start="fwd")
    init = {g: torch.arange(len(p)) for g, p in random_permutations(spec, sd, seed=0).items()}
    refusal = "start = 'forward' with init_perms: allowed: init_perms with start = 'identity'"
    with pytest.raises(ValueError, match=refusal):
        weight_matching(spec, sd, permuted, start="forward", init_perms=init)


def test_the_default_descent_is_the_published_one():
    """``start`` left out: identity, the same permutations and objectives as ``"identity"``
    (and as before the forward start existed: the reference's path)."""
    model_a = make("mlp", 0.5, MNIST, "none", seed=0)
    model_b = make("mlp", 0.5, MNIST, "none", seed=1)
    spec = permutation_spec(model_a)
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    default = weight_matching(spec, sd_a, sd_b, seed=2)
    identity = weight_matching(spec, sd_a, sd_b, seed=2, start="identity")
    textbook = reference_weight_matching(spec, sd_a, sd_b, seed=2)
    for group in default:
        assert torch.equal(default[group], identity[group])
        assert torch.equal(default[group], textbook[group])
    assert default.objectives == identity.objectives
    first = matching_objective(spec, sd_a, sd_b)
    assert default.objectives[0] >= first and np.isfinite(first)
