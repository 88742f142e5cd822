"""A merge method's preconditions live with its registry entry: :func:`refusal` answers, for a
:class:`MergeRequest`, with one line per precondition (naming the method, the bad value and what
is allowed) or ``None``; :func:`check_method` raises it; the run-config check, ``merge_states``,
the study and the strategies ask the same function and give the same line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedlmc.merging.method_registry import (
    _DECLARED,
    BUILTIN_MODULES,
    METHODS,
    MergeRequest,
    check_method,
    merge_method,
    refusal,
)
from fedlmc.merging.methods import merge_states
from fedlmc.models.classifiers import build_model
from fedlmc.simulations.config import ConfigError, merge_request, validate_run_config

FULL = {"server_data": True, "clients": True, "base": True, "chain_reason": "", "bias_free": ""}
"""A request meeting every precondition but the count of clients."""


def mlp(seed: int, **options) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", width=0.125, depth=2, in_shape=(1, 4, 4), **options)


@pytest.mark.parametrize(
    ("method", "fields", "line"),
    [
        (
            "average",
            {"widths": "client widths 0.5,2, server width 2"},
            "merge method 'average' needs clients of one width (client widths 0.5,2, server "
            "width 2); allowed for mixed widths: embed_average, embed_weight_matching",
        ),
        (
            "fisher",
            {"clients": False},
            "merge method 'fisher' runs on the clients; got none: allowed only in a federation",
        ),
        (
            "activation_matching",
            {"server_data": False},
            "merge method 'activation_matching' needs server data; got none: allowed: server data",
        ),
        (
            "random_direction_t",
            {"num_clients": 3},
            "merge method 'random_direction_t' with 3 clients: allowed: at most 2 clients",
        ),
        (
            "krum",
            {"num_clients": 4, "fewest_clients": 2},
            "merge method 'krum' with as few as 2 clients: allowed: at least 3 clients",
        ),
        (
            "ties",
            {"base": False},
            "merge method 'ties' needs the clients' common base model; got none: its task "
            "vectors are relative to it",
        ),
        (
            "average_lewc_bias",
            {"model": "resnet20", "chain_reason": "residual"},
            "merge method 'average_lewc_bias': model 'resnet20' is not supported: residual; "
            "allowed: norm-free plain feed-forward chains",
        ),
        (
            "average_repair",
            {"bias_free": "layer 'hidden.0.linear'"},
            "merge method 'average_repair': layer 'hidden.0.linear' has no bias, and REPAIR",
        ),
    ],
)
def test_each_precondition_is_refused_with_its_one_line(method, fields, line):
    request = MergeRequest(**{"num_clients": 2, **FULL, **fields})
    reason = refusal(method, request)
    assert reason is not None and reason.startswith(line) and "\n" not in reason
    assert "allowed" in reason
    with pytest.raises(ValueError) as raised:
        check_method(method, request)
    assert str(raised.value) == reason


def test_an_accepted_request_returns_none_for_every_method():
    for entry in METHODS:
        count = 2 if not entry.needs.many_clients else max(2, entry.needs.fewest_clients({})[0])
        request = MergeRequest(num_clients=count, fewest_clients=count, **FULL)
        assert refusal(entry.name, request) is None, entry.name
        assert check_method(entry.name + "_t", request) is entry
        # what a caller does not know is not asked
        assert refusal(entry.name, MergeRequest(num_clients=2)) is None, entry.name


def test_the_alternatives_a_method_allows_are_accepted():
    assert refusal("embed_average", MergeRequest(num_clients=2, widths="client widths 1,2")) is None
    no_server = MergeRequest(num_clients=2, server_data=False, federated_data=True)
    assert merge_method("average_repair").needs.clients_for_data
    assert refusal("average_repair", no_server) is None  # the clients' data stands in
    assert refusal("activation_matching", no_server) is not None
    assert refusal("krum", MergeRequest(num_clients=1, fewest_clients=1)) is None  # its own merge


def _message(error: type[Exception], call) -> str:
    with pytest.raises(error) as raised:
        call()
    return str(raised.value)


def test_the_config_check_merge_states_and_the_strategy_give_the_same_line():
    from fedlmc.strategies import PermutationAlignedAverage, StrategyOptions

    states = [mlp(s).state_dict() for s in range(3)]
    config = _message(
        ConfigError,
        lambda: validate_run_config({"methods": "average,random_direction", "num-clients": 3}),
    )
    merged = _message(ValueError, lambda: merge_states("random_direction", mlp(0), states))
    strategy = _message(
        ValueError,
        lambda: PermutationAlignedAverage(
            mlp(0), StrategyOptions(num_clients=3, calibration="none"), method="random_direction"
        ),
    )
    assert config == merged == strategy
    assert config == "merge method 'random_direction' with 3 clients: allowed: at most 2 clients"
    base_config = _message(
        ConfigError, lambda: validate_run_config({"strategy": "aligned", "align": "ties"})
    )
    base_merge = _message(ValueError, lambda: merge_states("ties", mlp(0), states[:2]))
    assert base_config == base_merge and "needs the clients' common base model" in base_config


def test_the_request_of_a_run_config_is_read_from_its_keys():
    config = validate_run_config({"model": "mlp", "bias": False, "init": "shared"})
    request = merge_request(config)
    assert (request.num_clients, request.model, request.base) == (2, "mlp", True)
    assert request.chain_reason == "" and request.bias_free == "model 'mlp' with bias = false"
    assert request.server_data is None and request.clients is None  # asked by the merge
    vgg = merge_request(validate_run_config({"model": "vgg11"}))
    assert vgg.chain_reason == "norm = 'bn'" and vgg.bias_free == "" and vgg.base is False


@pytest.mark.slow
@pytest.mark.parametrize(
    "first",
    ["field.field_methods", "robust.rules", "baselines.baselines", "method_registry"],
)
def test_the_registry_loads_the_built_ins_in_one_order_whatever_is_imported_first(first):
    """Importing a built-in module registers nothing; the registry registers every built-in
    itself at its first listing, in :data:`BUILTIN_MODULES`' order, without torch."""
    script = (
        f"import sys, fedlmc.merging.{first}\n"
        "from fedlmc.merging import method_registry as r\n"
        "print(len(r.METHODS._entries), ','.join(r.merge_method_names()), 'torch' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr
    count, names, torch_loaded = done.stdout.split()
    assert count == "0" and torch_loaded == "False"
    declared = [d for m in BUILTIN_MODULES for d in _DECLARED[f"fedlmc.merging.{m}"]]
    assert names.split(",") == [name for name, _, _ in declared]
    assert {"average", "cca_merge", "fisher", "krum"} <= set(names.split(","))
