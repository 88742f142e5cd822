r"""Post-hoc calibration of merged models: softmax temperature and BatchNorm statistics.

**Temperature.** For logits :math:`z \in \mathbb{R}^K`, label :math:`y` and temperature
:math:`T = e^{u}` (we optimise :math:`u = \log T`; write :math:`s = 1/T = e^{-u}`), the
per-sample NLL is

.. math:: \ell(u) = -s z_y + \log \textstyle\sum_k e^{s z_k}.

With :math:`p = \mathrm{softmax}(s z)`, :math:`\mu = E_p[z]`, :math:`\sigma^2 = \mathrm{Var}_p[z]`:

.. math::
    \frac{d\ell}{ds} = \mu - z_y, \quad \frac{d^2\ell}{ds^2} = \sigma^2, \quad
    \frac{d\ell}{du} = s\,(z_y - \mu), \quad \frac{d^2\ell}{du^2} = s^2\sigma^2 + s\,(\mu - z_y).

The mean NLL is convex in :math:`s`, hence unimodal in :math:`u`, and its :math:`u`-derivative
changes sign at most once; :func:`fit_temperature` finds that root by bracketing. Temperatures
are clamped to ``[T_MIN, T_MAX] = [1e-3, 1e3]``: when all samples are classified correctly with
a margin, the NLL keeps decreasing as :math:`T \to 0` and the fit returns ``T_MIN``.
Temperature never changes the argmax.

**Federated temperature.** Each client sends :class:`TemperatureStats` per round: 4 floats
(count and the sums of :math:`\ell`, :math:`\ell_u`, :math:`\ell_{uu}` over its samples), i.e.
32 bytes as float64; the server sums them, takes a safeguarded Newton step in :math:`u` and
broadcasts the new :math:`u` (1 float, 8 bytes). Sums are exact, so the federated fit
converges to the centralised one.

**BatchNorm.** After merging, BN running statistics no longer match the activations. Each
client computes per-channel sums :math:`S_1 = \sum x`, :math:`S_2 = \sum x^2` and the element
count :math:`n` of every BN layer's input (train-mode forward, batch statistics upstream); the
server sums them and sets ``running_mean`` :math:`= S_1/n` and ``running_var``
:math:`= (S_2 - S_1^2/n)/(n-1)` (unbiased, as PyTorch stores it). Per round and BN layer with
:math:`C` channels a client sends :math:`2C + 1` numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from scipy.optimize import brentq
from torch import Tensor, nn

from fedlmc.capture import forward_capture
from fedlmc.merging.temperature_bound import T_MAX, T_MIN

LOG_T_MIN = math.log(T_MIN)
LOG_T_MAX = math.log(T_MAX)
MAX_LOG_T_STEP = 2.0


# ----------------------------------------------------------------------------- temperature


@dataclass(frozen=True)
class TemperatureStats:
    r"""Sums over one client's samples at a given :math:`u = \log T`.

    ``nll_sum`` :math:`= \sum \ell`, ``grad_sum`` :math:`= \sum d\ell/du`,
    ``hess_sum`` :math:`= \sum d^2\ell/du^2` (see the module docstring for the formulas).
    """

    count: int
    nll_sum: float
    grad_sum: float
    hess_sum: float


def _check_logits(logits: Tensor, labels: Tensor) -> None:
    if logits.ndim != 2 or labels.ndim != 1 or len(logits) != len(labels):
        raise ValueError(
            f"expected logits (N, K) and labels (N,), got {tuple(logits.shape)} and "
            f"{tuple(labels.shape)}"
        )


def temperature_statistics(logits: Tensor, labels: Tensor, log_t: float) -> TemperatureStats:
    r"""NLL of ``softmax(logits / T)`` and its first two derivatives in :math:`u = \log T`, summed.

    With :math:`s = e^{-u}`: :math:`\ell = -s z_y + \mathrm{lse}(s z)`,
    :math:`\ell_u = s (z_y - \mu)`, :math:`\ell_{uu} = s^2 \sigma^2 + s (\mu - z_y)` where
    :math:`\mu, \sigma^2` are the mean and variance of :math:`z` under
    :math:`p = \mathrm{softmax}(s z)`. Computed in float64.
    """
    _check_logits(logits, labels)
    if not math.isfinite(log_t):
        raise ValueError(f"log_t must be finite, got {log_t}")
    z = logits.detach().double().cpu()
    y = labels.detach().long().cpu()
    s = math.exp(-log_t)
    scaled = s * z
    log_p = F.log_softmax(scaled, dim=1)
    p = log_p.exp()
    # d_k = z_y - z_k, so z_y - mu = sum_k p_k d_k keeps its tiny value when p_y rounds to 1
    d = z.gather(1, y[:, None]) - z
    margin = (p * d).sum(dim=1)
    var = (p * (margin[:, None] - d) ** 2).sum(dim=1)
    nll = -log_p.gather(1, y[:, None]).squeeze(1)
    grad = s * margin
    hess = s * s * var - s * margin
    return TemperatureStats(len(y), float(nll.sum()), float(grad.sum()), float(hess.sum()))


def combine_temperature_statistics(stats: Sequence[TemperatureStats]) -> TemperatureStats:
    """Sum of the clients' statistics (all taken at the same ``log_t``)."""
    if len(stats) == 0:
        raise ValueError("combine_temperature_statistics needs at least one client, got none")
    return TemperatureStats(
        count=sum(int(st.count) for st in stats),
        nll_sum=math.fsum(st.nll_sum for st in stats),
        grad_sum=math.fsum(st.grad_sum for st in stats),
        hess_sum=math.fsum(st.hess_sum for st in stats),
    )


def temperature_grid(points: int) -> list[float]:
    """``points`` evenly spaced values of log T from log T_MIN to log T_MAX (the federated fit's
    first round, and the calibrated NLL of ``auto`` on the clients' data)."""
    if points < 2:
        raise ValueError(f"temperature_grid_points = {points}; allowed: an integer >= 2")
    step = (LOG_T_MAX - LOG_T_MIN) / (points - 1)
    return [LOG_T_MIN + i * step for i in range(points)]


def grid_minimum(per_client: Sequence[Sequence[TemperatureStats]], grid: Sequence[float]):
    """``(log_t, combined stats)`` at the grid point with the lowest NLL summed over clients
    (``per_client[c][i]``: client ``c``'s statistics at ``grid[i]``)."""
    combined = [
        combine_temperature_statistics([client[i] for client in per_client])
        for i in range(len(grid))
    ]
    best = min(range(len(grid)), key=lambda i: combined[i].nll_sum)
    return grid[best], combined[best]


def newton_step(stats: TemperatureStats, log_t: float, max_step: float = MAX_LOG_T_STEP) -> float:
    r"""One safeguarded Newton step for :math:`u = \log T`, taken in the convex :math:`s = e^{-u}`.

    The mean NLL is convex in :math:`s` but not in :math:`u`. From the :math:`u`-derivatives
    :math:`g, h` the :math:`s`-derivatives are :math:`g_s = -g/s`, :math:`h_s = (h + g)/s^2`, so
    the Newton step :math:`s' = s - g_s/h_s` reads :math:`u' = u - \log(1 + g/(h + g))`. If
    :math:`h + g \le 0` or :math:`1 + g/(h+g) \le 0` (the step would leave :math:`s > 0`), a
    step of ``max_step`` in the descent direction :math:`-\mathrm{sign}(g)` is taken instead.
    Every step is capped at ``max_step`` in absolute value and the result is clamped to
    ``[log T_MIN, log T_MAX]``.
    """
    if stats.count <= 0:
        raise ValueError(f"stats.count must be > 0, got {stats.count}")
    g, h = stats.grad_sum, stats.hess_sum
    if g == 0:
        return max(LOG_T_MIN, min(LOG_T_MAX, log_t))
    curvature = h + g
    ratio = 1.0 + g / curvature if curvature > 0 else -1.0
    step = -math.log(ratio) if ratio > 0 else -math.copysign(max_step, g)
    step = max(-max_step, min(max_step, step))
    return max(LOG_T_MIN, min(LOG_T_MAX, log_t + step))


def _mean_grad(z: Tensor, y: Tensor, log_t: float) -> float:
    stats = temperature_statistics(z, y, log_t)
    return stats.grad_sum / stats.count


def fit_temperature(logits: Tensor, labels: Tensor) -> float:
    r"""Temperature :math:`T \in [10^{-3}, 10^3]` minimising the mean NLL of ``softmax(z / T)``.

    The mean NLL is convex in :math:`s = 1/T`, so its derivative in :math:`u = \log T` changes sign
    at most once; the root is found by Brent's method on ``[log T_MIN, log T_MAX]`` in float64
    (to 1e-12 in :math:`u`). If the derivative is already >= 0 at ``T_MIN`` (e.g. all samples
    correct: sharper is always better) ``T_MIN`` is returned, if it is <= 0 at ``T_MAX``, ``T_MAX``;
    when the NLL does not depend on ``T`` at all (constant logits) the result is 1. This
    numerical step says nothing about a bound (it runs at every point of a path);
    :func:`fedlmc.merging.post_merge.calibrate` and every caller that reports a temperature do
    (:mod:`fedlmc.merging.temperature_bound`).
    """
    _check_logits(logits, labels)
    if len(labels) == 0:
        raise ValueError("fit_temperature needs at least one sample, got none")
    z = logits.detach().double().cpu()
    y = labels.detach().long().cpu()
    if not torch.isfinite(z).all():
        raise ValueError("logits must be finite, got NaN or inf")
    g_low = _mean_grad(z, y, LOG_T_MIN)
    g_high = _mean_grad(z, y, LOG_T_MAX)
    if g_low >= 0 and g_high <= 0:
        return 1.0
    if g_low >= 0:
        return T_MIN
    if g_high <= 0:
        return T_MAX
    root = brentq(lambda u: _mean_grad(z, y, u), LOG_T_MIN, LOG_T_MAX, xtol=1e-12, rtol=1e-14)
    return float(math.exp(root))


def fit_temperature_federated(
    stat_fn: Callable[[float], Sequence[TemperatureStats]],
    log_t0: float = 0.0,
    steps: int = 8,
    tol: float = 1e-6,
) -> tuple[float, list[dict[str, float]]]:
    r"""Fit :math:`T` from per-client statistics with safeguarded Newton steps in :math:`\log T`.

    Each round calls ``stat_fn(log_t)`` (one message round: every client returns 4 floats, 32 bytes
    as float64; the server sends 1 float), sums the statistics and steps with :func:`newton_step`.
    If a round's mean NLL is higher than the best seen so far, the next point is the midpoint back
    towards the best one (a backtracking step, which needs no extra round). Stops after ``steps``
    rounds or when the Newton step is smaller than ``tol``. On separable data (every sample
    correct with a margin) the NLL decays like :math:`e^{-\mathrm{margin}/T}` and the steps
    shrink with it, so ``T`` decreases round by round without reaching ``T_MIN`` (the NLL there
    is already negligible); :func:`fit_temperature` returns ``T_MIN`` in that case.

    Returns ``(T, history)``; ``history`` has one dict per round with ``round, log_t, temperature,
    nll`` (mean), ``grad``, ``hess`` (sums) and ``clients``.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    log_t = max(LOG_T_MIN, min(LOG_T_MAX, float(log_t0)))
    best_log_t, best_nll = log_t, math.inf
    history: list[dict[str, float]] = []
    for round_index in range(steps):
        client_stats = list(stat_fn(log_t))
        stats = combine_temperature_statistics(client_stats)
        if stats.count <= 0:
            raise ValueError(f"clients reported {stats.count} samples in total; need at least 1")
        mean_nll = stats.nll_sum / stats.count
        history.append(
            {
                "round": round_index,
                "log_t": log_t,
                "temperature": math.exp(log_t),
                "nll": mean_nll,
                "grad": stats.grad_sum,
                "hess": stats.hess_sum,
                "clients": len(client_stats),
            }
        )
        if mean_nll > best_nll:
            log_t = 0.5 * (log_t + best_log_t)
            continue
        best_log_t, best_nll = log_t, mean_nll
        new_log_t = newton_step(stats, log_t)
        if abs(new_log_t - log_t) < tol:
            return math.exp(new_log_t), history
        log_t = new_log_t
    return math.exp(best_log_t), history


# ----------------------------------------------------------------------------- BatchNorm


@dataclass(frozen=True)
class BNStats:
    """Per-channel sum and sum of squares (float64) of a BN layer's input; elements per channel."""

    sum: Tensor
    sum_sq: Tensor
    count: int


def batchnorm_layers(model: nn.Module) -> dict[str, nn.modules.batchnorm._BatchNorm]:
    """BatchNorm modules of ``model`` that track running statistics, by ``named_modules`` name."""
    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats
    }


def has_batchnorm(model: nn.Module) -> bool:
    """Whether ``model`` has a BatchNorm layer with running statistics."""
    return bool(batchnorm_layers(model))


def _channel_moments(x: Tensor) -> tuple[Tensor, Tensor, int]:
    """Per-channel (dim 1) sum and sum of squares in float64 and the count per channel."""
    x = x.detach().double()
    dims = [d for d in range(x.ndim) if d != 1]
    return x.sum(dim=dims).cpu(), (x * x).sum(dim=dims).cpu(), x.numel() // x.shape[1]


def batch_bounds(n: int, batch_size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of consecutive batches; a trailing batch of one sample joins the previous.

    (Train-mode BatchNorm cannot normalise a single sample at 1x1 spatial size.)
    """
    bounds = [(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


def bn_statistics(model: nn.Module, x: Tensor, batch_size: int = 256) -> dict[str, BNStats]:
    r"""Per-channel :math:`\sum x`, :math:`\sum x^2` and count of every BN layer's input over ``x``.

    The model runs in train mode (each BN normalises with its batch statistics, as during
    training) in batches of ``batch_size`` (see :func:`batch_bounds`) without gradients, so the
    sums over several clients equal those over their union when each client's data is a whole
    number of batches. Its running buffers and every module's train/eval flag
    (:func:`fedlmc.capture.forward_capture`) are restored afterwards, and its parameters are
    untouched.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    layers = batchnorm_layers(model)
    sums: dict[str, list] = {name: [0.0, 0.0, 0] for name in layers}
    saved = {
        name: {k: b.clone() for k, b in m.named_buffers(recurse=False)}
        for name, m in layers.items()
    }

    def make_hook(name: str) -> Callable:
        def hook(_module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
            s1, s2, n = _channel_moments(inputs[0])
            acc = sums[name]
            acc[0], acc[1], acc[2] = acc[0] + s1, acc[1] + s2, acc[2] + n

        return hook

    hooks = {name: make_hook(name) for name in layers}
    try:
        with forward_capture(model, hooks, kind="input", training=True) as forward:
            for start, stop in batch_bounds(len(x), batch_size):
                forward(x[start:stop])
    finally:
        for name, m in layers.items():
            for key, value in saved[name].items():
                getattr(m, key).copy_(value)
    return {
        name: BNStats(
            torch.as_tensor(s1, dtype=torch.float64), torch.as_tensor(s2, dtype=torch.float64), n
        )
        for name, (s1, s2, n) in sums.items()
    }


def combine_bn_statistics(stats: Sequence[Mapping[str, BNStats]]) -> dict[str, BNStats]:
    """Sum per layer of the clients' BN statistics (all clients must report the same layers)."""
    if len(stats) == 0:
        raise ValueError("combine_bn_statistics needs at least one client, got none")
    names = set(stats[0])
    for index, client in enumerate(stats):
        if set(client) != names:
            bad = sorted(set(client) ^ names)[0]
            raise ValueError(f"client {index} and client 0 differ in BN layer {bad!r}")
    return {
        name: BNStats(
            sum=sum((client[name].sum for client in stats), torch.zeros(())),
            sum_sq=sum((client[name].sum_sq for client in stats), torch.zeros(())),
            count=sum(int(client[name].count) for client in stats),
        )
        for name in stats[0]
    }


@torch.no_grad()
def apply_bn_statistics(model: nn.Module, stats: Mapping[str, BNStats]) -> nn.Module:
    r"""Set each BN layer's ``running_mean = S1/n`` and ``running_var = (S2 - S1^2/n)/(n-1)``.

    Modifies ``model`` in place and returns it. Every BN layer of the model must be in ``stats``
    with a count of at least 2.
    """
    for name, module in batchnorm_layers(model).items():
        if name not in stats:
            raise ValueError(f"no BN statistics for layer {name!r}")
        st = stats[name]
        if st.count < 2:
            raise ValueError(f"BN layer {name!r} needs count >= 2 for a variance, got {st.count}")
        mean = st.sum / st.count
        var = ((st.sum_sq - st.sum * mean) / (st.count - 1)).clamp_min(0.0)
        module.running_mean.copy_(mean.to(module.running_mean))
        module.running_var.copy_(var.to(module.running_var))
    return model


def reset_bn_stats(
    model: nn.Module, data: Tensor | tuple[Tensor, Tensor], batch_size: int = 256
) -> nn.Module:
    """Re-estimate BN running statistics on ``data`` (``x`` or ``(x, y)``) in place; returns it."""
    x = data[0] if isinstance(data, tuple | list) else data
    if not has_batchnorm(model):
        return model
    return apply_bn_statistics(model, bn_statistics(model, x, batch_size=batch_size))
