"""fedlmc.permutation.tracing.shape_rules: reshapes, concatenation and token axes: a flatten
of a feature map or a concatenation along the units ends the group, a concatenation along the
tokens joins the feature axes, and reshape runs match axes of equal product."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from fedlmc.permutation.tracing import SpecDerivationWarning, derive_layer_names, derive_spec
from fedlmc.permutation.tracing.shape_rules import _reshape_runs
from tests.fedlmc.permutation.tracing.test_derive import (
    SmallCNN,
    assert_symmetry,
    derive_quietly,
    randomize_norms,
)


def test_flatten_of_a_feature_map_ends_the_group_of_the_last_conv():
    torch.manual_seed(0)
    model, x = randomize_norms(SmallCNN(pool=False)), torch.randn(2, 3, 8, 8)
    with pytest.warns(SpecDerivationWarning, match="features.4.*reshapes .*7, 4, 4"):
        spec = derive_spec(model, x)
    assert set(spec.perm_to_axes) == {"features.0", "head.1"}
    assert spec.axes_to_perm["features.4.weight"] == (None, "features.0", None, None)
    assert "features.4.bias" not in spec.axes_to_perm
    assert spec.axes_to_perm["head.1.weight"] == ("head.1", None)
    assert_symmetry(model, spec, x)


class TwoBranch(nn.Module):
    """Two conv branches concatenated along the channels, then a 1x1 conv and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.stem_act = nn.Conv2d(3, 6, 3, padding=1), nn.ReLU()
        self.a, self.a_act = nn.Conv2d(6, 4, 1), nn.ReLU()
        self.b, self.b_act = nn.Conv2d(6, 5, 3, padding=1), nn.ReLU()
        self.mix, self.mix_act = nn.Conv2d(9, 8, 1), nn.ReLU()
        self.pool, self.head = nn.AdaptiveAvgPool2d(1), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        s = self.stem_act(self.stem(x))
        y = torch.cat([self.a_act(self.a(s)), self.b_act(self.b(s))], dim=1)
        return self.head(torch.flatten(self.pool(self.mix_act(self.mix(y))), 1))


def test_concatenated_groups_are_dropped_with_a_warning():
    torch.manual_seed(0)
    model, x = TwoBranch().eval(), torch.randn(2, 3, 6, 6)
    with pytest.warns(SpecDerivationWarning, match="concatenates along axis 1") as record:
        spec = derive_spec(model, x)
    dropped = " ".join(str(w.message) for w in record)
    assert "units of a" in dropped and "units of b" in dropped
    assert set(spec.perm_to_axes) == {"stem", "mix"}
    assert set(spec.perm_to_axes["stem"]) == {
        ("stem.weight", 0),
        ("stem.bias", 0),
        ("a.weight", 1),
        ("b.weight", 1),
    }
    assert spec.axes_to_perm["mix.weight"] == ("mix", None, None, None)
    assert_symmetry(model, spec, x)


class ClassToken(nn.Module):
    """A learned token expanded over the batch and concatenated along the token axis."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.act, self.head = nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)
        self.token = nn.Parameter(torch.randn(1, 1, 6))

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)
        h = torch.cat([self.token.expand(h.shape[0], -1, -1), h], dim=1)
        return self.head(self.act(h)[:, 0])


def test_concatenation_along_tokens_joins_the_feature_axes():
    torch.manual_seed(0)
    model, x = ClassToken(), torch.randn(2, 5, 4)
    spec = derive_quietly(model, x)
    assert spec.perm_to_axes == {
        "embed": [("embed.weight", 0), ("embed.bias", 0), ("token", 2), ("head.weight", 1)]
    }
    assert spec.activation_modules == {}  # features are on the last axis of (N, T, D)
    assert derive_layer_names(model, x) == ["act", "head"]  # h[:, 0] is skipped like a pool


def test_reshape_runs_match_axes_of_equal_product():
    runs = _reshape_runs
    assert runs((2, 8, 1, 1), (2, 8)) == [([0], [0]), ([1], [1])]
    assert runs((2, 8, 3, 3), (2, 72)) == [([0], [0]), ([1, 2, 3], [1])]
    assert runs((1, 8, 1, 1), (8,)) == [([1], [0])]
    assert runs((2, 6), (2, 4)) is None
