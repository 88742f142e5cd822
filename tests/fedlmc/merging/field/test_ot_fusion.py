"""OT fusion (fedlmc.merging.field.ot_fusion, on POT): the exact transport of a permuted copy is the
permutation and fusing a model with its permuted copy computes the model; Sinkhorn's maps are
soft (rows summing to 1, softness > 0); three clients fuse onto client 0; a model that is no
norm-free chain is refused."""

from __future__ import annotations

import pytest
import torch

from fedlmc.averaging import average, load_state
from fedlmc.merging.field.ot_fusion import ot_fusion, transport_map
from fedlmc.models.classifiers import build_model
from fedlmc.permutation.model_spec import permutation_spec
from fedlmc.permutation.spec import apply_permutation, random_permutations


def _mlp(seed: int = 0, norm: str = "none") -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", in_shape=(1, 4, 4), depth=2, base_hidden=8, norm=norm).eval()


def test_the_exact_map_of_a_permuted_copy_is_the_permutation():
    rows = torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    perm = torch.tensor([4, 0, 5, 1, 3, 2])
    mapping = transport_map(rows[perm], rows)  # source unit a is target unit perm[a]
    expected = torch.zeros(6, 6, dtype=torch.float64)
    expected[perm, torch.arange(6)] = 1.0
    torch.testing.assert_close(mapping, expected)


def test_fusing_a_model_with_its_permuted_copy_computes_the_model():
    model = _mlp()
    spec = permutation_spec(model)
    state = model.state_dict()
    copy = apply_permutation(spec, random_permutations(spec, state, seed=3), state)
    aligned, softness = ot_fusion(spec, [state, copy])
    assert softness == 0.0
    for key in state:
        torch.testing.assert_close(aligned[1][key], state[key], rtol=0, atol=1e-6)
    x = torch.randn(16, 1, 4, 4)
    fused = load_state(model, average(aligned, [1, 1])).eval()
    torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-5)


def test_sinkhorn_maps_are_soft_and_stochastic():
    a, b = _mlp(0), _mlp(1)
    spec = permutation_spec(a)
    aligned, softness = ot_fusion(
        spec, [a.state_dict(), b.state_dict(), _mlp(2).state_dict()], reg=0.5
    )
    assert 0 < softness < 1 and len(aligned) == 3
    rows = torch.randn(5, 3, dtype=torch.float64)
    mapping = transport_map(rows, rows.flip(0), reg=0.5)
    torch.testing.assert_close(
        mapping.sum(dim=1), torch.ones(5, dtype=torch.float64), rtol=1e-6, atol=1e-6
    )
    assert float(mapping.max()) < 1.0
    with pytest.raises(ValueError, match="ot reg = -1"):
        transport_map(rows, rows, reg=-1)


def test_a_model_with_norm_layers_is_refused():
    model = _mlp(norm="ln")
    with pytest.raises(ValueError, match="ot_fusion: the model is not supported.*hidden.0.norm"):
        ot_fusion(permutation_spec(model), [model.state_dict(), _mlp(1, "ln").state_dict()])
