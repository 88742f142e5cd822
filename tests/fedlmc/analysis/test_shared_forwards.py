"""fedlmc.analysis.shared_forwards: a model seen before is not run again, and what comes back is
what the unshared computation gives; a changed model, other inputs or a full budget miss."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedlmc.analysis.diagnostics import capture, relu_layers
from fedlmc.analysis.shared_forwards import ForwardCache, active_cache, sharing
from fedlmc.averaging import load_state
from fedlmc.capture import linear_layers


def mlp(seed: int = 0, inplace: bool = False) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(6, 8), nn.ReLU(inplace=inplace), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3)
    ).eval()


def inputs(count: int = 20, seed: int = 1) -> torch.Tensor:
    return torch.randn(count, 6, generator=torch.Generator().manual_seed(seed))


class Counter:
    """Forward passes of the top-level model (its class, ``nn.Sequential``)."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> Counter:
        def hook(module, _inputs, _output):
            if type(module) is nn.Sequential:
                self.count += 1

        self.handle = torch.nn.modules.module.register_module_forward_hook(hook)
        return self

    def __exit__(self, *_exc) -> None:
        self.handle.remove()


def planned(model: nn.Module) -> ForwardCache:
    return ForwardCache(
        plan={"output": ["1", "3", ""], "input": [*linear_layers(model), *relu_layers(model)]}
    )


def test_every_planned_capture_of_a_model_comes_from_one_pass_and_equals_the_unshared():
    model, x = mlp(), inputs()
    expected_out = capture(model, ["1", "3", ""], x)
    expected_in = capture(model, list(linear_layers(model)), x, mode="input")
    cache = planned(model)
    with Counter() as passes, sharing(cache):
        out = capture(model, ["1", "3", ""], x)
        again = capture(load_state(model, model.state_dict()), ["3"], x)  # an equal copy
        got_in = capture(model, list(linear_layers(model)), x, mode="input")
    assert passes.count == 1 and (cache.misses, cache.hits) == (1, 2)
    for name, tensor in expected_out.items():
        assert out[name].dtype == torch.float64 and torch.equal(out[name], tensor)
    assert torch.equal(again["3"], expected_out["3"])
    for name, tensor in expected_in.items():
        assert torch.equal(got_in[name], tensor)


def test_a_model_changed_in_place_other_inputs_and_an_unplanned_module_run_again():
    model, x = mlp(), inputs()
    with Counter() as passes, sharing(planned(model)):
        first = capture(model, ["1"], x)
        capture(model, ["1"], x.clone())  # equal values, another tensor: not the same inputs
        capture(model, ["2"], x)  # not in the plan: one more pass for it
        with torch.no_grad():
            model[0].weight[0, 0] += 1.0
        changed = capture(model, ["1"], x)
    assert passes.count == 4
    assert not torch.equal(changed["1"], first["1"])
    assert torch.equal(changed["1"], capture(model, ["1"], x)["1"])


def test_captures_are_copies_taken_in_the_hook():
    """An in-place ReLU overwrites its input after the pre-hook saw it; what the cache hands
    back cannot be changed through the returned tensor either."""
    model, x = mlp(inplace=True), inputs()
    expected = capture(model, ["1"], x, mode="input")
    assert bool((expected["1"] < 0).any())  # the pre-activation, negative entries included
    with sharing(planned(model)):
        got = capture(model, ["1"], x, mode="input")
        got["1"].zero_()
        again = capture(model, ["1"], x, mode="input")
    assert torch.equal(again["1"], expected["1"])


def test_the_budget_bounds_what_is_kept_least_recently_used_first():
    a, b, x = mlp(0), mlp(1), inputs()
    with Counter() as passes, sharing(ForwardCache(plan={"output": ["1"]}, budget=0)) as none:
        capture(a, ["1"], x)
        capture(a, ["1"], x)
    assert passes.count == 2 and not none.entries  # an entry over the budget is not kept
    one = ForwardCache(plan={"output": ["1"]})
    with sharing(one):
        capture(a, ["1"], x)
    one.budget = one.nbytes  # room for one model
    with Counter() as passes, sharing(one):
        capture(b, ["1"], x)  # evicts a
        capture(b, ["1"], x)
        capture(a, ["1"], x)
    assert passes.count == 2 and one.nbytes <= one.budget


def test_memo_computes_once_per_distinct_models_inputs_and_tag():
    a, x = mlp(0), inputs()
    calls = []
    cache = ForwardCache()

    def compute():
        calls.append(1)
        return len(calls)

    assert cache.memo("t", [a, mlp(1)], (x,), compute) == 1
    assert cache.memo("t", [load_state(a, a.state_dict()), mlp(1)], (x,), compute) == 1
    assert cache.memo("t", [mlp(1), a], (x,), compute) == 2  # order matters
    assert cache.memo("u", [a, mlp(1)], (x,), compute) == 3
    assert cache.memo("t", [a, mlp(1)], (x.clone(),), compute) == 4
    assert len(calls) == 4


def test_sharing_is_scoped_and_unknown_modules_are_still_refused():
    model, x = mlp(), inputs()
    outer, inner = ForwardCache(), ForwardCache()
    with sharing(outer):
        with sharing(inner):
            assert active_cache() is inner
            with pytest.raises(ValueError, match="'nope' not found"):
                capture(model, ["nope"], x)
        assert active_cache() is outer
    assert active_cache() is None
