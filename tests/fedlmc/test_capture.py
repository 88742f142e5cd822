"""The one forward-capture helper: hooks, no gradients, every module's mode put back exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedlmc.analysis.diagnostics import capture
from fedlmc.capture import StopForward, forward_capture, linear_layers, training_mode
from fedlmc.merging.calibrate import bn_statistics
from fedlmc.merging.repair import unit_statistics
from fedlmc.permutation.matching import activation_matching


def mixed_model() -> nn.Sequential:
    """A conv net whose modules are in mixed modes: the net in train mode, its BatchNorm frozen
    (eval), its head in eval mode, one ReLU in train mode inside the head."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Sequential(nn.Linear(4 * 4 * 4, 8), nn.ReLU(), nn.Linear(8, 3)),
    )
    model.train()
    model[1].eval()
    model[4].eval()
    model[4][1].train()
    return model


def modes(model: nn.Module) -> dict[str, bool]:
    return {name: module.training for name, module in model.named_modules()}


def test_training_mode_restores_every_flag_also_after_an_exception():
    model = mixed_model()
    before = modes(model)
    assert len(set(before.values())) == 2  # really mixed
    with training_mode(model, False):
        assert not any(modes(model).values())
    assert modes(model) == before
    with pytest.raises(RuntimeError, match="boom"), training_mode(model, True):
        assert all(modes(model).values())
        raise RuntimeError("boom")
    assert modes(model) == before


def test_forward_capture_runs_in_the_requested_mode_without_gradients_and_removes_hooks():
    model = mixed_model()
    before = modes(model)
    seen: list[tuple[bool, bool]] = []

    def hook(module, _inputs, output):
        seen.append((module.training, output.requires_grad))

    x = torch.randn(5, 1, 4, 4)
    for training in (False, True):
        with forward_capture(model, {"1": hook}, training=training) as forward:
            out = forward(x)
        assert out.shape == (5, 3) and seen[-1] == (training, False)
        assert modes(model) == before
    assert not model[1]._forward_hooks
    model(x)  # hooks gone: nothing more recorded
    assert len(seen) == 2


def test_forward_capture_restores_modes_and_hooks_when_the_forward_pass_fails():
    model = mixed_model()
    before = modes(model)

    def broken(_module, _inputs):
        raise RuntimeError("hook failed")

    with pytest.raises(RuntimeError, match="hook failed"):
        with forward_capture(model, {"4.0": broken}, kind="input", training=True) as forward:
            forward(torch.randn(2, 1, 4, 4))
    assert modes(model) == before
    assert not model[4][0]._forward_pre_hooks


def test_stop_forward_ends_the_pass_and_returns_none():
    model = mixed_model()
    calls = []

    def stop(_module, inputs, _output):
        calls.append(inputs[0].shape[0])
        raise StopForward

    with forward_capture(model, {"0": stop}) as forward:
        assert forward(torch.randn(3, 1, 4, 4)) is None
    assert calls == [3]


def test_forward_capture_refuses_unknown_modules_and_kinds():
    model = mixed_model()
    with pytest.raises(ValueError, match="'nope' not found"):
        with forward_capture(model, {"nope": print}):
            pass
    with pytest.raises(ValueError, match="kind must be 'output' or 'input', got 'both'"):
        with forward_capture(model, {}, kind="both"):
            pass
    assert modes(model) == modes(mixed_model())


def test_the_measurements_leave_a_mixed_mode_model_as_it_was():
    model = mixed_model()
    before = modes(model)
    buffers = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(6, 1, 4, 4)
    capture(model, ["0", "4.2"], x)
    unit_statistics(model, x, ["0", "4.0"])
    bn_statistics(model, x)
    assert modes(model) == before
    assert all(torch.equal(buffers[k], v) for k, v in model.state_dict().items())


def test_activation_matching_restores_mixed_modes():
    torch.manual_seed(1)

    def mlp() -> nn.Module:
        from fedlmc.models.classifiers import build_model

        return build_model("mlp", width=1.0, in_shape=(1, 4, 4), depth=2, base_hidden=8)

    a, b = mlp(), mlp()
    for model in (a, b):
        model.train()
        next(iter(model.children())).eval()
    before_a, before_b = modes(a), modes(b)
    activation_matching(a, b, torch.randn(16, 1, 4, 4))
    assert modes(a) == before_a and modes(b) == before_b


def test_linear_layers_is_one_function_reachable_from_diagnostics():
    from fedlmc.analysis import diagnostics
    from fedlmc.merging import repair

    assert diagnostics.linear_layers is linear_layers is repair.linear_layers
    assert list(linear_layers(mixed_model())) == ["0", "4.0", "4.2"]
