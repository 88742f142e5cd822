"""fedlmc.permutation.model_spec: a built-in model keeps its own spec, any other model gets one
derived from an example input (or its registry ``config``), and the derived LEWC layer names."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedlmc.models.classifiers import build_model
from fedlmc.permutation.model_spec import derive_layer_names, derive_spec, permutation_spec


def test_permutation_spec_keeps_built_in_specs_and_derives_for_others():
    model = build_model("mlp", width=0.25, base_hidden=16, in_shape=(1, 4, 4))
    assert permutation_spec(model) == model.permutation_spec()
    assert permutation_spec(model, torch.randn(2, 1, 4, 4)) == model.permutation_spec()

    plain = nn.Sequential(nn.Flatten(), nn.Linear(16, 5), nn.ReLU(), nn.Linear(5, 3))
    with pytest.raises(ValueError, match="Sequential.*example_input"):
        permutation_spec(plain)
    spec = permutation_spec(plain, torch.randn(2, 1, 4, 4))
    assert spec.perm_to_axes == {"1": [("1.weight", 0), ("1.bias", 0), ("3.weight", 1)]}
    assert spec.activation_modules == {"1": "2"}

    plain.config = {"in_shape": (1, 4, 4)}  # a registry-built model without a spec method
    assert permutation_spec(plain) == spec


def test_a_derived_spec_of_a_plain_chain_lists_its_layers_and_is_a_symmetry():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Flatten(), nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2)
    )
    x = torch.randn(3, 2, 4)
    spec = derive_spec(net, x)  # checked on x: a wrong spec raises
    assert sorted(spec.perm_to_axes) == ["1", "3"]
    assert spec.activation_modules == {"1": "2", "3": "4"}
    # LEWC's layer outputs: each hidden layer after its activation, then the logits
    assert derive_layer_names(net, x) == ["2", "4", "5"]
