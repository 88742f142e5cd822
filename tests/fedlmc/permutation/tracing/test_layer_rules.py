"""fedlmc.permutation.tracing.layer_rules: the layers and norms: a grouped convolution ends
its groups, a depthwise one and a BatchNorm carry them; functional layers produce units like
their modules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlmc.permutation.tracing import SpecDerivationWarning, derive_spec
from tests.fedlmc.permutation.tracing.test_derive import (
    assert_symmetry,
    derive_quietly,
    partition,
    randomize_norms,
)


class Grouped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.pw = nn.Conv2d(8, 6, 1)
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.bn, self.act = nn.BatchNorm2d(6), nn.ReLU()
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.pw(F.relu(self.grouped(F.relu(self.c1(x)))))
        return self.head(self.act(self.bn(self.dw(h))).mean((2, 3)))


def test_grouped_conv_ends_groups_and_depthwise_conv_carries_them():
    torch.manual_seed(0)
    model, x = randomize_norms(Grouped()), torch.randn(2, 3, 6, 6)
    with pytest.warns(SpecDerivationWarning, match="grouped convolution .groups=2") as record:
        spec = derive_spec(model, x)
    assert {str(w.message).split(" are ")[0] for w in record} == {
        "derive_spec: the units of c1",
        "derive_spec: the units of grouped",
    }
    assert list(spec.perm_to_axes) == ["pw"]
    assert set(spec.perm_to_axes["pw"]) == {
        ("pw.weight", 0),
        ("pw.bias", 0),
        ("dw.weight", 0),
        ("dw.bias", 0),
        ("bn.weight", 0),
        ("bn.bias", 0),
        ("bn.running_mean", 0),
        ("bn.running_var", 0),
        ("head.weight", 1),
    }
    assert spec.activation_modules == {"pw": "act"}
    assert_symmetry(model, spec, x)


class Functional(nn.Module):
    """``F.linear`` with the module's own parameters, then a LayerNorm and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(6, 4)), nn.Parameter(torch.randn(6))
        self.norm, self.head = nn.LayerNorm(6), nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.norm(F.linear(x, self.weight, self.bias))))


def test_a_functional_linear_produces_units_that_a_layer_norm_carries():
    torch.manual_seed(0)
    model, x = randomize_norms(Functional()), torch.randn(3, 4)
    spec = derive_quietly(model, x)
    assert set(partition(spec)) == {
        frozenset(
            {("weight", 0), ("bias", 0), ("norm.weight", 0), ("norm.bias", 0), ("head.weight", 1)}
        )
    }
    assert_symmetry(model, spec, x)
