r"""REPAIR (Jordan et al., ICLR 2023): renormalise the merged model's hidden units.

Averaging the weights of models :math:`\theta_i` (weights :math:`w_i`, summing to 1) shrinks the
variance of the hidden units ("variance collapse"). REPAIR restores, for every hidden unit ``c``
of every repaired layer, the statistics of its pre-activation :math:`z_c` (the output of the
Linear/Conv, before norm and ReLU; conv outputs: every spatial position is a sample) over data to
the interpolation of the endpoints' statistics,

.. math:: \mu_t = \sum_i w_i \mu_i, \qquad \sigma_t = \sum_i w_i \sigma_i,

by a per-unit affine change of the merged layer: with the merged model's measured
:math:`\mu_m, \sigma_m` and :math:`s = \sigma_t / \sigma_m`,

.. math:: W'_c = s\, W_c, \qquad b'_c = s\,(b_c - \mu_m) + \mu_t,

so that :math:`z'_c = s (z_c - \mu_m) + \mu_t` has mean :math:`\mu_t` and std :math:`\sigma_t`.
Standard deviations are population ones (divide by the count). Choices made here:

- **Bias-free layers are refused** (:func:`bias_free_layer`): the mean is set through the
  bias, and a bias is never added (the architecture stays the same). Without the mean reset
  what is left, :math:`z'_c = s z_c`, is RESCALE (:mod:`fedlmc.merging.baselines.rescale`), not
  REPAIR: an earlier version did exactly that under REPAIR's name, equal to RESCALE by construction.
- **Constant units** (:math:`\sigma_m \le 10^{-6} \sqrt{\mathrm{mean}(z_c^2)}`, e.g. dead or
  zero units) keep their weights (:math:`s = 1`); only their mean is moved.
- **Layers** default to every Linear/Conv except the output layer (:func:`repair_layers`), and
  are corrected in depth order (``named_modules`` order), each measured after the earlier ones
  were corrected.
- **BatchNorm** models are refused: for them REPAIR reduces to re-estimating the running
  statistics of the merged model (:func:`fedlmc.merging.calibrate.reset_bn_stats`).

Federated use: :func:`unit_statistics` returns per-unit sums (:class:`UnitStats`) that add up
exactly across data shards (:func:`combine_unit_statistics`), so clients return them and the
server sums them. :func:`repair_with_statistics` drives REPAIR through a callback
``statistics_fn(model, layers)`` returning the combined sums over all clients; it makes
``N + L`` calls for ``N`` endpoints and ``L`` layers: the ``N`` endpoint calls are independent
(one round can serve them all, and the first layer's call too), then one call per further layer,
since a layer's statistics depend on the corrections of the layers before it through the ReLUs.
That is ``L`` rounds in all. :func:`repair` is the server-side version on data ``x``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from fedlmc.averaging import normalised_weights
from fedlmc.capture import StopForward, forward_capture, linear_layers
from fedlmc.merging.calibrate import has_batchnorm

CONSTANT_UNIT_TOLERANCE = 1e-6
"""A unit whose std is at most this fraction of its root mean square counts as constant."""


@dataclass(frozen=True)
class UnitStats:
    r"""Per-unit :math:`\sum z`, :math:`\sum z^2` (float64, CPU) and the samples per unit."""

    sum: Tensor
    sum_sq: Tensor
    count: int

    @property
    def mean(self) -> Tensor:
        r""":math:`\mu = S_1 / n`."""
        return self.sum / self.count

    @property
    def std(self) -> Tensor:
        r"""Population std :math:`\sigma = \sqrt{\max(S_2/n - \mu^2, 0)}`."""
        return (self.sum_sq / self.count - self.mean**2).clamp_min(0.0).sqrt()

    @property
    def rms(self) -> Tensor:
        r"""Root mean square :math:`\sqrt{S_2 / n}`."""
        return (self.sum_sq / self.count).sqrt()

    def __add__(self, other: UnitStats) -> UnitStats:
        if self.sum.shape != other.sum.shape:
            raise ValueError(
                f"cannot add statistics of {other.sum.numel()} units to {self.sum.numel()} units"
            )
        return UnitStats(self.sum + other.sum, self.sum_sq + other.sum_sq, self.count + other.count)


class Target(NamedTuple):
    """Per-unit target mean and std of a layer's pre-activations."""

    mean: Tensor
    std: Tensor


StatisticsFn = Callable[[nn.Module, list[str]], Mapping[str, UnitStats]]


# ----------------------------------------------------------------------------- layers


def output_layer(model: nn.Module) -> str:
    """The module whose output is the logits: ``model.layer_names[-1]`` for the built-in models,
    else the last Linear/Conv in ``named_modules`` order."""
    names = list(getattr(model, "layer_names", []))
    if names:
        return names[-1]
    layers = list(linear_layers(model))
    if not layers:
        raise ValueError(f"model {type(model).__name__!r} has no Linear/Conv layer")
    return layers[-1]


def repair_layers(model: nn.Module) -> list[str]:
    """Every Linear/Conv of ``model`` except the output layer, in ``named_modules`` order.

    For the built-in models: the MLP's hidden linears, VGG's convs, ResNet-20's stem, conv1,
    conv2 and shortcut convs (the modules whose outputs are the hidden units' pre-activations).
    """
    head = output_layer(model)
    return [name for name in linear_layers(model) if name != head]


def bias_free_layer(model: nn.Module, layers: Sequence[str] | None = None) -> str | None:
    """The first of ``layers`` (default :func:`repair_layers`) that has no bias, so that REPAIR
    cannot set its units' mean; ``None`` when every one has a bias."""
    modules = dict(model.named_modules())
    names = checked_layers(model, layers)
    return next((n for n in names if getattr(modules[n], "bias", None) is None), None)


def bias_free_refusal(layer: str) -> str:
    """The one line refusing REPAIR of a model whose ``layer`` has no bias."""
    return (
        f"REPAIR (Jordan et al. 2023) sets each hidden unit's mean through its bias, and layer "
        f"{layer!r} has none; allowed: a model with biases (bias = true); for the std alone use "
        "RESCALE (average_rescale, weight_matching_rescale)"
    )


def checked_layers(model: nn.Module, layers: Sequence[str] | None) -> list[str]:
    """``layers`` (default :func:`repair_layers`) validated and put in ``named_modules`` order."""
    if layers is None:
        return repair_layers(model)
    allowed = list(linear_layers(model))
    for name in layers:
        if name not in allowed:
            raise ValueError(
                f"layer {name!r} is not a Linear/Conv of the model; allowed: {allowed}"
            )
    if len(set(layers)) != len(layers):
        raise ValueError(f"layers must be distinct, got {list(layers)}")
    return [name for name in allowed if name in set(layers)]


# ----------------------------------------------------------------------------- statistics


def _unit_moments(output: Tensor, channel_dim: int) -> tuple[Tensor, Tensor, int]:
    """Per-unit sum and sum of squares (float64, CPU) over every other dim, and the count."""
    z = output.detach().double().movedim(channel_dim, -1)
    z = z.reshape(-1, z.shape[-1])
    return z.sum(0).cpu(), (z * z).sum(0).cpu(), z.shape[0]


def unit_statistics(
    model: nn.Module, x: Tensor, layers: Sequence[str] | None = None, batch_size: int = 1024
) -> dict[str, UnitStats]:
    r"""Per-unit :math:`\sum z`, :math:`\sum z^2` and count of each layer's output over ``x``.

    ``layers`` are Linear/Conv modules (default :func:`repair_layers`); units are the last dim of
    a Linear output and dim 1 of a Conv output (spatial positions are samples). The model runs in
    eval mode in batches of ``batch_size``, each forward pass stopped once every layer has fired
    (:func:`fedlmc.capture.forward_capture`, which restores every module's mode). Sums over data
    shards equal the sums over their union.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    names = checked_layers(model, layers)
    modules = dict(model.named_modules())
    sums: dict[str, UnitStats | None] = dict.fromkeys(names)
    fired: set[str] = set()

    def make_hook(name: str) -> Callable:
        channel_dim = -1 if isinstance(modules[name], nn.Linear) else 1

        def hook(_module: nn.Module, _inputs: tuple, output: Tensor) -> None:
            stats = UnitStats(*_unit_moments(output, channel_dim))
            sums[name] = stats if sums[name] is None else sums[name] + stats
            fired.add(name)
            if len(fired) == len(names):
                raise StopForward

        return hook

    hooks = {name: make_hook(name) for name in names}
    with forward_capture(model, hooks) as forward:
        for start in range(0, len(x), batch_size):
            fired.clear()
            forward(x[start : start + batch_size])
    missing = [name for name, stats in sums.items() if stats is None]
    if missing:
        raise ValueError(f"layer {missing[0]!r} saw no data (x has {len(x)} samples)")
    return dict(sums)


def combine_unit_statistics(stats: Sequence[Mapping[str, UnitStats]]) -> dict[str, UnitStats]:
    """Sum per layer of the clients' :class:`UnitStats` (all must report the same layers)."""
    if len(stats) == 0:
        raise ValueError("combine_unit_statistics needs at least one client, got none")
    names = list(stats[0])
    for index, client in enumerate(stats):
        if set(client) != set(names):
            bad = sorted(set(client) ^ set(names))[0]
            raise ValueError(f"client {index} and client 0 differ in layer {bad!r}")
    combined = {}
    for name in names:
        total = stats[0][name]
        for client in stats[1:]:
            total = total + client[name]
        combined[name] = total
    return combined


def repair_targets(
    endpoint_stats: Sequence[Mapping[str, UnitStats]], weights: Sequence[float] | None = None
) -> dict[str, Target]:
    r"""Per layer :math:`\mu_t = \sum_i w_i \mu_i`, :math:`\sigma_t = \sum_i w_i \sigma_i`.

    ``endpoint_stats[i]`` are model :math:`i`'s statistics (over all the data); ``weights`` are
    normalised to sum to 1 (``None``: uniform). Every endpoint must report the same layers.
    """
    if len(endpoint_stats) == 0:
        raise ValueError("repair_targets needs at least one endpoint, got none")
    w = normalised_weights(weights, len(endpoint_stats))
    names = list(endpoint_stats[0])
    for index, stats in enumerate(endpoint_stats):
        if set(stats) != set(names):
            bad = sorted(set(stats) ^ set(names))[0]
            raise ValueError(f"endpoint {index} and endpoint 0 differ in layer {bad!r}")
    targets = {}
    for name in names:
        units = endpoint_stats[0][name].sum.shape
        if any(stats[name].sum.shape != units for stats in endpoint_stats):
            raise ValueError(f"endpoints differ in the number of units of layer {name!r}")
        mean = sum(wi * stats[name].mean for wi, stats in zip(w, endpoint_stats, strict=True))
        std = sum(wi * stats[name].std for wi, stats in zip(w, endpoint_stats, strict=True))
        targets[name] = Target(mean, std)
    return targets


# ----------------------------------------------------------------------------- correction


@torch.no_grad()
def rescale_units(module: nn.Module, measured: UnitStats, target: Target) -> None:
    r"""In place: :math:`W'_c = s W_c`, :math:`b'_c = s (b_c - \mu_m) + \mu_t`, :math:`s =
    \sigma_t / \sigma_m` per output unit ``c`` (constant units: see the module docstring);
    ``ValueError`` for a layer without a bias."""
    weight, bias = module.weight, getattr(module, "bias", None)
    if bias is None:
        raise ValueError(
            f"REPAIR needs the layer's bias to set its units' mean; this "
            f"{type(module).__name__} has none"
        )
    if measured.sum.numel() != weight.shape[0] or target.mean.numel() != weight.shape[0]:
        raise ValueError(
            f"statistics of {measured.sum.numel()} units for a layer with {weight.shape[0]} units"
        )
    sigma_m = measured.std
    varying = sigma_m > CONSTANT_UNIT_TOLERANCE * measured.rms
    scale = torch.where(varying, target.std / torch.where(varying, sigma_m, 1.0), 1.0)
    shape = (-1,) + (1,) * (weight.ndim - 1)
    weight.mul_(scale.to(weight).reshape(shape))
    new_bias = scale * (bias.detach().double().cpu() - measured.mean) + target.mean
    bias.copy_(new_bias.to(bias))


def _check_no_batchnorm(model: nn.Module) -> None:
    if has_batchnorm(model):
        raise ValueError(
            "model has BatchNorm layers; REPAIR for them is re-estimating the running "
            "statistics: use fedlmc.merging.calibrate.reset_bn_stats"
        )


def repair_with_statistics(
    merged_model: nn.Module,
    endpoint_models: Sequence[nn.Module],
    weights: Sequence[float] | None,
    statistics_fn: StatisticsFn,
    layers: Sequence[str] | None = None,
) -> nn.Module:
    r"""REPAIR driven by ``statistics_fn(model, layers) -> {layer: UnitStats}`` (federated).

    ``statistics_fn`` returns the statistics of ``model``'s ``layers`` summed over all the data
    (e.g. over all clients, :func:`combine_unit_statistics` of their :func:`unit_statistics`).
    It is called once per endpoint with every layer (targets :func:`repair_targets`), then once
    per layer, in depth order, on the partly repaired copy of ``merged_model`` with that layer
    only: ``N + L`` calls, ``L`` rounds (module docstring). Returns the repaired copy;
    ``merged_model`` and the endpoints are not modified. ``ValueError``, before any call, for
    BatchNorm models and for a layer without a bias (:func:`bias_free_layer`).
    """
    _check_no_batchnorm(merged_model)
    names = checked_layers(merged_model, layers)
    bias_free = bias_free_layer(merged_model, names)
    if bias_free is not None:
        raise ValueError(bias_free_refusal(bias_free))
    if len(endpoint_models) == 0:
        raise ValueError("repair needs at least one endpoint model, got none")
    w = normalised_weights(weights, len(endpoint_models))
    targets = repair_targets([statistics_fn(m, list(names)) for m in endpoint_models], w)
    repaired = copy.deepcopy(merged_model)
    modules = dict(repaired.named_modules())
    for name in names:
        measured = statistics_fn(repaired, [name])
        if name not in measured or name not in targets:
            raise ValueError(f"statistics_fn returned no statistics for layer {name!r}")
        rescale_units(modules[name], measured[name], targets[name])
    return repaired


def repair(
    merged_model: nn.Module,
    endpoint_models: Sequence[nn.Module],
    weights: Sequence[float] | None,
    x: Tensor,
    layers: Sequence[str] | None = None,
    batch_size: int = 1024,
) -> nn.Module:
    """REPAIR on server data ``x``: :func:`repair_with_statistics` with :func:`unit_statistics`.

    Returns a repaired copy of ``merged_model`` (``weights`` normalised, ``None``: uniform).
    """

    def statistics_fn(model: nn.Module, names: list[str]) -> dict[str, UnitStats]:
        return unit_statistics(model, x, names, batch_size=batch_size)

    return repair_with_statistics(merged_model, endpoint_models, weights, statistics_fn, layers)
