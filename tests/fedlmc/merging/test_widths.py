"""Merge methods for clients of different widths (fedlmc.merging.widths and the registry)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedlmc.merging.method_registry import METHODS, merge_method_names, study_methods
from fedlmc.merging.methods import merge_states
from fedlmc.merging.widths import match_to_widest, width_weights
from fedlmc.models import build_model
from fedlmc.permutation.embed import embed_state

FLAT = (1, 4, 4)
MIXED = [m.name for m in METHODS if m.needs.mixed_widths]


def _mlp(width: float, seed: int = 0, **options) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", width, in_shape=FLAT, **options).eval()


def _function(template: nn.Module, state, x) -> torch.Tensor:
    model = build_model(**template.config).eval()
    model.load_state_dict(state)
    with torch.no_grad():
        return model(x)


def test_the_registry_lists_the_mixed_width_methods_with_calibrated_rows():
    assert MIXED == [
        "embed_average",
        "embed_weight_matching",
        "embed_weight_matching_repair",
        "heterofl",
    ]
    assert set(MIXED) <= set(merge_method_names())
    assert {f"{m}_t" for m in MIXED} <= set(study_methods())
    from fedlmc.simulations.config.tables import methods_table

    lines = {line.split(" | ")[0]: line for line in methods_table().splitlines()}
    assert "| mixed widths |" in methods_table()
    assert " | yes | yes | yes | mixed widths: " in lines["| `heterofl`, `heterofl_t`"]
    assert " | yes | yes | no | plain weighted" in lines["| `average`, `average_t`"]


@pytest.mark.parametrize("method", MIXED)
@pytest.mark.parametrize("norm", ["none", "bn"])
def test_a_narrow_model_merged_with_itself_keeps_its_function(method, norm):
    narrow, server = _mlp(0.125, 1, norm=norm), _mlp(0.25, 2, norm=norm)
    x = torch.randn(4, *FLAT)
    with torch.no_grad():
        expected = narrow(x)
    for states, weights in (([narrow.state_dict()], [1.0]), ([narrow.state_dict()] * 2, [1, 3])):
        data = (x, torch.zeros(4, dtype=torch.long))
        merged, aligned = merge_states(method, server, states, weights, server_data=data)
        assert merged["hidden.0.linear.weight"].shape == (32, 16)
        torch.testing.assert_close(_function(server, merged, x), expected, rtol=1e-5, atol=1e-6)
        assert len(aligned) == len(states)


def _planted(narrow: nn.Module, wide: nn.Module, slots, keep_others: bool):
    """``wide``'s state with ``narrow`` written in at ``slots`` (its other entries kept or 0)."""
    embedded = embed_state(narrow.state_dict(), wide, slots)
    if not keep_others:
        return dict(embedded)
    own = wide.state_dict()
    return {k: torch.where(embedded.holders[k], embedded[k], own[k]) for k in own}


def test_weight_matching_recovers_a_narrow_model_planted_in_a_permuted_wide_one():
    narrow, wide = _mlp(0.25, 3, depth=2), _mlp(0.5, 4, depth=2)
    spec = wide.permutation_spec()
    hidden = torch.Generator().manual_seed(5)
    slots = {g: torch.randperm(64, generator=hidden)[:32] for g in spec.perm_to_axes}
    planted = _planted(narrow, wide, slots, keep_others=True)
    matched, objectives = match_to_widest(wide, [planted, narrow.state_dict()], spec)
    for group, expected in slots.items():
        assert torch.equal(matched[1].slots[group], expected), group
    assert objectives[1] > 0 and torch.equal(matched[0].slots["hidden.0"], torch.arange(64))


def test_matching_merges_a_planted_copy_into_the_narrow_function_and_first_slots_do_not():
    narrow, wide = _mlp(0.25, 3, depth=2), _mlp(0.5, 4, depth=2)
    generator = torch.Generator().manual_seed(6)
    slots = {g: torch.randperm(64, generator=generator)[:32] for g in ("hidden.0", "hidden.1")}
    planted = _planted(narrow, wide, slots, keep_others=False)
    x = torch.randn(8, *FLAT)
    with torch.no_grad():
        expected = narrow(x)
    states = [planted, narrow.state_dict()]
    merged, _ = merge_states("embed_weight_matching", wide, states, [1, 1])
    torch.testing.assert_close(_function(wide, merged, x), expected, rtol=1e-5, atol=1e-6)
    nested, _ = merge_states("embed_average", wide, states, [1, 1])
    assert not torch.allclose(_function(wide, nested, x), expected, atol=1e-2)


def _constant_state(model: nn.Module, value: float) -> dict[str, torch.Tensor]:
    return {k: torch.full_like(v, value) for k, v in model.state_dict().items()}


def test_heterofl_averages_each_entry_over_its_holders_only():
    # one hidden layer: 2 inputs, narrow 1 unit, wide 2 units, server 3 units, 2 classes
    def build(units):
        return build_model("mlp", 1, num_classes=2, in_shape=(1, 1, 2), depth=1, base_hidden=units)

    narrow, wide, server = build(1), build(2), build(3)
    states = [_constant_state(narrow, 1.0), _constant_state(wide, 5.0)]
    merged, _ = merge_states("heterofl", server, states, [1, 3])
    # unit 0 held by both: (1 * 1 + 3 * 5) / 4 = 4; unit 1 by the wide client only: 5; unit 2
    # by nobody: 0. The classifier bias (no hidden axis) is held by both: 4.
    expected_rows = torch.tensor([[4.0, 4.0], [5.0, 5.0], [0.0, 0.0]])
    assert torch.equal(merged["hidden.0.linear.weight"], expected_rows)
    assert torch.equal(merged["hidden.0.linear.bias"], torch.tensor([4.0, 5.0, 0.0]))
    assert torch.equal(merged["classifier.weight"], expected_rows.T)
    assert torch.equal(merged["classifier.bias"], torch.tensor([4.0, 4.0]))
    plain, _ = merge_states("embed_average", server, states, [1, 3])
    # the plain average shrinks the wide-only unit by the narrow client's weight: 3/4 * 5
    assert torch.equal(plain["hidden.0.linear.bias"], torch.tensor([4.0, 3.75, 0.0]))


def test_width_weights_count_each_clients_entries():
    narrow, wide = _mlp(0.125, depth=1), _mlp(0.25, depth=1)
    states = [narrow.state_dict(), wide.state_dict()]
    # (16 + 1) * 16 + (16 + 1) * 10 = 442 entries; (16 + 1) * 32 + (32 + 1) * 10 = 874
    assert width_weights(states) == [442.0, 874.0]
    assert width_weights(states, [10, 20], by="samples_width") == [4420.0, 17480.0]
    with pytest.raises(ValueError, match="client weighting 'depth'; allowed: samples, width"):
        width_weights(states, by="depth")


def test_same_width_methods_refuse_mixed_shapes_before_any_work():
    narrow, wide = _mlp(0.125), _mlp(0.25)
    states = [wide.state_dict(), narrow.state_dict()]
    for method in (m.name for m in METHODS if not m.needs.mixed_widths):
        with pytest.raises(ValueError, match=rf"^merge method '{method}' needs clients of one "):
            merge_states(method, wide, states)
    with pytest.raises(ValueError, match=r"\(32, 16\) in client 0 and \(16, 16\) in client 1"):
        merge_states("weight_matching", wide, states)


def test_mixed_methods_name_the_client_wider_than_the_server():
    narrow, wide = _mlp(0.125), _mlp(0.25)
    with pytest.raises(ValueError, match="^client 1: cannot embed: group 'hidden.0' has 32"):
        merge_states("heterofl", narrow, [narrow.state_dict(), wide.state_dict()])


@pytest.mark.parametrize(
    ("method", "norm"), [("embed_weight_matching_repair", "none"), ("heterofl", "bn")]
)
def test_batchnorm_and_repair_finish_a_mixed_width_merge_as_for_equal_widths(method, norm):
    from fedlmc.merging.post_merge import ServerData, post_merge

    narrow, wide = _mlp(0.125, 1, norm=norm), _mlp(0.25, 2, norm=norm)
    data = ServerData(torch.randn(64, *FLAT), torch.randint(0, 10, (64,)))
    x = torch.randn(4, *FLAT)
    merged, aligned = merge_states(method, wide, [narrow.state_dict()] * 2, server_data=data)
    done = post_merge(wide, merged, aligned, [0.5, 0.5], method, data, device="cpu")
    assert (done.repaired, done.bn_source != "none") == (norm == "none", norm == "bn")
    if norm == "none":  # the clients are one model: REPAIR's targets are its own statistics
        with torch.no_grad():
            torch.testing.assert_close(done.model(x), narrow(x), rtol=1e-4, atol=1e-5)
    merged, aligned = merge_states(
        method, wide, [narrow.state_dict(), wide.state_dict()], server_data=data
    )
    done = post_merge(wide, merged, aligned, [0.5, 0.5], method, data, device="cpu")
    with torch.no_grad():
        assert torch.isfinite(done.model(x)).all()
