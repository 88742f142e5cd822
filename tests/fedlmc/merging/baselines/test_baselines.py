"""The published baselines registered as merge methods (:mod:`fedlmc.merging.baselines.baselines`):
RESCALE, CCA Merge and Preserve-First Merging."""

from __future__ import annotations

import torch

from fedlmc.merging.method_registry import METHODS
from fedlmc.merging.methods import merge_states
from fedlmc.models.classifiers import build_model
from fedlmc.study.method_policy import evaluation_of


def mlp(seed: int):
    torch.manual_seed(seed)
    return build_model("mlp", width=0.25, num_classes=10, in_shape=(1, 8, 8), depth=2)


def server_data(n: int = 64):
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 8, 8, generator=generator), torch.arange(n) % 10


def test_identical_clients_are_their_own_rescaled_and_cca_merge():
    template = mlp(0)
    state = template.state_dict()
    for method in ("average_rescale", "cca_merge"):
        merged, _ = merge_states(method, template, [state, state], server_data=server_data())
        for key in state:
            assert torch.allclose(merged[key], state[key], atol=1e-4), (method, key)


def test_rescale_changes_a_shrunk_average_and_stays_off_the_path():
    template = mlp(0)
    states = [template.state_dict(), mlp(1).state_dict()]
    plain, _ = merge_states("average", template, states)
    rescaled, _ = merge_states("average_rescale", template, states, server_data=server_data())
    assert any(not torch.allclose(plain[k], rescaled[k]) for k in plain)
    assert not evaluation_of("average_rescale").on_path and evaluation_of("cca_merge").on_path


def test_the_baselines_declare_their_needs():
    assert (
        METHODS.get("cca_merge").needs.plain_chain_only
        and METHODS.get("cca_merge").needs.server_data
    )
    for method in ("preserve_first", "weight_matching_preserve_first"):
        entry = METHODS.get(method)
        assert (
            entry.rule.builds_model is not None
            and entry.needs.plain_chain_only
            and not evaluation_of(entry.name).on_path
        )
