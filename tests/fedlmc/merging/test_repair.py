"""REPAIR: unit statistics add up over shards, repaired units hit their targets, the federated
driver equals the server-side function, REPAIR helps a plain average of trained MLPs, and a
bias-free model (no bias to set the mean through) is refused."""

from __future__ import annotations

import pytest
import torch

from fedlmc.averaging import average, load_state
from fedlmc.merging.method_registry import MergeRequest, refusal
from fedlmc.merging.methods import merge_states
from fedlmc.merging.repair import (
    UnitStats,
    combine_unit_statistics,
    repair,
    repair_layers,
    repair_targets,
    repair_with_statistics,
    unit_statistics,
)
from fedlmc.merging.request_facts import model_facts
from fedlmc.models.classifiers import build_model
from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.config.schema import ConfigError

SMALL = (1, 8, 8)


def _model(name: str, seed: int, **options) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(name, in_shape=SMALL, **options).eval()


def _pair_and_average(name: str, **options):
    a, b = _model(name, 0, **options), _model(name, 1, **options)
    merged = load_state(a, average([a.state_dict(), b.state_dict()], [0.3, 0.7]))
    return a, b, merged


def _inputs(n: int = 96, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, *SMALL, generator=torch.Generator().manual_seed(seed))


def test_default_layers_are_the_hidden_linear_and_conv_layers():
    assert repair_layers(_model("mlp", 0, depth=3, base_hidden=8)) == [
        f"hidden.{i}.linear" for i in range(3)
    ]
    vgg = _model("vgg11", 0, width=0.125, norm="none")
    assert repair_layers(vgg) == [f"features.block{k}.conv" for k in range(1, 9)]
    resnet = _model("resnet20", 0, width=0.125, norm="none")
    layers = repair_layers(resnet)
    assert layers[:4] == ["stem.conv", "stage1.0.conv1", "stage1.0.conv2", "stage1.1.conv1"]
    assert "stage2.0.shortcut.conv" in layers and "classifier" not in layers and len(layers) == 21


def test_unit_statistics_add_up_over_shards_and_match_direct_moments():
    model = _model("vgg11", 2, width=0.125, norm="none")
    x = _inputs(50)
    whole = unit_statistics(model, x, batch_size=16)
    parts = combine_unit_statistics(
        [unit_statistics(model, x[:17], batch_size=5), unit_statistics(model, x[17:])]
    )
    assert list(whole) == repair_layers(model)
    for name in whole:
        torch.testing.assert_close(parts[name].sum, whole[name].sum, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(parts[name].sum_sq, whole[name].sum_sq, rtol=1e-10, atol=1e-10)
        assert parts[name].count == whole[name].count
    # against the moments of the captured conv output (every spatial position is a sample)
    captured = {}
    conv = dict(model.named_modules())["features.block2.conv"]
    handle = conv.register_forward_hook(lambda _m, _i, out: captured.setdefault("z", out))
    with torch.no_grad():
        model(x)
    handle.remove()
    z = captured["z"].double().movedim(1, -1).reshape(-1, captured["z"].shape[1])
    stats = whole["features.block2.conv"]
    assert stats.count == z.shape[0] == 50 * 4 * 4
    torch.testing.assert_close(stats.mean, z.mean(0))
    torch.testing.assert_close(stats.std, z.std(0, correction=0))


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("mlp", {"depth": 3, "base_hidden": 16}),
        ("mlp", {"depth": 2, "base_hidden": 16, "norm": "ln"}),
        ("vgg11", {"width": 0.125, "norm": "none"}),
    ],
)
def test_repaired_units_have_the_interpolated_mean_and_std(name, options):
    a, b, merged = _pair_and_average(name, **options)
    x = _inputs()
    targets = repair_targets([unit_statistics(a, x), unit_statistics(b, x)], [0.3, 0.7])
    before = unit_statistics(merged, x)
    snapshot = {k: v.clone() for k, v in merged.state_dict().items()}
    a.train()
    repaired = repair(merged, [a, b], [3, 7], x)
    assert a.training and not b.training  # modes are restored
    after = unit_statistics(repaired, x)
    assert list(after) == repair_layers(merged)
    for layer, target in targets.items():
        torch.testing.assert_close(after[layer].mean, target.mean, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(after[layer].std, target.std, rtol=1e-4, atol=1e-6)
    # the average had collapsed variance somewhere; the input model is left as it was
    assert any(bool((before[k].std < 0.9 * targets[k].std).any()) for k in targets)
    assert all(torch.equal(v, snapshot[k]) for k, v in merged.state_dict().items())
    assert not any(m._forward_hooks for m in merged.modules())


def test_bias_free_layers_are_refused_before_any_statistics():
    # REPAIR sets the mean through the bias; without one it would be RESCALE, not REPAIR
    a, b, merged = _pair_and_average("mlp", depth=1, base_hidden=16, bias=False)
    calls = []

    def statistics_fn(model, names):
        calls.append(names)
        return unit_statistics(model, _inputs(), names)

    with pytest.raises(ValueError, match=r"'hidden.0.linear' has none.*average_rescale"):
        repair_with_statistics(merged, [a, b], [0.3, 0.7], statistics_fn)
    assert calls == []
    states = [a.state_dict(), b.state_dict()]
    server = (_inputs(), torch.zeros(96, dtype=torch.long))
    with pytest.raises(
        ValueError, match=r"^merge method 'average_repair': layer 'hidden.0.linear' has"
    ):
        merge_states("average_repair", a, states, server_data=server)
    request = MergeRequest(num_clients=2, **model_facts(a, None, ["average_rescale"]))
    assert refusal("average_rescale", request) is None


def test_constant_units_keep_their_weights_and_get_the_target_mean():
    a, b, merged = _pair_and_average("mlp", depth=1, base_hidden=8)
    with torch.no_grad():
        merged.hidden[0].linear.weight[0] = 0.0  # unit 0 of the merged model is constant
    x = _inputs()
    repaired = repair(merged, [a, b], [0.3, 0.7], x)
    target = repair_targets([unit_statistics(a, x), unit_statistics(b, x)], [0.3, 0.7])
    after = unit_statistics(repaired, x)["hidden.0.linear"]
    assert torch.equal(repaired.hidden[0].linear.weight[0], merged.hidden[0].linear.weight[0])
    assert after.mean[0].item() == pytest.approx(target["hidden.0.linear"].mean[0].item(), abs=1e-6)
    assert torch.isfinite(repaired.hidden[0].linear.weight).all()


def test_federated_sums_give_the_server_side_result_in_n_plus_l_calls():
    a, b, merged = _pair_and_average("vgg11", width=0.125, norm="none")
    x = _inputs(64)
    shards = [x[:24], x[24:]]
    calls = []

    def statistics_fn(model, layers):
        calls.append(list(layers))
        return combine_unit_statistics([unit_statistics(model, s, layers) for s in shards])

    federated = repair_with_statistics(merged, [a, b], [0.3, 0.7], statistics_fn)
    server = repair(merged, [a, b], [0.3, 0.7], x)
    layers = repair_layers(merged)
    assert calls == [layers, layers] + [[name] for name in layers]
    for key, value in server.state_dict().items():
        torch.testing.assert_close(federated.state_dict()[key], value, rtol=1e-5, atol=1e-7)
    repaired_weight = f"{layers[-1]}.weight"
    assert not torch.allclose(
        server.state_dict()[repaired_weight], merged.state_dict()[repaired_weight]
    )


def test_explicit_layers_are_repaired_in_depth_order_and_others_untouched():
    a, b, merged = _pair_and_average("mlp", depth=3, base_hidden=16)
    x = _inputs()
    chosen = ["hidden.2.linear", "hidden.0.linear"]
    repaired = repair(merged, [a, b], None, x, layers=chosen)
    untouched = merged.state_dict()["hidden.1.linear.weight"]
    assert torch.equal(repaired.state_dict()["hidden.1.linear.weight"], untouched)
    targets = repair_targets([unit_statistics(a, x, chosen), unit_statistics(b, x, chosen)])
    after = unit_statistics(repaired, x, chosen)
    for layer in chosen:  # hidden.2 was measured after hidden.0 was corrected
        torch.testing.assert_close(after[layer].std, targets[layer].std, rtol=1e-4, atol=1e-6)


def test_bad_input_raises_value_error():
    a, b, merged = _pair_and_average("mlp", depth=1, base_hidden=8)
    x = _inputs(8)
    with pytest.raises(ValueError, match="'nope'"):
        repair(merged, [a, b], None, x, layers=["nope"])
    with pytest.raises(ValueError, match="at least one endpoint"):
        repair(merged, [], None, x)
    with pytest.raises(ValueError, match="weights"):
        repair(merged, [a, b], [1.0], x)
    with pytest.raises(ValueError, match="saw no data"):
        unit_statistics(merged, x[:0])
    with pytest.raises(ValueError, match="batch_size"):
        unit_statistics(merged, x, batch_size=0)
    with pytest.raises(ValueError, match="differ in layer"):
        combine_unit_statistics([unit_statistics(merged, x), {}])
    with pytest.raises(ValueError, match="units"):
        UnitStats(torch.zeros(2), torch.zeros(2), 1) + UnitStats(torch.zeros(3), torch.zeros(3), 1)
    bn = _model("mlp", 0, depth=1, base_hidden=8, norm="bn")
    with pytest.raises(ValueError, match="reset_bn_stats"):
        repair(bn, [bn, bn], None, x)


def test_repair_lowers_the_test_loss_of_a_plain_average_of_trained_mlps():
    """Two tiny MLPs trained from different seeds on the embedded digits: the plain average's
    hidden units have collapsed variance; REPAIR (on the 400 server digits) restores it and lowers
    the test NLL and raises the accuracy. Measured: NLL 1.63 -> 1.20, accuracy 0.50 -> 0.64 (other
    seed pairs, widths and epochs gave NLL drops of 0.39-0.64 and accuracy gains of 0.14-0.27)."""
    from fedlmc.data.loading import load_dataset
    from fedlmc.evaluation import evaluate
    from fedlmc.train import train_model

    splits = load_dataset("mnist5k")
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = build_model("mlp", width=0.25, in_shape=splits.in_shape)
        model, _ = train_model(
            model,
            splits.train,
            epochs=3,
            lr=0.05,
            weight_decay=3e-3,
            batch_size=128,
            seed=seed,
            device="cpu",
        )
        models.append(model)
    merged = load_state(models[0], average([m.state_dict() for m in models]))
    repaired = repair(merged, models, None, splits.server[0])
    plain, fixed = evaluate(merged, splits.test), evaluate(repaired, splits.test)
    assert fixed["nll"] < plain["nll"] - 0.2, (plain, fixed)
    assert fixed["accuracy"] > plain["accuracy"] + 0.05, (plain, fixed)


def test_a_run_config_asking_repair_of_a_bias_free_model_is_refused():
    with pytest.raises(
        ConfigError,
        match=r"'average_repair': model 'mlp' with bias = false has no .*RESCALE",
    ):
        validate_run_config({"methods": "average,average_repair_t", "bias": False})
    validate_run_config({"methods": "average_repair_t", "bias": True})
    # with BatchNorm, REPAIR is the statistics' reset: no bias needed
    validate_run_config({"methods": "average_repair", "model": "vgg11", "bias": False})
