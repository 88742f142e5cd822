"""Weighted averaging and interpolation of state dicts."""

import copy

import pytest
import torch
from torch import nn

from fedlmc.averaging import average, interpolate, load_state
from fedlmc.evaluation import predict_logits
from fedlmc.models.classifiers import build_model


def _bn_state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = build_model("resnet20", width=0.125, in_shape=(1, 28, 28))
    sd = model.state_dict()
    for key, value in sd.items():
        if key.endswith("num_batches_tracked"):
            value.fill_(seed * 10)
    return sd


def test_average_is_weighted_mean_in_float64_and_max_for_integer_buffers():
    sds = [_bn_state(s) for s in (1, 2, 3)]
    merged = average(sds, weights=[100, 300, 0])
    for key, value in merged.items():
        assert value.dtype == sds[0][key].dtype and value.shape == sds[0][key].shape
        if key.endswith("num_batches_tracked"):
            assert int(value) == 30
        else:
            expected = (0.25 * sds[0][key].double() + 0.75 * sds[1][key].double()).float()
            assert torch.equal(value, expected), key


def test_average_of_one_model_is_that_model_and_inputs_are_not_mutated():
    sd = _bn_state(4)
    before = {k: v.clone() for k, v in sd.items()}
    merged = average([sd, sd], weights=[1, 3])
    for key in sd:
        assert torch.equal(merged[key], before[key])
        assert torch.equal(sd[key], before[key])


def test_average_uniform_default_equals_explicit_equal_weights():
    sds = [_bn_state(s) for s in (5, 6)]
    a, b = average(sds), average(sds, weights=[7, 7])
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("weights", [[1, -1], [0, 0], [1, float("nan")], [1]])
def test_average_rejects_bad_weights(weights):
    sds = [_bn_state(1), _bn_state(2)]
    with pytest.raises(ValueError, match="weights"):
        average(sds, weights=weights)


def test_average_names_mismatched_key_and_shape():
    a = build_model("mlp", width=0.125).state_dict()
    b = build_model("mlp", width=0.25).state_dict()
    with pytest.raises(ValueError, match="hidden.0.linear.weight"):
        average([a, b])
    c = dict(a)
    c["extra"] = torch.zeros(1)
    with pytest.raises(ValueError, match="extra"):
        average([a, c])
    with pytest.raises(ValueError):
        average([])


def test_interpolate_endpoints_are_exact_and_midpoint_is_the_average():
    a, b = _bn_state(1), _bn_state(2)
    at1, at0, half = interpolate(a, b, 1.0), interpolate(a, b, 0.0), interpolate(a, b, 0.5)
    mean = average([a, b])
    for key in a:
        if a[key].is_floating_point():
            assert torch.equal(at1[key], a[key]) and torch.equal(at0[key], b[key])
            assert torch.equal(half[key], mean[key])
    with pytest.raises(ValueError, match="lam"):
        interpolate(a, b, float("inf"))


def test_load_state_copies_template_and_computes_the_loaded_function():
    torch.manual_seed(0)
    template = build_model("mlp", width=0.125)
    other = build_model("mlp", width=0.125)
    before = {k: v.clone() for k, v in template.state_dict().items()}
    loaded = load_state(template, other.state_dict())
    x = torch.randn(8, 1, 28, 28)
    assert torch.equal(predict_logits(loaded, x), predict_logits(other, x))
    assert all(torch.equal(template.state_dict()[k], v) for k, v in before.items())
    with pytest.raises(RuntimeError):
        load_state(template, {})


def test_average_refuses_complex_tensors_instead_of_dropping_the_imaginary_part():
    a = {"w": torch.tensor([1 + 2j, 3 - 1j])}
    b = {"w": torch.tensor([1 - 2j, 1 + 1j])}
    with pytest.raises(ValueError, match="key 'w' is a complex tensor"):
        average([a, b])
    with pytest.raises(ValueError, match="complex"):
        interpolate(a, b, 0.5)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits (a signed zero differs from the other zero)."""
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_interpolate_and_average_give_the_bits_of_the_float64_formula(dtype):
    """Computed in place, ``interpolate`` and ``average`` round as ``lam * a.double() +
    (1 - lam) * b.double()`` and ``sum(w_i * t_i.double())`` do, signed zeros included, and
    leave their inputs as they were."""
    g = torch.Generator().manual_seed(0)
    ends = []
    for _ in range(2):
        w = torch.randn(300, generator=g)
        w[:4] = torch.tensor([-0.0, 0.0, -0.0, 1.0])
        ends.append({"w": w.to(dtype), "n": torch.tensor(len(ends) + 3)})
    saved = [{k: v.clone() for k, v in sd.items()} for sd in ends]
    for lam in (0.0, 0.1, 0.25, 0.5, 0.9, 1.0, 1.4):
        expected = (lam * ends[0]["w"].double() + (1.0 - lam) * ends[1]["w"].double()).to(dtype)
        found = interpolate(ends[0], ends[1], lam)
        assert torch.equal(_bits(found["w"]), _bits(expected)) and int(found["n"]) == 4
        weights = [lam, 1.0] if lam > 0 else [0.0, 1.0]
        total = sum(weights)
        mean = sum((w / total) * sd["w"].double() for w, sd in zip(weights, ends, strict=True))
        assert torch.equal(_bits(average(ends, weights)["w"]), _bits(mean.to(dtype)))
    for sd, before in zip(ends, saved, strict=True):
        assert torch.equal(_bits(sd["w"]), _bits(before["w"]))


class _WithNonPersistentBuffer(nn.Module):
    """A frozen parameter, a BatchNorm (persistent buffers) and a non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 4)
        self.linear.bias.requires_grad_(False)
        self.norm = nn.BatchNorm1d(4)
        self.register_buffer("scale", torch.tensor([2.0, 3.0, 4.0, 5.0]), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x)) * self.scale


def test_load_state_is_the_template_with_the_state_loaded_and_the_template_unchanged():
    torch.manual_seed(0)
    template = _WithNonPersistentBuffer()
    before = {k: v.clone() for k, v in template.state_dict().items()}
    state = {k: v + 1 if v.is_floating_point() else v + 7 for k, v in before.items()}
    model = load_state(template, state)
    assert all(torch.equal(model.state_dict()[k], state[k]) for k in state)
    assert all(torch.equal(template.state_dict()[k], before[k]) for k in before)
    assert torch.equal(model.scale, template.scale) and model.scale is not template.scale
    assert [p.requires_grad for p in model.parameters()] == [True, False, True, True]
    assert all(isinstance(p, nn.Parameter) for p in model.parameters())
    assert all(a is not b for a, b in zip(model.parameters(), template.parameters(), strict=True))
    x = torch.randn(5, 3)
    reference = copy.deepcopy(template)
    reference.load_state_dict(state)
    assert torch.equal(model.eval()(x), reference.eval()(x))


class _Unusual(nn.Module):
    """What a plain deep copy handles: extra state (a dict), a Parameter subclass, a buffer
    that requires grad and a lazy layer not yet run."""

    class Tagged(nn.Parameter):
        pass

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.linear.weight = self.Tagged(self.linear.weight.detach().clone())
        self.register_buffer("offset", torch.ones(2, requires_grad=True))
        self.lazy = nn.LazyLinear(3)
        self.tag = {"kind": "unusual"}

    def get_extra_state(self) -> dict:
        return dict(self.tag)

    def set_extra_state(self, state: dict) -> None:
        self.tag = dict(state)


def test_load_state_keeps_what_a_deep_copy_keeps():
    template = _Unusual()
    state = template.state_dict()
    state["linear.bias"] = state["linear.bias"] + 1
    model = load_state(template, state)
    assert type(model.linear.weight) is _Unusual.Tagged
    assert model.offset.requires_grad and model.tag == {"kind": "unusual"}
    assert type(model.lazy.weight) is type(template.lazy.weight)  # still uninitialised
    assert torch.equal(model.linear.bias, state["linear.bias"])
    assert torch.equal(model.linear.weight, template.linear.weight)
