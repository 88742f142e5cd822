"""The flatness control ``random_direction``: client 0 moved by a seeded Gaussian direction of
exactly the length of its step to the plain average; two clients only, refused before any work
otherwise; registered like every merge method (study rows, schema, docs tables)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedlmc.averaging import average
from fedlmc.data.loading import from_arrays
from fedlmc.merging.method_registry import merge_method, study_methods
from fedlmc.merging.methods import merge_states
from fedlmc.merging.random_direction import global_norm
from fedlmc.models.classifiers import build_model
from fedlmc.simulations.config import ConfigError, validate_run_config
from fedlmc.simulations.config.tables import columns_table, methods_table
from fedlmc.strategies import PermutationAlignedAverage, StrategyOptions
from fedlmc.study.compare import compare_methods, default_methods
from fedlmc.study.method_policy import evaluation_of

ROOT = Path(__file__).resolve().parents[3]


def mlp(seed: int, norm: str = "none") -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", width=0.125, depth=2, in_shape=(1, 4, 4), norm=norm)


def float64_states(count: int, norm: str = "none") -> tuple[torch.nn.Module, list[dict]]:
    """``count`` independently initialised tiny MLPs in float64 (so norms are exact to 1e-12);
    BatchNorm buffers made distinct per client so that keeping client 0's can be seen."""
    states = []
    for seed in range(count):
        sd = {
            k: v.double() if v.is_floating_point() else v
            for k, v in mlp(seed, norm).state_dict().items()
        }
        for key in [k for k in sd if k.endswith("running_mean")]:
            sd[key] = torch.full_like(sd[key], float(seed + 1))
        states.append(sd)
    return mlp(0, norm).double(), states


def parameter_step(moved: dict, start: dict, template: torch.nn.Module) -> float:
    return global_norm([moved[k] - start[k] for k, _ in template.named_parameters()])


@pytest.mark.parametrize(("weights", "norm"), [([1, 1], "none"), ([3, 1], "bn")])
def test_the_moved_endpoint_is_exactly_the_average_steps_length_away(weights, norm):
    template, states = float64_states(2, norm)
    merged, aligned, info = merge_states(
        "random_direction", template, states, weights, seed=7, with_info=True
    )
    plain = average(states, weights)
    length = parameter_step(plain, states[0], template)
    w1 = weights[1] / sum(weights)  # the step to the average is w_1 (theta_1 - theta_0)
    assert length == pytest.approx(w1 * parameter_step(states[1], states[0], template), rel=1e-12)
    assert info["random_direction_step_norm"] == pytest.approx(length, rel=1e-12)
    assert parameter_step(merged, states[0], template) == pytest.approx(length, rel=1e-12)
    assert aligned[0] is states[0] and aligned[1] is states[1]  # the clients are left as they are
    buffers = [k for k in merged if k not in dict(template.named_parameters())]
    assert all(torch.equal(merged[k], states[0][k]) for k in buffers)  # client 0's, not averaged
    assert (norm == "bn") == any(k.endswith("running_mean") for k in buffers)
    step = torch.cat([(plain[k] - states[0][k]).flatten() for k, _ in template.named_parameters()])
    moved = torch.cat(
        [(merged[k] - states[0][k]).flatten() for k, _ in template.named_parameters()]
    )
    cosine = float(step @ moved) / (float(step.norm()) * float(moved.norm()))
    assert abs(cosine) < 0.2  # a random direction of ~500 entries, not the average's


def test_the_direction_is_fixed_by_the_seed_and_changes_with_it():
    template, states = float64_states(2)
    first, _ = merge_states("random_direction", template, states, seed=3)
    again, _ = merge_states("random_direction", template, states, seed=3)
    other, _ = merge_states("random_direction", template, states, seed=4)
    keys = [k for k, _ in template.named_parameters()]
    assert all(torch.equal(first[k], again[k]) for k in keys)
    assert all(not torch.allclose(first[k], other[k]) for k in keys)


def test_identical_clients_leave_client_zero_where_it_is():
    template, states = float64_states(1)
    merged, _ = merge_states("random_direction", template, [states[0], dict(states[0])])
    assert all(torch.equal(merged[k], states[0][k]) for k in states[0])


def tiny_splits():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 1, 4, 4, generator=g)
    y = torch.randint(0, 10, (120,), generator=g)
    return from_arrays(x[:80], y[:80], x[80:], y[80:], num_classes=10, server_fraction=0.25)


def test_more_than_two_clients_are_refused_before_any_work():
    template, states = float64_states(3)
    with pytest.raises(
        ValueError, match="^merge method 'random_direction' with 3 clients: allowed: at"
    ):
        merge_states("random_direction", template, states)
    splits = tiny_splits()
    with pytest.raises(ValueError, match="'random_direction_t' with 3 clients: allowed: at most 2"):
        compare_methods(template.float(), states, None, splits, ["average", "random_direction_t"])
    assert "random_direction" in default_methods(2) and "random_direction" not in default_methods(3)
    assert "average" in default_methods(3)
    with pytest.raises(ConfigError, match="'random_direction' with 3 clients: allowed: at most 2"):
        validate_run_config({"methods": "average,random_direction", "num-clients": 3})
    with pytest.raises(ConfigError, match="'random_direction' with 4 clients: allowed: at most 2"):
        validate_run_config({"strategy": "aligned", "align": "random_direction", "num-clients": 4})
    assert validate_run_config({"methods": "random_direction_t"})["methods"] == "random_direction_t"


def test_it_is_registered_in_every_list():
    entry = merge_method("random_direction_t")
    assert (entry.name, entry.needs.many_clients, evaluation_of(entry.name).on_path) == (
        "random_direction",
        False,
        False,
    )
    assert {"random_direction", "random_direction_t"} <= set(study_methods())
    assert "`random_direction`, `random_direction_t`" in methods_table()
    assert "`random_direction_step_norm`" in columns_table()
    docs = (ROOT / "docs" / "methods.md").read_text()
    assert "`random_direction`, `random_direction_t`" in docs


def test_its_rows_have_no_barriers_but_a_merge_gap():
    template, states = float64_states(2)
    states = [
        {k: v.float() if v.is_floating_point() else v for k, v in sd.items()} for sd in states
    ]
    rows = compare_methods(
        template.float(),
        states,
        [1, 1],
        tiny_splits(),
        ["random_direction", "random_direction_t"],
        lambdas=3,
        diagnostic_samples=16,
    ).rows
    raw, calibrated = rows
    assert (raw["method"], calibrated["method"]) == ("random_direction", "random_direction_t")
    assert raw["accuracy"] == calibrated["accuracy"] and raw["temperature"] == 1.0
    assert calibrated["temperature"] != 1.0 and calibrated["nll"] == calibrated["nll_calibrated"]
    assert raw["curve"] == "" and raw["loss_barrier_half"] != raw["loss_barrier_half"]  # NaN
    assert raw["merge_gap_loss"] == pytest.approx(raw["nll_raw"] - raw["endpoint_nll_mean"])
    assert raw["random_direction_step_norm"] > 0


def test_the_aligned_strategy_refuses_it_for_more_than_two_clients():
    template = mlp(0)
    strategy = PermutationAlignedAverage(
        template, StrategyOptions(num_clients=2, calibration="none"), method="random_direction"
    )
    assert strategy.merge_method == "random_direction"
    with pytest.raises(ValueError, match="'random_direction' with 3 clients: allowed: at most 2"):
        PermutationAlignedAverage(
            template, StrategyOptions(num_clients=3, calibration="none"), method="random_direction"
        )
