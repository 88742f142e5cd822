"""Preserve-First Merging (fedlmc.merging.baselines.preserve_first): with no preserved layer it is
the merge, with every layer but the output one preserved it is the logit ensemble, in between
neither; its parameter count grows by N - 1 copies of the preserved layers; bad k and models
are refused."""

from __future__ import annotations

import pytest
import torch

from fedlmc.averaging import average, load_state
from fedlmc.merging.baselines.preserve_first import PFM_LAYERS, preserve_first
from fedlmc.models.classifiers import build_model

SMALL = (1, 6, 6)
WEIGHTS = [0.2, 0.3, 0.5]


def _clients() -> list[torch.nn.Module]:
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        models.append(build_model("mlp", in_shape=SMALL, depth=3, base_hidden=8).eval())
    return models


def _x() -> torch.Tensor:
    return torch.randn(50, *SMALL, generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def test_no_preserved_layer_is_the_merge_and_all_but_the_head_is_the_logit_ensemble():
    clients, x = _clients(), _x()
    states = [m.state_dict() for m in clients]
    merge = load_state(clients[0], average(states, WEIGHTS))(x)
    ensemble = sum(w * m(x) for w, m in zip(WEIGHTS, clients, strict=True))
    torch.testing.assert_close(preserve_first(clients[0], states, WEIGHTS, 0)(x), merge)
    torch.testing.assert_close(preserve_first(clients[0], states, WEIGHTS, 3)(x), ensemble)
    middle = preserve_first(clients[0], states, WEIGHTS, PFM_LAYERS)(x)
    assert float((middle - merge).abs().max()) > 1e-4
    assert float((middle - ensemble).abs().max()) > 1e-4


def test_the_parameter_count_adds_n_minus_1_copies_of_the_unmerged_layers():
    clients = _clients()
    states = [m.state_dict() for m in clients]
    single = sum(p.numel() for p in clients[0].parameters())
    first, second = 36 * 8 + 8, 8 * 8 + 8  # hidden.0 and hidden.1 (weights and biases)
    assert preserve_first(clients[0], states, None, 0).parameter_count == single
    counted = preserve_first(clients[0], states, None, 1).parameter_count
    assert counted == single + 2 * (first + second)


def test_bad_layer_counts_and_models_are_refused():
    clients = _clients()
    states = [m.state_dict() for m in clients]
    with pytest.raises(ValueError, match="layers = 4; allowed: 0 to 3"):
        preserve_first(clients[0], states, None, 4)
    torch.manual_seed(0)
    resnet = build_model("resnet20", in_shape=(3, 8, 8), width=0.125, norm="none")
    with pytest.raises(ValueError, match="model 'ResNet20' is not supported"):
        preserve_first(resnet, [resnet.state_dict()] * 2, None, 1)
