"""fedlmc.study.merge: the one merge of a study reads its context (the weighted average, the same
as ``merge_clients``), re-estimates BatchNorm statistics, undoes a planted permutation, and
gives each method's path rule and parameter ratio."""

from __future__ import annotations

import torch

from fedlmc.averaging import interpolate
from fedlmc.models.classifiers import build_model
from fedlmc.permutation import apply_permutation, permutation_spec, random_permutations
from fedlmc.study.compare import study_context
from fedlmc.study.merge import (
    merge_clients,
    merge_in_context,
    parameter_count,
    parameters_ratio,
    path_rule,
)
from tests.fedlmc.study.test_context import mlp, tiny_splits


def test_merge_in_context_is_the_weighted_average_and_merge_clients_agrees():
    splits = tiny_splits()
    template = mlp(0)
    states = [mlp(1).state_dict(), mlp(2).state_dict()]
    context = study_context(
        template, states, [3, 1], splits, device=torch.device("cpu"), diagnostics=False
    )
    merged = merge_in_context(context, "average")
    for key, value in merged.state.items():
        assert torch.allclose(value, 0.75 * states[0][key] + 0.25 * states[1][key]), key
    state, info = merge_clients("average", template, states, [3, 1], splits)
    assert info["method"] == "average" and info["bn_reset"] is False
    for key in state:
        assert torch.equal(state[key], merged.state[key]), key


def test_weight_matching_undoes_a_planted_permutation_and_batchnorm_is_re_estimated():
    torch.manual_seed(0)
    template = build_model("mlp", width=0.125, in_shape=(1, 4, 4), norm="bn").eval()
    spec, state = permutation_spec(template), template.state_dict()
    permuted = apply_permutation(spec, random_permutations(spec, state, seed=1), state)
    context = study_context(
        template,
        [state, permuted],
        None,
        tiny_splits(),
        device=torch.device("cpu"),
        diagnostics=False,
    )
    merged = merge_in_context(context, "weight_matching")
    assert merged.bn_reset and not merged.repaired and merged.template_shaped
    for key in state:
        if not key.endswith(("running_mean", "running_var", "num_batches_tracked")):
            assert torch.allclose(merged.aligned[1][key], state[key]), key
            assert torch.allclose(merged.combined[key], state[key]), key
    assert parameters_ratio(merged, template) == 1.0


def test_each_method_has_its_path_rule():
    template = mlp(0)
    a, b = mlp(1).state_dict(), mlp(2).state_dict()
    assert path_rule("average", template, None) is interpolate
    assert path_rule("random_direction", template, None) is None
    lewc = path_rule("average_lewc_bias", template, None)
    at_one = lewc(a, b, 1.0)  # weights (1, 0): client a itself
    assert all(torch.allclose(at_one[k], a[k]) for k in a)
    half = lewc(a, b, 0.5)
    weight = next(k for k in a if k.endswith("weight"))
    assert torch.allclose(half[weight], (a[weight] + b[weight]) / 2)


def test_parameter_count_is_the_models_own_or_its_parameters():
    model = mlp(0)
    assert parameter_count(model) == sum(p.numel() for p in model.parameters())
    model.parameter_count = 7
    assert parameter_count(model) == 7
