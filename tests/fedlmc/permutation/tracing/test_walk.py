"""fedlmc.permutation.tracing.walk: the graph walk's inputs, shared modules and unknown
operations: attention ends the groups it reads, a module called twice ties its input and output
units, a tuple example input and functional activations are followed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlmc.permutation.tracing import SpecDerivationWarning, derive_layer_names, derive_spec
from tests.fedlmc.permutation.tracing.test_derive import (
    assert_symmetry,
    derive_quietly,
    partition,
)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.inp_act = nn.Linear(6, 8), nn.ReLU()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.out, self.out_act = nn.Linear(8, 8), nn.ReLU()
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.inp_act(self.inp(x))
        a = self.attn(h, h, h)[0]
        return self.head(self.out_act(self.out(a))).mean(dim=1)


def test_attention_ends_the_groups_it_reads():
    torch.manual_seed(0)
    model, x = Attention().eval(), torch.randn(2, 5, 6)
    with pytest.warns(SpecDerivationWarning, match="units of inp.*'attn' .MultiheadAttention"):
        spec = derive_spec(model, x)
    assert spec.perm_to_axes == {"out": [("out.weight", 0), ("out.bias", 0), ("head.weight", 1)]}
    assert not any(key.startswith("attn.") for key in spec.axes_to_perm)
    assert spec.activation_modules == {}  # the units are on the last axis of (N, T, D)


class SharedLayer(nn.Module):
    """One Linear applied twice: its input and output axes fall into one group."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.mid, self.out = nn.Linear(5, 7), nn.Linear(7, 7), nn.Linear(7, 2)
        self.r1, self.r2, self.r3 = nn.ReLU(), nn.ReLU(), nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.r3(self.mid(self.r2(self.mid(self.r1(self.inp(x)))))))


def test_a_module_called_twice_ties_its_input_and_output_units():
    torch.manual_seed(0)
    model, x = SharedLayer(), torch.randn(3, 5)
    spec = derive_quietly(model, x)
    assert list(spec.perm_to_axes) == ["inp"]
    assert spec.axes_to_perm["mid.weight"] == ("inp", "inp")
    assert_symmetry(model, spec, x)
    assert derive_layer_names(model, x) == ["r1", "r2", "r3", "out"]


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(3, 5), nn.Linear(4, 5), nn.Linear(5, 2)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.head(F.relu(self.a(x) + self.b(y)))


def test_tuple_example_input_and_functional_activation():
    torch.manual_seed(0)
    model, args = TwoInputs(), (torch.randn(3, 3), torch.randn(3, 4))
    spec = derive_quietly(model, args)
    assert set(partition(spec)) == {
        frozenset(
            {("a.weight", 0), ("a.bias", 0), ("b.weight", 0), ("b.bias", 0), ("head.weight", 1)}
        )
    }
    # The sum's units sit on dim 1 of a's and b's outputs; F.relu is no module.
    assert spec.activation_modules == {"a": "b"}
    with pytest.warns(SpecDerivationWarning, match="node 'relu' is not the output of a module"):
        assert derive_layer_names(model, args) == ["head"]
