"""Tests of fedlmc.merging.methods, the merge entry: ``merge_states`` with and without its info
(``with_info``), the checks it runs before any work, and the built-in methods
(fedlmc.merging.builtin_methods) it finds registered."""

from __future__ import annotations

import pytest
import torch

from fedlmc.merging import builtin_methods, method_registry
from fedlmc.merging.method_registry import METHODS
from fedlmc.merging.methods import merge_states
from fedlmc.models.classifiers import build_model
from fedlmc.permutation import apply_permutation, permutation_spec, random_permutations


def tiny_mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", width=0.125, in_shape=(1, 4, 4), norm="none").eval()


def test_with_info_adds_the_methods_info_to_the_same_merge():
    """A client and its permuted copy: weight matching undoes the permutation, so the merge is
    the client itself, and the info says how many units it moved (all of a random shuffle's
    but the fixed points)."""
    template = tiny_mlp(0)
    spec = permutation_spec(template)
    sd = template.state_dict()
    perms = random_permutations(spec, sd, seed=5)
    states = [sd, apply_permutation(spec, perms, sd)]
    merged, aligned = merge_states("weight_matching", template, states)
    merged_i, aligned_i, info = merge_states("weight_matching", template, states, with_info=True)
    for key in sd:
        assert torch.equal(merged[key], merged_i[key]), key
        assert torch.allclose(merged[key], sd[key], atol=1e-6), key
        assert torch.equal(aligned_i[1][key], sd[key]), key
    moved = sum(int((p != torch.arange(len(p))).sum()) for p in perms.values())
    assert info["aligned_groups"] == len(perms)
    assert info["aligned_units_moved"] == moved > 0
    weighted = merge_states("weight_matching", template, states, [0.5, 0.5], with_info=True)
    assert weighted[2] == info  # equal weights given explicitly: the same merge, the same info
    plain = merge_states("average", template, states, with_info=True)
    assert plain[2] == {}  # plain averaging reports nothing


def test_merge_states_checks_before_any_work():
    template = tiny_mlp(0)
    sd = template.state_dict()
    with pytest.raises(ValueError, match="need at least one client state dict"):
        merge_states("average", template, [], with_info=True)
    with pytest.raises(ValueError, match="'activation_matching' needs server data"):
        merge_states("activation_matching", template, [sd, sd])
    with pytest.raises(ValueError, match="unknown merge method|allowed"):
        merge_states("no_such_method", template, [sd, sd])


CALIBRATED_ROW = (
    r"^{where}: 'weight_matching_t' is a study row, the merge 'weight_matching' with a fitted "
    r"temperature, and {where} fits none; allowed: 'weight_matching' \(then the temperature: "
    r"{call}\)$"
)


def test_a_calibrated_rows_name_is_refused_by_every_entry_that_returns_a_merge():
    """``weight_matching_t`` is a study row (the merge evaluated with a fitted T); the library's
    merge entries return the merge alone, so they refuse the name in one line pointing to the
    merge and to where its temperature comes from, before any work (no server data given)."""
    import re

    from fedlmc.data.splits import DataSplits
    from fedlmc.merging.methods import CALIBRATE_CALL
    from fedlmc.strategies import PermutationAlignedAverage, StrategyOptions
    from fedlmc.study.merge import merge_clients

    template = tiny_mlp(0)
    sd = template.state_dict()
    expected = CALIBRATED_ROW.format(where="merge_states", call=re.escape(CALIBRATE_CALL))
    with pytest.raises(ValueError, match=expected):
        merge_states("weight_matching_t", template, [sd, sd])
    x, y = torch.zeros(4, 1, 4, 4), torch.zeros(4, dtype=torch.long)
    splits = DataSplits("none", (x, y), (x, y), (x, y), 10, (1, 4, 4))
    expected = CALIBRATED_ROW.format(where="merge_clients", call=re.escape(CALIBRATE_CALL))
    with pytest.raises(ValueError, match=expected):
        merge_clients("weight_matching_t", template, [sd, sd], None, splits)
    where = re.escape("PermutationAlignedAverage(method='weight_matching_t')")
    call = re.escape("StrategyOptions(calibration='server' or 'federated')")
    with pytest.raises(ValueError, match=CALIBRATED_ROW.format(where=where, call=call)):
        PermutationAlignedAverage(
            template,
            StrategyOptions(num_clients=2, calibration="server"),
            method="weight_matching_t",
        )
    with pytest.raises(ValueError, match="unknown merge method|allowed"):
        merge_states("no_such_method_t", template, [sd, sd])  # not a row: unknown, as before


def test_every_built_in_method_is_registered_before_the_first_merge():
    registered = {entry.align for entry in METHODS}
    built_in = {
        value
        for name, value in vars(builtin_methods).items()
        if callable(value) and getattr(value, "__module__", "") == builtin_methods.__name__
    }
    assert {m.name for m in METHODS} >= {"average", "weight_matching", "auto", "merge_many"}
    # every registered built-in is defined in builtin_methods; the registry module defines none
    assert {f for f in registered if f.__module__ == builtin_methods.__name__} <= built_in
    assert not [f for f in registered if f.__module__ == method_registry.__name__]
