"""CCA Merge (fedlmc.merging.baselines.cca and the ``cca_merge`` method of
fedlmc.merging.baselines.baselines): a permuted copy gives the exact permutation at any ridge, a
permuted and positively rescaled copy is recovered at ridge 0, N = 3 works, the merge of a model
with such copies computes the model, and models that are not norm-free chains are refused naming the
model; with fewer samples than units only a ridge keeps the maps defined, and the run-config key
``cca-ridge`` sets it."""

from __future__ import annotations

import pytest
import torch

from fedlmc.analysis.diagnostics import capture
from fedlmc.averaging import load_state
from fedlmc.merging.baselines.baselines import CCA_RIDGE
from fedlmc.merging.baselines.cca import cca_align, cca_map
from fedlmc.merging.methods import merge_states
from fedlmc.models.classifiers import build_model
from fedlmc.permutation.model_spec import permutation_spec
from fedlmc.permutation.spec import apply_permutation, random_permutations
from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.config.run_plan import plan_run

SMALL = (1, 6, 6)
GROUPS = ("hidden.0", "hidden.1")


def _mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", in_shape=SMALL, depth=2, base_hidden=8).eval()


def _inputs(n: int = 2000) -> torch.Tensor:
    return torch.randn(n, *SMALL, generator=torch.Generator().manual_seed(0))


def _scaled(state: dict, group: int, factors: torch.Tensor) -> dict:
    """``state`` with hidden group ``group``'s units multiplied by ``factors`` > 0 (rows of its
    layer and bias) and divided out in the next layer's columns: the same function (ReLU)."""
    out = dict(state)
    layer, reader = f"hidden.{group}.linear", (f"hidden.{group + 1}.linear", "classifier")
    out[f"{layer}.weight"] = state[f"{layer}.weight"] * factors[:, None]
    out[f"{layer}.bias"] = state[f"{layer}.bias"] * factors
    nxt = reader[0] if f"{reader[0]}.weight" in state else reader[1]
    out[f"{nxt}.weight"] = state[f"{nxt}.weight"] / factors[None, :]
    return out


def _no_dead_units(model: torch.nn.Module, x: torch.Tensor) -> bool:
    acts = capture(model, [f"{g}.relu" for g in GROUPS], x)
    return all(bool((a.std(0) > 1e-3).all()) for a in acts.values())


def test_a_permuted_copy_gives_the_exact_permutation_at_any_ridge():
    x = torch.rand(500, 5, dtype=torch.float64)
    perm = torch.tensor([3, 0, 4, 1, 2])
    for ridge in (0.0, 0.3):
        t, t_inv = cca_map(x, x[:, perm], ridge=ridge)
        expected = torch.eye(5, dtype=torch.float64)[perm].T  # P^T: the copy's units back
        torch.testing.assert_close(t, expected, atol=1e-8, rtol=0)
        torch.testing.assert_close(t @ t_inv, torch.eye(5, dtype=torch.float64))


def test_a_rescaled_copy_is_recovered_at_ridge_zero_only():
    x = torch.rand(500, 4, dtype=torch.float64) + torch.randn(500, 4, dtype=torch.float64)
    d = torch.tensor([0.5, 2.0, 3.0, 0.25], dtype=torch.float64)
    t, _ = cca_map(x, x * d, ridge=0.0)
    torch.testing.assert_close(t, torch.diag(1 / d), atol=1e-8, rtol=0)
    t_ridge, _ = cca_map(x, x * d, ridge=0.3)
    assert float((t_ridge - torch.diag(1 / d)).abs().max()) > 1e-3


def test_cca_merge_of_a_model_with_permuted_and_rescaled_copies_computes_the_model():
    a, x = _mlp(), _inputs()
    assert _no_dead_units(a, x)  # a dead unit leaves the map arbitrary on it
    spec = permutation_spec(a)
    state = {k: v.double() for k, v in a.state_dict().items()}
    a = load_state(a.double(), state)
    b = apply_permutation(spec, random_permutations(spec, state, seed=1), state)
    c = _scaled(_scaled(state, 0, torch.linspace(0.5, 2.0, 8).double()), 1, torch.full((8,), 3.0))
    c = apply_permutation(spec, random_permutations(spec, c, seed=2), c)
    y = torch.zeros(len(x), dtype=torch.long)
    merged, aligned, info = merge_states(
        "cca_merge",
        a,
        [state, b, c],
        [0.2, 0.3, 0.5],
        server_data=(x.double(), y),
        options={"cca_ridge": 0.0},
        with_info=True,
    )
    with torch.no_grad():
        expected = a(x.double())
        for sd in (*aligned, merged):
            torch.testing.assert_close(load_state(a, sd)(x.double()), expected)
    # client c's first map undoes scales 0.5..2 (condition 4), its second a uniform 3 (1)
    assert info["cca_map_condition"] == pytest.approx(4.0, rel=1e-6)


def test_the_maps_of_a_permuted_copy_are_permutations_and_the_reference_is_kept():
    a, x = _mlp(), _inputs()
    spec = permutation_spec(a)
    perms = random_permutations(spec, a.state_dict(), seed=4)
    b = load_state(a, apply_permutation(spec, perms, a.state_dict()))
    aligned, maps = cca_align([a, b], spec, x, ridge=CCA_RIDGE)
    assert maps[0] == {} and aligned[0].keys() == a.state_dict().keys()
    for group in GROUPS:
        t = maps[1][group][0]
        torch.testing.assert_close(
            t, torch.eye(8, dtype=t.dtype)[perms[group]].T, atol=1e-6, rtol=0
        )
    for key, value in a.state_dict().items():
        torch.testing.assert_close(aligned[1][key], value, atol=1e-5, rtol=1e-5)


def test_cca_merge_of_three_independent_models_differs_from_the_plain_average():
    models, x = [_mlp(seed) for seed in range(3)], _inputs(600)
    states = [m.state_dict() for m in models]
    y = torch.zeros(len(x), dtype=torch.long)
    merged, aligned, info = merge_states(
        "cca_merge", models[0], states, server_data=(x, y), with_info=True
    )
    plain, _ = merge_states("average", models[0], states)
    assert len(aligned) == 3 and info["cca_map_condition"] > 1.0
    key = "hidden.0.linear.weight"
    assert float((merged[key] - plain[key]).abs().max()) > 1e-3
    torch.testing.assert_close(aligned[0][key], states[0][key])


@pytest.mark.parametrize(
    ("name", "options", "shown"),
    [
        ("resnet20", {"width": 0.125, "norm": "none"}, "ResNet20"),
        ("mlp", {"depth": 2, "base_hidden": 8, "norm": "bn"}, "MLP"),
    ],
)
def test_models_that_are_not_norm_free_chains_are_refused_naming_the_model(name, options, shown):
    torch.manual_seed(0)
    model = build_model(name, in_shape=(3, 8, 8) if name == "resnet20" else SMALL, **options)
    states = [model.state_dict(), model.state_dict()]
    x = torch.randn(8, *((3, 8, 8) if name == "resnet20" else SMALL))
    with pytest.raises(ValueError, match=f"'cca_merge': model '{shown}' is not supported"):
        merge_states("cca_merge", model, states, server_data=(x, torch.zeros(8).long()))


def test_a_negative_ridge_and_ridge_zero_on_a_dead_unit_are_refused():
    with pytest.raises(ValueError, match="CCA ridge must be >= 0, got -0.1"):
        cca_map(torch.rand(10, 2), torch.rand(10, 2), ridge=-0.1)
    dead = torch.cat([torch.rand(50, 2), torch.zeros(50, 1)], dim=1)
    with pytest.raises(ValueError, match="units without variance"):
        cca_map(dead, torch.rand(50, 3), ridge=0.0)
    t, t_inv = cca_map(dead, torch.rand(50, 3), CCA_RIDGE)  # the default keeps it invertible
    assert bool(torch.isfinite(t).all()) and bool(torch.isfinite(t_inv).all())


def test_fewer_samples_than_units_need_the_ridge_and_the_run_config_sets_it():
    a, b = _mlp(0), _mlp(1)
    x, y = _inputs(6), torch.zeros(6, dtype=torch.long)  # 6 samples, 8 units: rank at most 5
    states = [a.state_dict(), b.state_dict()]

    def merged(ridge: float) -> dict[str, torch.Tensor]:
        return merge_states(
            "cca_merge", a, states, server_data=(x, y), options={"cca_ridge": ridge}, with_info=True
        )[0]

    with pytest.raises(ValueError, match="ridge > 0"):
        merged(0.0)
    small, large = merged(1e-4), merged(1e-1)
    assert any(not torch.allclose(small[k], large[k], atol=1e-4) for k in small)
    config = validate_run_config({"methods": "cca_merge_t", "cca-ridge": 1e-3})
    assert plan_run(config).method_options["cca_ridge"] == 1e-3
