"""Fisher merging and RegMean under Flower's real SecAgg+ (fedlmc.strategies.secure_statistics,
the secure client of simulations/private/), in process: Flower's server workflow and each node's
``secaggplus_mod`` on an in-process grid (test_secure_dropped's), each node training with the
fedlmc ClientApp's handler and sending its parts. The secure merge equals the clear rule on the
same clients (NLL within 1e-5, every weight within the bound); the server-side strategy received
only the unmasked mean, which is no client's parts; the finest quantisation Flower takes, and
the splitting of the aggregate by the parts' shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlmc.averaging import load_state
from fedlmc.evaluation import metrics_from_logits, predict_logits
from fedlmc.merging.field.fisher import statistics_seed
from fedlmc.merging.methods import merge_states
from fedlmc.simulations.client_app import train_reply
from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.private.secure_client import secure_fit_reply
from fedlmc.simulations.private.secure_server import secure_fit_config, secure_sums_options
from fedlmc.simulations.task import build_from_config, load_splits
from fedlmc.strategies.protocol import record_to_state
from fedlmc.strategies.secure import secure_arrays, secure_settings
from fedlmc.strategies.secure_forms import secure_form
from fedlmc.strategies.secure_statistics import (
    fine_settings,
    finest_levels,
    split_parts,
    weight_range,
)
from tests.simulations.test_server_app_field_methods import local_clients
from tests.strategies.test_secure import TINY
from tests.strategies.test_secure_dropped import NODES, InProcessGrid

CELL = {**TINY, "num-clients": len(NODES), "strategy": "aligned", "init": "shared"}
CELL |= {"secure-aggregation": "secagg+", "calibration": "none"}
CELL |= {"fisher-samples": 64, "regmean-samples": 64}


@pytest.fixture(autouse=True)
def server_task(task_identity):
    """The identity a ServerApp process has (the shared ``task_identity`` fixture)."""


def _secure_round(method: str):
    """One real SecAgg+ round of ``method``: the secure result, the clients' trained states in
    partition order, the run config and its template."""
    from fedlmc.strategies.secure_statistics import secure_sums_merge

    config = validate_run_config({**CELL, "align": method}, check_devices=False)
    splits = load_splits(config)
    template = build_from_config(config, splits)
    initial = {k: v.detach().cpu() for k, v in template.state_dict().items()}
    settings = fine_settings(secure_settings(initial, len(splits.train[1])), len(NODES))
    c, m = settings.clipping_range, settings.max_weight
    fit_config = secure_fit_config(config, c, m, method, weight_range(initial, c, fixed=False))
    trained = {}

    def recording(message, context):
        reply = train_reply(message, context)
        trained[context.node_config["partition-id"]] = record_to_state(
            reply.content.array_records["arrays"]
        )
        return reply

    grid = InProcessGrid({}, answer=lambda m, c: secure_fit_reply(m, c, recording))
    sums, options = secure_form(method).secure_sums, secure_sums_options(config)
    result = secure_sums_merge(
        grid, initial, template, len(NODES), fit_config, settings, sums, options, timeout=60.0
    )
    return result, [trained[p] for p in range(len(NODES))], config, template, splits


@pytest.mark.parametrize("method", ["fisher", "regmean"])
def test_the_secure_merge_is_the_clear_one_and_the_server_holds_only_the_mean(method):
    result, states, config, template, splits = _secure_round(method)
    local, data = local_clients(config, template, states, 64)
    assert sorted(result.num_examples) == sorted(len(y) for _, y in data)
    clear, _ = merge_states(method, template, states, [len(y) for _, y in data], clients=local)
    gap = max(float((result.merged_state[k] - clear[k]).abs().max()) for k in clear)
    assert gap <= result.error_bound
    secure_model = load_state(template, result.merged_state).eval()
    clear_model = load_state(template, clear).eval()
    x, y = splits.test
    found = metrics_from_logits(predict_logits(secure_model, x), y, 1.0)
    expected = metrics_from_logits(predict_logits(clear_model, x), y, 1.0)
    assert abs(found["nll"] - expected["nll"]) <= 1e-5
    assert abs(found["accuracy"] - expected["accuracy"]) <= 0.002
    # the strategy received the unmasked mean only: the same for every result, no client's parts
    assert len(result.received) == len(NODES)
    first = result.received[0]
    assert all(
        all(np.array_equal(a, b) for a, b in zip(r, first, strict=True)) for r in result.received
    )
    delta = result.settings.exponent_error_bound(result.num_examples, 0)
    options = {**secure_sums_options(config), "clipping_range": result.settings.clipping_range}
    options["weight_range"] = weight_range(
        {k: v for k, v in template.state_dict().items()}, result.settings.clipping_range, False
    )
    for p, state in enumerate(states):
        model = load_state(template, state).eval()
        seeded = {**options, "statistics_seed": statistics_seed(config["seed"], p)}
        own = secure_form(method).secure_sums.client_parts(model, data[p], seeded)
        arrays = [a for part in own for a in secure_arrays(part)]
        gaps = [float(np.abs(a - b).max()) for a, b in zip(arrays, first, strict=True)]
        assert max(gaps) > 100 * delta


def test_the_finest_quantisation_keeps_the_sum_below_flowers_modulus():
    assert finest_levels(1) == finest_levels(2) == 2**30
    assert finest_levels(3) == finest_levels(4) == 2**29
    assert finest_levels(8) == 2**28 and finest_levels(9) == 2**27
    for n in (2, 3, 8, 100):
        assert n * finest_levels(n) <= 2**31
    with pytest.raises(ValueError, match="num_clients = 0"):
        finest_levels(0)


def test_the_weight_range_is_eight_times_the_initial_weights_within_the_clipping_range():
    initial = {"w": torch.tensor([0.05, -0.09]), "n": torch.tensor(3)}
    assert weight_range(initial, 8.0, fixed=False) == 1.0  # 8 x 0.09 = 0.72 -> 1
    assert weight_range(initial, 0.5, fixed=False) == 0.5  # never above c
    assert weight_range(initial, 16.0, fixed=True) == 16.0  # a set clipping range bounds them


def test_the_aggregate_is_split_by_the_parts_shapes():
    shapes = [{"a": (2,), "b": (1, 2)}, {"a": (2,)}]
    arrays = [np.array([1.0, 2.0]), np.array([[3.0, 4.0]]), np.array([5.0, 6.0])]
    parts = split_parts(arrays, shapes)
    assert torch.equal(parts[1]["a"], torch.tensor([5.0, 6.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="got 2 aggregated arrays for 3 in the parts"):
        split_parts(arrays[:2], shapes)
    with pytest.raises(ValueError, match="aggregated 'b' has shape"):
        split_parts([arrays[0], np.zeros(3), arrays[2]], shapes)
