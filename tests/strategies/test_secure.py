"""The secure plain average (fedlmc.strategies.secure, simulations/private/): the
settings rule, the range check, the state round trip and the error bound on Flower's own
quantisation arithmetic (in process), and one real SecAgg+ round in a Flower simulation (Ray,
3 tiny clients, slow): the merge equals the clear plain average within the bound, its accuracy
within 0.002, the server-side strategy never received one client's arrays, and the secure
federated temperature is the pooled held-out optimum within the quantisation error; in the same
Ray session, ``average_lewc_bias``, ``embed_average`` and ``heterofl`` (clients of two widths)
under SecAgg+ equal their clear merges within their bounds. In process: ``average_lewc_bias``'s
pre-scaled biases and ``heterofl``'s held values over holder masks through Flower's
arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.common.secure_aggregation.quantization import dequantize, quantize

from fedlmc.strategies.secure import (
    OutOfRangeError,
    SecureSettings,
    check_in_range,
    clipping_rule,
    float_keys,
    from_secure_arrays,
    secure_arrays,
    secure_settings,
)


def _state(scale: float) -> dict[str, torch.Tensor]:
    return {
        "fc.weight": torch.tensor([[scale, -0.25], [0.5, 0.0]]),
        "bn.running_var": torch.tensor([1.0, 2.0]),
        "bn.num_batches_tracked": torch.tensor(17),
    }


def test_the_clipping_rule_is_a_power_of_two_with_headroom_and_at_least_8():
    assert clipping_rule(_state(0.5)) == 8.0  # 4 x 2.0 (running_var) = 8
    assert clipping_rule(_state(-3.0)) == 16.0  # 4 x 3 = 12 -> 16
    assert clipping_rule(_state(5.0)) == 32.0  # 4 x 5 = 20 -> 32
    assert secure_settings(_state(5.0), 100).clipping_range == 32.0
    assert secure_settings(_state(5.0), 100, clipping_range=6.0).clipping_range == 6.0


def test_a_value_outside_the_range_is_refused_naming_key_and_value_never_clipped():
    with pytest.raises(OutOfRangeError, match=r"the initial model: 'fc.weight' holds -7\b"):
        secure_settings(_state(-7.0), 100, clipping_range=4.0)
    with pytest.raises(OutOfRangeError, match=r"client partition 2: 'fc.weight' holds nan"):
        check_in_range(_state(math.nan), 8.0, "client partition 2")
    check_in_range(_state(8.0), 8.0, "edge")  # the range is closed
    with pytest.raises(ValueError, match="max_weight = 0"):
        secure_settings(_state(1.0), 0)


def test_only_float_arrays_travel_and_integer_buffers_keep_the_template_value():
    template = _state(1.0)
    assert float_keys(template) == ["fc.weight", "bn.running_var"]
    arrays = [a * 2 for a in secure_arrays(template)]
    assert all(a.dtype == np.float64 for a in arrays)
    back = from_secure_arrays(template, arrays)
    assert torch.equal(back["fc.weight"], template["fc.weight"] * 2)
    assert back["fc.weight"].dtype == torch.float32
    assert torch.equal(back["bn.num_batches_tracked"], template["bn.num_batches_tracked"])
    with pytest.raises(ValueError, match="got 1 aggregated arrays for 2 float keys"):
        from_secure_arrays(template, arrays[:1])


def _secagg_arithmetic(clients, counts, settings: SecureSettings) -> list[np.ndarray]:
    """SecAgg+'s computation without the masks (which cancel exactly in the modular sum):
    each client's ratio-scaled quantised arrays summed, dequantised, shifted and divided by
    the summed ratios (flwr's secaggplus_mod and SecAggPlusWorkflow.unmask_stage)."""
    c, q = settings.clipping_range, settings.quantization_range
    ratios = [round(n / settings.max_weight * q) for n in counts]
    total = None
    for arrays, r in zip(clients, ratios, strict=True):
        quantised = quantize([a * (r / q) for a in arrays], c, q)
        if total is not None:
            quantised = [t + x for t, x in zip(total, quantised, strict=True)]
        total = quantised
    summed = dequantize(total, c, q)
    offset = -(len(clients) - 1) * c
    return [(s + offset) * (q / sum(ratios)) for s in summed]


def test_flowers_quantisation_stays_within_the_documented_bound():
    rng = np.random.default_rng(0)
    settings = SecureSettings(clipping_range=8.0, max_weight=3600.0)
    counts = [1200, 900, 1500]
    clients = [[rng.uniform(-8, 8, size=(64, 32))] for _ in counts]
    got = _secagg_arithmetic(clients, counts, settings)[0]
    clear = sum(n * a[0] for n, a in zip(counts, clients, strict=True)) / sum(counts)
    error = float(np.abs(got - clear).max())
    bound = settings.error_bound(counts)
    assert 0 < error <= bound
    assert bound == pytest.approx(3 * 3 * 8.0 / (2**22 * 1.0))  # sum n_i / M = 1
    assert settings.step == pytest.approx(16 / 2**22)


def test_flowers_quantisation_of_prescaled_biases_stays_within_the_exponent_bound():
    """``average_lewc_bias`` through SecAgg+'s arithmetic: each client pre-scales the bias of
    depth l by its share r_i^(l-1), the server post-scales the mean by (sum r)^-(l-1); the
    result is the clear rule at the count weights within the bound of exponent l - 1."""
    from fedlmc.merging.sum_form import client_scaled, server_rescaled

    rng = np.random.default_rng(1)
    settings = SecureSettings(clipping_range=8.0, max_weight=5000.0)
    counts = [1200, 900, 1500]  # shares sum to 0.72: the post-scale amplifies the error
    biases = [{f"b{d}": torch.as_tensor(rng.uniform(-8, 8, size=256)) for d in range(4)}]
    biases += [{k: torch.as_tensor(rng.uniform(-8, 8, size=256)) for k in biases[0]} for _ in "ab"]
    exponents = {f"b{d}": d for d in range(4)}
    sent = [
        secure_arrays(client_scaled(b, exponents, settings.share(n)))
        for b, n in zip(biases, counts, strict=True)
    ]
    mean = dict(zip(exponents, _secagg_arithmetic(sent, counts, settings), strict=True))
    total = sum(settings.share(n) for n in counts)
    got = server_rescaled({k: torch.as_tensor(v) for k, v in mean.items()}, exponents, total)
    w = [n / sum(counts) for n in counts]
    for key, e in exponents.items():
        clear = sum(wi ** (e + 1) * b[key] for wi, b in zip(w, biases, strict=True))
        error = float((got[key] - clear).abs().max())
        assert 0 < error <= settings.exponent_error_bound(counts, e), key
    assert settings.exponent_error_bound(counts, 0) == pytest.approx(settings.error_bound(counts))


def test_flowers_quantisation_of_held_values_over_holder_masks_stays_within_the_ratio_bound():
    """``heterofl`` through SecAgg+'s arithmetic: clients holding the first 16, 48 and 56 of 64
    entries send their held values (0 elsewhere) and their masks times c; the first mean over
    the second is the clear holder average at the count weights within the ratio bound, and the
    entries held by nobody are exactly the empty-slot value."""
    from fedlmc.strategies.secure import holder_divided

    rng = np.random.default_rng(2)
    settings = SecureSettings(clipping_range=8.0, max_weight=5000.0)
    counts = [1200, 900, 1500]
    masks = [np.arange(64) < held for held in (16, 48, 56)]
    values = [np.where(m, rng.uniform(-8, 8, size=64), 0.0) for m in masks]
    sent = [[v, 8.0 * m] for v, m in zip(values, masks, strict=True)]
    aggregate = _secagg_arithmetic(sent, counts, settings)
    (got,) = holder_divided({"w": torch.zeros(64)}, aggregate, settings, counts)
    mass = sum(n * m for n, m in zip(counts, masks, strict=True))
    clear = sum(n * v for n, v in zip(counts, values, strict=True)) / np.maximum(mass, 1)
    error = float(np.abs(got[:56] - clear[:56]).max())
    assert 0 < error <= settings.holder_error_bound(counts)
    assert np.array_equal(got[56:], np.zeros(8))  # held by nobody: 0, as the clear rule
    plain = aggregate[0]  # the mean without the division shrinks the entries held by few
    assert float(np.abs(plain[:48] - clear[:48]).max()) > 1000 * settings.holder_error_bound(counts)
    with pytest.raises(ValueError, match="got 1 aggregated arrays for 2 x 1 float keys"):
        holder_divided({"w": torch.zeros(64)}, aggregate[:1], settings, counts)


# ----------------------------------------------------------------------------- Flower


TINY = {
    "dataset": "mnist5k",
    "model": "mlp",
    "width": 0.25,
    "depth": 2,
    "base-hidden": 64,
    "epochs": 1,
    "batch-size": 128,
    "timeout": 120.0,
}


def clients_in_process(config, count, partitions=None):
    """The clients' trained weights redone by hand with the same seeds and one thread (as a
    simulated client slot computes): partitions ``partitions`` (default all) of ``count``."""
    from fedlmc.simulations.client_app import shared_start
    from fedlmc.simulations.config import client_width
    from fedlmc.simulations.task import (
        build_from_config,
        client_calibration_data,
        client_seed,
        client_train_data,
        load_splits,
        train_options,
    )
    from fedlmc.train import train_model

    splits = load_splits(config)
    initial = build_from_config(config, splits).state_dict()
    states, counts, calibration = [], [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for pid in range(count) if partitions is None else partitions:
            width = client_width(config, pid)
            seed = client_seed(config["seed"], pid)
            model = build_from_config(config, splits, seed=seed, width=width)
            model.load_state_dict(shared_start(initial, model))  # sliced when narrower
            data = client_train_data(config, pid, count)
            held_out = client_calibration_data(config, pid, count)
            model, _ = train_model(
                model,
                data,
                **train_options(config),
                seed=client_seed(config["seed"], pid, 1),
                device="cpu",
                augment=splits.augment,
                held_out=held_out,
            )
            calibration.append(held_out)
            states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            counts.append(len(data[1]))
    finally:
        torch.set_num_threads(threads)
    return splits, states, counts, calibration


def _secure_cells(configs: dict[str, dict]) -> dict[str, object]:
    """Cell key -> its ServerOutcome: every config in one simulation of the sweep engine (one
    Ray session), one cell at a time as a secure sweep runs them."""
    from fedlmc.simulations.engine.cells import run_cells
    from fedlmc.simulations.engine.sweep_server import CellJob

    results = {}
    jobs = [CellJob(key, config) for key, config in configs.items()]
    run_cells(jobs, lambda r: results.__setitem__(r.key, r), max_in_flight=1)
    for result in results.values():
        if result.error is not None:
            raise result.error
    return {key: result.outcome for key, result in results.items()}


@pytest.mark.slow
def test_secagg_plus_average_equals_the_clear_average_and_the_server_sees_only_the_sum():
    from fedlmc.averaging import average, load_state
    from fedlmc.evaluation import metrics_from_logits, predict_logits
    from fedlmc.merging.calibrate import fit_temperature, temperature_statistics
    from fedlmc.simulations.config import validate_run_config
    from fedlmc.simulations.task import build_from_config

    config = validate_run_config(
        {**TINY, "num-clients": 3, "strategy": "average", "init": "shared"}
        | {"secure-aggregation": "secagg+", "calibration": "federated"}
    )
    lewc_config = validate_run_config(
        {**TINY, "num-clients": 3, "strategy": "aligned", "align": "average_lewc_bias"}
        | {"init": "shared", "secure-aggregation": "secagg+", "calibration": "none"}
    )
    mixed_config = validate_run_config(
        {**TINY, "num-clients": 3, "strategy": "aligned", "align": "embed_average"}
        | {"init": "shared", "secure-aggregation": "secagg+", "calibration": "none"}
        | {"client-widths": "0.125,0.25,0.25"}
    )
    hetero_config = validate_run_config({**mixed_config, "align": "heterofl"})
    cells = {"average": config, "lewc": lewc_config, "mixed": mixed_config}
    cells["hetero"] = hetero_config
    outcomes = _secure_cells(cells)
    outcome = outcomes["average"]
    result = outcome.secure["average"]
    splits, states, counts, calibration = clients_in_process(config, 3)
    assert sorted(result.num_examples) == sorted(counts)
    clear = average(states, counts)
    bound = result.error_bound
    drift = 1e-5  # the in-process retraining's float32 drift (as test_flower_simulation allows)
    merged = outcome.merged["average"]
    for key in float_keys(clear):
        assert float((merged[key] - clear[key]).abs().max()) <= bound + drift, key

    # The legacy strategy received the unmasked sum only: the same arrays for every client,
    # none of them one client's.
    assert len(result.received) == 3
    first = result.received[0]
    for received in result.received:
        assert all(np.array_equal(a, b) for a, b in zip(received, first, strict=True))
    for state in states:
        own = secure_arrays(state)
        gaps = [float(np.abs(a - b).max()) for a, b in zip(own, first, strict=True)]
        assert max(gaps) > 100 * bound

    rows = outcome.table().set_index("method")
    model = load_state(build_from_config(config, splits), clear).eval()
    clear_acc = metrics_from_logits(predict_logits(model, splits.test[0]), splits.test[1], 1.0)
    assert abs(rows.loc["average", "accuracy"] - clear_acc["accuracy"]) <= 0.002
    assert (rows["server_sees"] == "sum").all()
    assert (rows["clients_survived"] == 3).all() and rows["endpoint_acc_mean"].isna().all()

    # The secure federated temperature is the optimum of the pooled held-out NLL of the merge
    # (Brent on the pooled logits, in process), within the quantisation of the pooled means.
    merged_model = load_state(build_from_config(config, splits), merged).eval()
    x = torch.cat([c[0] for c in calibration])
    y = torch.cat([c[1] for c in calibration])
    logits = predict_logits(merged_model, x)
    best = fit_temperature(logits, y)
    fitted = outcome.secure["average_t"]
    curvature = temperature_statistics(logits, y, math.log(best))
    slack = 2 * fitted.error_bound / (curvature.hess_sum / curvature.count) + 1e-4
    assert abs(math.log(rows.loc["average_t", "temperature"]) - math.log(best)) <= slack
    assert (rows["rounds"] == 4 + fitted.message_rounds).all() and fitted.message_rounds >= 4
    lewc, plain = _check_the_secure_merge(outcomes["lewc"], lewc_config, "average_lewc_bias")
    lewc_result = outcomes["lewc"].secure["average_lewc_bias"]
    assert set(lewc_result.exponents.values()) == {1, 2}  # the biases of layers 2 and 3
    deepest = max(lewc_result.exponents, key=lewc_result.exponents.get)  # the pre-scale happened
    assert float((lewc[deepest] - plain[deepest]).abs().max()) > 100 * lewc_result.error_bound
    widths = clients_in_process(mixed_config, 3)  # the same clients train in both cells
    mixed, _ = _check_the_secure_merge(outcomes["mixed"], mixed_config, "embed_average", widths)
    assert outcomes["mixed"].secure["embed_average"].exponents == {}
    assert mixed["hidden.0.linear.weight"].shape[0] == 16  # the server's width, not client 0's
    hetero, _ = _check_the_secure_merge(outcomes["hetero"], hetero_config, "heterofl", widths)
    hetero_result = outcomes["hetero"].secure["heterofl"]
    assert len(hetero_result.received[0]) == 2 * len(float_keys(hetero))  # values, then masks
    # Units 8..15 are held by clients 1 and 2 only: heterofl averages them over those two,
    # embed_average shrinks them by client 0's weight (the division happened).
    key = "hidden.0.linear.weight"
    assert float((hetero[key][8:] - mixed[key][8:]).abs().max()) > 100 * hetero_result.error_bound
    assert hetero_result.bytes_sent > 1.5 * outcomes["mixed"].secure["embed_average"].bytes_sent


def _check_the_secure_merge(outcome, config, method: str, clients=None):
    """``method`` under SecAgg+ (each client's arrays pre-scaled or embedded, the mean
    post-scaled) equals the clear rule on the same clients (retrained in process) within its
    bound, with the accuracy within 0.002; returns the secure merge and the clear plain average
    of the (embedded) clients. ``clients``: :func:`clients_in_process` of ``config`` when
    already computed (two cells of the same clients)."""
    from fedlmc.averaging import average, load_state
    from fedlmc.evaluation import metrics_from_logits, predict_logits
    from fedlmc.merging.methods import merge_states
    from fedlmc.simulations.task import build_from_config

    result = outcome.secure[method]
    splits, states, counts, _ = clients or clients_in_process(config, 3)
    assert sorted(result.num_examples) == sorted(counts)
    template = build_from_config(config, splits)
    clear, aligned = merge_states(method, template, states, counts)
    merged = outcome.merged[method]
    bound, drift = result.error_bound, 1e-5
    for key in float_keys(clear):
        assert float((merged[key] - clear[key]).abs().max()) <= bound + drift, key
    rows = outcome.table().set_index("method")
    assert list(rows.index) == [method] and rows["server_sees"].eq("sum").all()
    model = load_state(template, clear).eval()
    clear_acc = metrics_from_logits(predict_logits(model, splits.test[0]), splits.test[1], 1.0)
    assert abs(rows.loc[method, "accuracy"] - clear_acc["accuracy"]) <= 0.002
    assert rows.loc[method, "secagg_error_bound"] == pytest.approx(bound)
    return merged, average(aligned, counts)
