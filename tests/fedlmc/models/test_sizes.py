"""``fedlmc.models.sizes`` and the ``parameters`` declaration of the model registry: every
registered model that declares its parameter count declares it exactly (the count of the model
its builder makes, for several widths, norms, biases, input shapes and options), and a model
that declares none is counted on torch's meta device only when asked to build."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedlmc.models.classifiers import build_model
from fedlmc.models.registry import MODELS, parameter_count, register_model
from fedlmc.models.sizes import resnet20_parameters, scaled

WIDTHS = (0.1, 0.5, 1.0, 1.7)
SHAPES = ((1, 28, 28), (3, 32, 32))


def real_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def option_cases(name: str) -> list[dict]:
    """Each boolean option flipped, and the MLP's depth and base width or the ViT's depth,
    heads, head dim and MLP ratio changed (the ViT with 4-pixel patches: both shapes)."""
    options = MODELS.get(name).options
    base = {"patch": 4} if "patch" in options else {}
    cases = [base]
    cases += [{**base, k: not o.default} for k, o in options.items() if isinstance(o.default, bool)]
    if "base_hidden" in options:
        cases.append({"depth": 1, "base_hidden": 37})
    if "heads" in options:
        cases.append({**base, "depth": 1, "heads": 3, "head_dim": 5, "mlp_ratio": 3})
    return cases


@pytest.mark.parametrize("name", [e.name for e in MODELS if e.parameters is not None])
def test_a_declared_parameter_count_is_the_built_models(name):
    for width in WIDTHS:
        for norm in MODELS.get(name).norms:
            for shape in SHAPES:
                for options in option_cases(name):
                    with torch.device("meta"):  # shapes only: no memory, no initialisation
                        model = build_model(name, width, 7, shape, norm, **options)
                    declared = parameter_count(name, width, 7, shape, norm, **options)
                    assert declared == real_count(model), (name, width, norm, shape, options)


def test_every_built_in_model_declares_its_count():
    builtin = ("mlp", "vgg11", "resnet20", "vit")
    assert all(MODELS.get(name).parameters is not None for name in builtin)


def test_resnet20_count_by_hand():
    """Width 1, no norm, no bias, 3 input channels, 10 classes: stem 3*16*9; stage 1: six 3x3
    convs of 16x16; stages 2 and 3: a first conv (16->32 / 32->64), five square convs and a
    1x1 projection; the head 64*10."""
    expected = 9 * 3 * 16 + 6 * 9 * 16 * 16
    expected += 9 * 16 * 32 + 5 * 9 * 32 * 32 + 16 * 32
    expected += 9 * 32 * 64 + 5 * 9 * 64 * 64 + 32 * 64
    expected += 64 * 10
    assert resnet20_parameters(1.0, 10, (3, 32, 32), "none", bias=False) == expected
    assert scaled(16, 0.01) == 1 and scaled(16, 1.5) == 24


class Tiny(nn.Module):
    def __init__(self, width, num_classes, in_shape, norm):
        super().__init__()
        self.flatten = nn.Flatten()
        self.head = nn.Linear(in_shape[0] * in_shape[1] * in_shape[2], num_classes)

    def forward(self, x):
        return self.head(self.flatten(x))


def test_an_undeclared_count_is_built_on_the_meta_device_only_when_asked():
    register_model("tiny_undeclared", Tiny)
    try:
        assert parameter_count("tiny_undeclared", 1.0, 10, (1, 4, 4)) is None
        assert parameter_count("tiny_undeclared", 1.0, 10, (1, 4, 4), build=True) == 16 * 10 + 10
    finally:
        MODELS.remove("tiny_undeclared")


def test_a_bad_parameters_declaration_is_refused():
    with pytest.raises(ValueError, match="parameters = 3; allowed: a callable"):
        register_model("bad_count", Tiny, parameters=3)
    assert "bad_count" not in MODELS


def test_a_huge_depth_is_counted_without_a_list_of_its_layers():
    """Issue 52: ``depth = 2**62`` made the MLP's count build a list of ``depth`` fan-ins (a
    MemoryError); the count is a product: ``first + (depth - 1) x block + head``."""
    depth = 2**62
    count = parameter_count("mlp", 1.0, 10, (1, 28, 28), "none", depth=3)
    assert count == 784 * 128 + 128 + 2 * (128 * 128 + 128) + 128 * 10 + 10
    from fedlmc.models.sizes import mlp_parameters

    huge = mlp_parameters(1.0, 10, (1, 28, 28), "bn", depth=depth, base_hidden=128, bias=True)
    block = 128 * 128 + 128 + 2 * 128
    assert huge == (784 * 128 + 128 + 2 * 128) + (depth - 1) * block + 128 * 10 + 10


def test_an_option_beyond_its_registered_maximum_is_refused_naming_the_range():
    """The registry's bounds (``ModelOption.maximum``) hold for every builder call, not only
    for the run config's key: ``depth`` at most 1000, ``base_hidden`` at most 65536."""
    with pytest.raises(ValueError, match=r"option depth = 1001: allowed: a number <= 1000 \("):
        parameter_count("mlp", 1.0, 10, (1, 28, 28), depth=1001)
    with pytest.raises(ValueError, match="option base_hidden = 65537: allowed: a number <= 65536"):
        parameter_count("mlp", 1.0, 10, (1, 28, 28), base_hidden=65537)
    assert parameter_count("vit", 1.0, 10, (1, 28, 28), depth=1000) > 0
