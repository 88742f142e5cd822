"""The secure client's pre-scale (simulations/private/secure_client.py, ``scaled_for_merge``):
what a client sends for the merge the server names (``heterofl``: its held values and holder
masks, ``sent_for_merge``), in process on a tiny MLP with biases (the
SecAgg+ round itself runs in tests/strategies/test_secure.py)."""

from __future__ import annotations

import pytest
import torch

from fedlmc.models.classifiers import build_model
from fedlmc.simulations.private.secure_client import scaled_for_merge, sent_for_merge
from fedlmc.strategies.secure import CLIPPING_KEY, MAX_WEIGHT_KEY, MERGE_KEY, SecureSettings


def _config(method: str) -> dict:
    return {CLIPPING_KEY: 8.0, MAX_WEIGHT_KEY: 3000.0, MERGE_KEY: method}


def test_lewc_bias_merge_scales_the_layer_l_bias_by_the_share_to_the_l_minus_1():
    model = build_model("mlp", width=0.125, bias=True)
    state = model.state_dict()
    sent = scaled_for_merge(state, model, _config("average_lewc_bias"), 1200)
    share = SecureSettings(8.0, 3000.0).share(1200)
    assert share == pytest.approx(0.4)
    biases = [k for k in state if k.endswith(".bias")]
    for depth, key in enumerate(biases, start=1):
        torch.testing.assert_close(sent[key], state[key] * share ** (depth - 1))
    for key in state:
        if key.endswith(".weight"):
            assert torch.equal(sent[key], state[key])


def test_the_plain_average_sends_the_weights_as_trained_and_other_rules_are_refused():
    model = build_model("mlp", width=0.125, bias=True)
    state = model.state_dict()
    assert scaled_for_merge(state, model, _config("average"), 1200) is state
    with pytest.raises(ValueError, match="'weight_matching' does not run under secure"):
        scaled_for_merge(state, model, _config("weight_matching"), 1200)


def test_a_narrower_client_of_embed_average_sends_its_model_embedded_in_the_server_shapes():
    server = build_model("mlp", width=0.25, bias=True)
    narrow = build_model("mlp", width=0.125, bias=True).state_dict()
    sent = scaled_for_merge(narrow, server, _config("embed_average"), 1200)
    for key, value in server.state_dict().items():
        assert sent[key].shape == value.shape
    torch.testing.assert_close(
        sent["hidden.1.linear.weight"][:16, :16], narrow["hidden.1.linear.weight"]
    )
    assert float(sent["hidden.1.linear.weight"][16:].abs().max()) == 0.0


def test_a_heterofl_client_sends_its_held_values_then_its_holder_masks_times_the_range():
    server = build_model("mlp", width=0.25, bias=True)
    narrow = build_model("mlp", width=0.125, bias=True).state_dict()
    values, masks = sent_for_merge(narrow, server, _config("heterofl"), 1200)
    assert list(values) == list(masks) == list(server.state_dict())  # same order: one array each
    key = "hidden.1.linear.weight"
    torch.testing.assert_close(values[key][:16, :16], narrow[key])
    assert float(values[key][16:].abs().max()) == 0.0
    assert float(masks[key][:16, :16].min()) == 8.0 and float(masks[key][16:].max()) == 0.0
    (average,) = sent_for_merge(narrow, server, _config("embed_average"), 1200)
    torch.testing.assert_close(average[key], values[key])


def test_a_vit_takes_the_secure_plain_average_path():
    """A ViT cell validates under SecAgg+, its weights lie in the server's clipping range, each
    client sends them as trained, and SecAgg+'s arithmetic gives the clear average within the
    bound (the real round: tests/strategies/test_secure.py, on an MLP)."""
    from fedlmc.averaging import average
    from fedlmc.simulations.config import ConfigError, validate_run_config
    from fedlmc.strategies.secure import (
        check_in_range,
        from_secure_arrays,
        secure_arrays,
        secure_settings,
    )
    from tests.strategies.test_secure import _secagg_arithmetic

    cell = {"model": "vit", "width": 0.5, "depth": 1, "num-clients": 2, "init": "shared"}
    validate_run_config({**cell, "strategy": "average", "secure-aggregation": "secagg+"})
    with pytest.raises(ConfigError, match="'average_lewc_bias': model 'vit' is not .*: residual"):
        validate_run_config({**cell, "strategy": "aligned", "align": "average_lewc_bias"})
    model = build_model("vit", 0.5, depth=1)
    initial = model.state_dict()
    settings = secure_settings(initial, 3000)
    gen = torch.Generator().manual_seed(0)
    states = [  # two clients trained from the shared initialisation (a step each)
        {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in initial.items()}
        for _ in range(2)
    ]
    counts = [1800, 1200]
    sent = []
    for pid, (state, count) in enumerate(zip(states, counts, strict=True)):
        (part,) = sent_for_merge(state, model, _config("average"), count)
        assert part is state
        check_in_range(part, settings.clipping_range, f"client partition {pid}")
        sent.append(secure_arrays(part))
    merged = from_secure_arrays(initial, _secagg_arithmetic(sent, counts, settings))
    clear = average(states, counts)
    bound = settings.error_bound(counts)
    assert max(float((merged[k] - clear[k]).abs().max()) for k in clear) <= bound
