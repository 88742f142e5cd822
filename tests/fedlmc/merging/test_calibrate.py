"""Temperature scaling (centralised and federated) and BatchNorm re-estimation."""

import math

import pytest
import torch
import torch.nn.functional as F

from fedlmc.averaging import average, load_state
from fedlmc.evaluation import metrics_from_logits
from fedlmc.merging.calibrate import (
    MAX_LOG_T_STEP,
    T_MAX,
    T_MIN,
    apply_bn_statistics,
    batchnorm_layers,
    bn_statistics,
    combine_bn_statistics,
    combine_temperature_statistics,
    fit_temperature,
    fit_temperature_federated,
    has_batchnorm,
    newton_step,
    reset_bn_stats,
    temperature_statistics,
)
from fedlmc.models.classifiers import build_model


def _noisy_logits(n: int = 600, k: int = 10, scale: float = 4.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, k, (n,), generator=g)
    logits = torch.randn(n, k, generator=g) * scale
    logits[torch.arange(n), labels] += scale  # informative but overconfident
    return logits, labels


def _mean_nll(logits, labels, t: float) -> float:
    return float(F.cross_entropy(logits.double() / t, labels))


@pytest.mark.parametrize("scale", [0.3, 4.0, 40.0])
def test_fit_temperature_matches_fine_grid_search(scale):
    logits, labels = _noisy_logits(n=300, scale=scale)
    t = fit_temperature(logits, labels)
    grid = torch.logspace(math.log10(T_MIN), math.log10(T_MAX), 10_000, dtype=torch.float64)
    z = logits.double()
    picked = z.gather(1, labels[:, None]).squeeze(1)
    grid_nll = torch.cat(  # mean NLL at each grid temperature, 500 temperatures at a time
        [
            (torch.logsumexp(z / g[:, None, None], dim=2) - picked / g[:, None]).mean(dim=1)
            for g in grid.split(500)
        ]
    )
    best = float(grid_nll.min())
    fitted = _mean_nll(logits, labels, t)
    assert fitted <= best * (1 + 1e-9)
    assert fitted >= best * (1 - 1e-3)
    assert abs(math.log(t) - math.log(float(grid[grid_nll.argmin()]))) < 2e-3


def test_fitted_temperature_scales_with_logits_and_keeps_accuracy():
    logits, labels = _noisy_logits(scale=2.0, seed=1)
    t = fit_temperature(logits, labels)
    assert T_MIN * 10 < t < T_MAX / 10
    for c in (0.01, 7.0, 250.0):
        assert fit_temperature(logits * c, labels) == pytest.approx(c * t, rel=1e-6)
    raw, scaled = metrics_from_logits(logits, labels), metrics_from_logits(logits, labels, t)
    assert raw["accuracy"] == scaled["accuracy"]
    assert scaled["nll"] < raw["nll"]


def test_fit_temperature_extreme_logits_and_all_correct_data_clamp():
    logits, labels = _noisy_logits(n=200, scale=1.0, seed=2)
    correct = logits.clone()
    correct[torch.arange(200), labels] = 50.0  # all correct with margin: T -> 0 is optimal
    assert fit_temperature(correct * 200.0, labels) == T_MIN
    t = fit_temperature(logits, labels)
    shifted = logits.double() + 1e4  # softmax is shift invariant: same T with 1e4 magnitudes
    assert fit_temperature(shifted, labels) == pytest.approx(t, rel=1e-9)
    big = logits.double() * 200 - 1e4  # magnitudes ~1e4: T scales along
    assert fit_temperature(big, labels) == pytest.approx(200 * t, rel=1e-6)
    assert fit_temperature(-big, labels) == T_MAX  # anti-informative: flatter is always better
    assert fit_temperature(torch.zeros(5, 3), torch.tensor([0, 1, 2, 0, 1])) == 1.0
    with pytest.raises(ValueError, match="logits"):
        fit_temperature(torch.full((2, 3), float("nan")), torch.tensor([0, 1]))


def test_temperature_statistics_derivatives_match_finite_differences():
    logits, labels = _noisy_logits(n=300, scale=3.0, seed=4)
    u, h = 0.3, 1e-5
    st = temperature_statistics(logits, labels, u)
    up, down = (temperature_statistics(logits, labels, u + d) for d in (h, -h))
    assert st.count == 300
    assert st.nll_sum / 300 == pytest.approx(_mean_nll(logits, labels, math.exp(u)), rel=1e-12)
    assert st.grad_sum == pytest.approx((up.nll_sum - down.nll_sum) / (2 * h), rel=1e-6)
    assert st.hess_sum == pytest.approx((up.grad_sum - down.grad_sum) / (2 * h), rel=1e-6)


@pytest.mark.parametrize("scale", [0.05, 5.0, 100.0])
def test_federated_temperature_matches_centralised_fit(scale):
    logits, labels = _noisy_logits(n=900, scale=scale, seed=5)
    clients = [(logits[i::3], labels[i::3]) for i in range(3)]
    t_central = fit_temperature(logits, labels)

    def stat_fn(log_t):
        return [temperature_statistics(z, y, log_t) for z, y in clients]

    t_fed, history = fit_temperature_federated(stat_fn)
    assert t_fed == pytest.approx(t_central, rel=1e-4)
    assert 1 <= len(history) <= 8 and all(h["clients"] == 3 for h in history)
    assert history[-1]["nll"] <= history[0]["nll"]
    combined = combine_temperature_statistics(stat_fn(0.1))
    whole = temperature_statistics(logits, labels, 0.1)
    assert combined.count == whole.count
    assert combined.grad_sum == pytest.approx(whole.grad_sum, rel=1e-12)


def test_newton_step_is_safeguarded():
    st = temperature_statistics(*_noisy_logits(scale=3.0), 0.0)
    bad = type(st)(st.count, st.nll_sum, grad_sum=-1e6, hess_sum=-5.0)
    assert newton_step(bad, 0.0) == pytest.approx(MAX_LOG_T_STEP)  # descent step, capped
    assert newton_step(bad, math.log(T_MAX)) == pytest.approx(math.log(T_MAX))  # clamped
    assert abs(newton_step(st, 0.0)) <= MAX_LOG_T_STEP
    assert newton_step(st, 0.0, max_step=0.1) == pytest.approx(-0.1 if st.grad_sum > 0 else 0.1)


# ----------------------------------------------------------------------------- BatchNorm


def _random_bn_model(seed: int, name: str = "resnet20"):
    torch.manual_seed(seed)
    model = build_model(name, width=0.125, in_shape=(1, 28, 28))
    for module in batchnorm_layers(model).values():
        module.running_mean.normal_()
        module.running_var.uniform_(0.5, 2.0)
        module.weight.data.uniform_(0.5, 1.5)
        module.bias.data.normal_(0, 0.1)
    return model


def test_bn_statistics_leave_model_untouched_and_federated_equals_centralised():
    model = _random_bn_model(0)
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(96, 1, 28, 28)
    central = bn_statistics(model, x, batch_size=16)
    assert not model.training
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    chunks = [bn_statistics(model, x[i : i + 32], batch_size=16) for i in range(0, 96, 32)]
    federated = combine_bn_statistics(chunks)
    assert set(federated) == set(central) == set(batchnorm_layers(model))
    for name, st in central.items():
        assert federated[name].count == st.count
        torch.testing.assert_close(federated[name].sum, st.sum, rtol=1e-10, atol=1e-9)
        torch.testing.assert_close(federated[name].sum_sq, st.sum_sq, rtol=1e-10, atol=1e-9)
    first = next(iter(central))
    assert central[first].count == 96 * 28 * 28


def test_reset_bn_stats_matches_empirical_moments_of_first_bn_input_after_merge():
    a, b = _random_bn_model(1), _random_bn_model(2)
    merged = load_state(a, average([a.state_dict(), b.state_dict()]))
    x = torch.randn(64, 1, 28, 28)
    first_name, first_bn = next(iter(batchnorm_layers(merged).items()))
    captured = []
    handle = first_bn.register_forward_pre_hook(lambda _m, inp: captured.append(inp[0].double()))
    merged.eval()
    with torch.no_grad():
        merged(x)
    handle.remove()
    z = captured[0].transpose(0, 1).reshape(first_bn.num_features, -1)
    stale_mean = first_bn.running_mean.clone()
    assert reset_bn_stats(merged, (x, torch.zeros(64)), batch_size=16) is merged
    torch.testing.assert_close(first_bn.running_mean.double(), z.mean(dim=1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(first_bn.running_var.double(), z.var(dim=1), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(stale_mean, first_bn.running_mean)
    # deeper layers: the statistics now describe the (train-mode) inputs, so running a batch in
    # train mode with momentum 1 reproduces the same buffers
    reset_bn_stats(merged, x, batch_size=64)
    check = load_state(merged, merged.state_dict())
    for m in batchnorm_layers(check).values():
        m.momentum = 1.0
    check.train()
    with torch.no_grad():
        check(x)
    for name, m in batchnorm_layers(check).items():
        ref = batchnorm_layers(merged)[name]
        torch.testing.assert_close(m.running_mean, ref.running_mean, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(m.running_var, ref.running_var, rtol=1e-4, atol=1e-5)
    assert first_name in bn_statistics(merged, x)


def test_single_sample_tail_batch_joins_previous_batch():
    model = build_model("vgg11", width=0.125, in_shape=(1, 28, 28))  # 1x1 spatial at the end
    stats = bn_statistics(model, torch.randn(9, 1, 28, 28), batch_size=4)
    assert next(iter(stats.values())).count == 9 * 28 * 28


def test_has_batchnorm_and_apply_requires_every_layer():
    assert has_batchnorm(build_model("vgg11", width=0.125, in_shape=(1, 28, 28)))
    assert not has_batchnorm(build_model("mlp", width=0.125))
    model = _random_bn_model(3)
    assert reset_bn_stats(build_model("mlp", width=0.125), torch.randn(4, 1, 28, 28)) is not None
    with pytest.raises(ValueError, match="BN"):
        apply_bn_statistics(model, {})


def test_federated_fit_on_separable_data_moves_towards_small_t_and_rejects_empty_rounds():
    # all correct with margin: the NLL decreases as T -> 0 (the centralised fit clamps to T_MIN);
    # the federated Newton steps shrink with the gradient, but every round must lower the NLL
    logits, labels = _noisy_logits(n=90, scale=1.0, seed=6)
    logits[torch.arange(90), labels] = 6.0
    assert fit_temperature(logits, labels) == T_MIN
    clients = [(logits[i::3], labels[i::3]) for i in range(3)]
    t, history = fit_temperature_federated(
        lambda u: [temperature_statistics(z, y, u) for z, y in clients]
    )
    nll = [h["nll"] for h in history]
    assert t < 0.5 and len(history) == 8
    assert all(later < earlier for earlier, later in zip(nll, nll[1:], strict=False))
    empty = temperature_statistics(logits[:0], labels[:0], 0.0)
    with pytest.raises(ValueError, match="samples"):
        fit_temperature_federated(lambda u: [empty])
