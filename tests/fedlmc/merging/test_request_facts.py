"""Tests of fedlmc.merging.request_facts: what a merge request says about the model (its name,
whether it is a norm-free plain chain, a layer without a bias) and the clients (their widths)."""

from __future__ import annotations

import torch

from fedlmc.merging.request_facts import model_facts, plain_chain_reason, width_difference
from fedlmc.models.classifiers import build_model


def mlp(seed: int, **options) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", width=0.125, depth=2, in_shape=(1, 4, 4), **options)


def test_the_facts_of_a_model_and_of_the_states():
    facts = model_facts(mlp(0, norm="bn"), None, ["average_lewc_bias", "average_repair"])
    assert facts["model"] == "MLP" and "norm" in facts["chain_reason"]
    assert facts["bias_free"] == ""  # with BatchNorm REPAIR resets the statistics
    assert model_facts(mlp(0), None, ["average"]) == {"model": "MLP"}  # nothing else asked
    assert model_facts(mlp(0, bias=False), None, ["average_repair"])["bias_free"].startswith(
        "layer 'hidden.0"
    )
    narrow, wide = mlp(0).state_dict(), build_model("mlp", width=0.25, depth=2).state_dict()
    assert width_difference([narrow, narrow]) == ""
    assert "in client 0 and" in width_difference([narrow, wide])


def test_a_plain_chain_has_no_reason_and_a_residual_model_has_one():
    assert plain_chain_reason(mlp(0, norm="none"), None) == ""
    resnet = build_model("resnet20", width=0.25, in_shape=(3, 8, 8), norm="none")
    assert plain_chain_reason(resnet, None) != ""
