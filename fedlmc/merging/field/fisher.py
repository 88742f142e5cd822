r"""Fisher merging (Matena and Raffel, "Merging Models with Fisher-Weighted Averaging", NeurIPS
2022; in one-shot federated learning: FedFisher, Jhunjhunwala et al., AISTATS 2024).

Each client :math:`i` computes the diagonal **empirical Fisher** of its own model on its own
training data: over :math:`m_i \le` ``fisher-samples`` of its examples (a seeded subset),

.. math:: F_i[k] = \frac{1}{m_i} \sum_{n=1}^{m_i}
    \Big(\frac{\partial}{\partial \theta[k]} \log p_{\theta_i}(y_n \mid x_n)\Big)^2

for every parameter entry :math:`k` (:func:`fisher_diagonal`: per-sample gradients by
``torch.func``, ``vmap`` of ``grad`` over a batch, in one batched pass per chunk). :math:`y_n` is
the data's label (the empirical Fisher, ``labels = "data"``, our default) or a label drawn from the
model's own predictive distribution (``labels = "sampled"``, seeded: the Monte-Carlo estimate of
the Fisher Matena and Raffel compute exactly as the expectation over the classes).

The merge normalises each client's Fisher to unit L2 norm over all its entries,
:math:`\hat F_i = F_i / \|F_i\|_2` (both reference implementations do by default: Matena and
Raffel's ``normalize_fishers``, FusionBench's ``normalize_fisher_weight``), adds a floor
:math:`\varepsilon` (FusionBench adds its ``minimal_fisher_weight`` to every Fisher, Matena and
Raffel floor at their ``fisher_floor``) and averages every entry with those weights,

.. math:: \bar\theta[k] = \frac{\sum_i w_i\, u_i[k]\, \theta_i[k]}{\sum_i w_i\, u_i[k]},
    \qquad u_i[k] = \frac{\hat F_i[k] + \varepsilon}{1 + \varepsilon},

:math:`w_i` the clients' weights (:func:`fisher_merge`). An entry no client's data moves gets
the plain weighted average; buffers (BatchNorm statistics: no gradient) have :math:`u = 1`, the
plain average. :math:`\varepsilon` (``fisher-epsilon``, default 1e-6) is relative to a
unit-norm Fisher (theirs are absolute, 1e-6 on an un-normalised Fisher); the division
:math:`1 + \varepsilon` keeps :math:`u \le 1`, which the secure form needs and the ratio does
not see.

**Sum form** (secure aggregation). Both sums are sums over clients of what each client computes
alone: client :math:`i` sends :math:`u_i \odot \theta_i` (within :math:`|\theta_i|`) and
:math:`c\, u_i` (in :math:`(0, c]`, :math:`c` the clipping range) in one secure round
(:func:`fisher_parts`); the server divides the two means (:func:`fisher_from_means`). The
quantisation bound is :func:`fisher_error_bound`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

StateDict = dict[str, Tensor]

__all__ = [
    "bounded_sample",
    "statistics_seed",
    "fisher_diagonal",
    "fisher_error_bound",
    "fisher_from_means",
    "fisher_merge",
    "fisher_parts",
    "fisher_weights",
]

GRADIENT_BUDGET = 2**26
"""Per-sample gradient entries one chunk holds at most (256 MiB of float32)."""


def statistics_seed(seed: int, client: int) -> int:
    """The 31-bit seed of client ``client``'s statistics sample (and sampled labels), derived
    from ``(seed, client)`` (the ClientApp's per-partition seed of round 0)."""
    import numpy as np

    entropy = [int(seed), int(client), 0]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] % (2**31 - 1))


def bounded_sample(x: Tensor, y: Tensor | None, samples: int, seed: int):
    """At most ``samples`` examples of ``(x, y)``: all of them when there are that few, else a
    subset drawn without replacement with ``seed`` (the first examples of a partition may be
    ordered by class). ``y`` may be ``None`` (inputs only)."""
    if samples < 1:
        raise ValueError(f"samples = {samples}: allowed: at least 1")
    if len(x) <= samples:
        return x, y
    generator = torch.Generator().manual_seed(int(seed))
    index = torch.randperm(len(x), generator=generator)[:samples].sort().values
    return x[index], (None if y is None else y[index])


def _labels(model: nn.Module, x: Tensor, y: Tensor, labels: str, seed: int) -> Tensor:
    """The labels the log-likelihood is taken of: ``y``, or one draw per input from the
    model's softmax (seeded)."""
    if labels == "data":
        return y
    if labels != "sampled":
        raise ValueError(f"labels = {labels!r}: allowed: data, sampled")
    with torch.no_grad():
        probs = torch.softmax(model(x).double(), dim=1)
    generator = torch.Generator().manual_seed(int(seed))
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(1).to(y.device)


def fisher_diagonal(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    labels: str = "data",
    seed: int = 0,
    chunk: int | None = None,
) -> StateDict:
    r""":math:`F[k] = \frac1m \sum_n (\partial_k \log p(y_n|x_n))^2` for every parameter of
    ``model`` (eval mode: BatchNorm uses its running statistics) on the ``m`` examples given, in
    float32 on the CPU, keyed like ``model.state_dict()``. Per-sample gradients come from
    ``torch.func.vmap(torch.func.grad(...))`` over chunks of ``chunk`` examples (default: as
    many as :data:`GRADIENT_BUDGET` entries allow)."""
    from torch.func import functional_call, grad, vmap

    if len(x) == 0:
        raise ValueError("the Fisher needs at least one example, got none")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    size = sum(p.numel() for p in params.values())
    step = chunk or max(1, GRADIENT_BUDGET // max(size, 1))
    target = _labels(model, x, y, labels, seed)

    def log_likelihood(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        out = functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return torch.log_softmax(out, dim=1).squeeze(0).gather(0, yi.reshape(1)).squeeze(0)

    per_sample = vmap(grad(log_likelihood), in_dims=(None, 0, 0))
    total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in params.items()}
    for start in range(0, len(x), step):
        grads = per_sample(params, x[start : start + step], target[start : start + step])
        for key, g in grads.items():
            total[key] += g.double().square().sum(dim=0)
    model.train(was_training)
    return {k: (v / len(x)).float().cpu() for k, v in total.items()}


def fisher_weights(
    state: Mapping[str, Tensor], fisher: Mapping[str, Tensor], epsilon: float
) -> StateDict:
    r"""Per floating-point key of ``state``, :math:`u = (\hat F + \varepsilon) / (1 +
    \varepsilon)` with :math:`\hat F = F / \|F\|_2` (the norm over every entry of ``fisher``;
    a zero Fisher stays zero), float64; 1 on the keys ``fisher`` lacks (buffers)."""
    if not epsilon > 0:
        raise ValueError(f"fisher epsilon = {epsilon}: allowed: > 0")
    norm = math.sqrt(sum(float(f.double().square().sum()) for f in fisher.values()))
    scale = 1.0 / norm if norm > 0 else 0.0
    weights = {}
    for key, value in state.items():
        if not value.is_floating_point():
            continue
        if key in fisher:
            normalised = fisher[key].double() * scale
            weights[key] = (normalised + epsilon) / (1.0 + epsilon)
        else:
            weights[key] = torch.ones(value.shape, dtype=torch.float64)
    return weights


def fisher_merge(
    states: Sequence[Mapping[str, Tensor]],
    fishers: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    epsilon: float,
) -> StateDict:
    r""":math:`\sum_i w_i u_i \theta_i / \sum_i w_i u_i` per entry (see the module docstring),
    in float64, cast back to each key's dtype; integer buffers as the plain average takes them
    (their maximum). ``weights`` are normalised here. The same parts and division as the
    secure form (:func:`fisher_parts`, :func:`fisher_from_means`), unscaled."""
    from fedlmc.merging.sum_form import clear_sums_merge

    return clear_sums_merge(
        states,
        fishers,
        weights,
        "Fisher diagonals",
        lambda state, fisher: fisher_parts(state, fisher, 1.0, epsilon),
        lambda values, masses: fisher_from_means(values, masses, 1.0),
    )


def fisher_parts(
    state: Mapping[str, Tensor],
    fisher: Mapping[str, Tensor],
    clipping_range: float,
    epsilon: float,
    weight_range: float | None = None,
) -> tuple[StateDict, StateDict]:
    r"""What one client sends in the secure round: :math:`u \odot \theta \cdot c/b` and
    :math:`c\, u` (floating-point keys, float64), both within :math:`[-c, c]`: :math:`b` =
    ``weight_range`` bounds the weights, so the values use the whole clipping range (the
    quantisation's resolution relative to the weights is :math:`c/b` times finer);
    ``ValueError`` naming the key and the value when a weight lies beyond :math:`b`. Without
    ``weight_range``, :math:`b = c` and nothing is checked (the clear merge's parts)."""
    bound = clipping_range if weight_range is None else float(weight_range)
    u = fisher_weights(state, fisher, epsilon)
    for key in u if weight_range is not None else ():
        largest = float(state[key].abs().max()) if state[key].numel() else 0.0
        if not largest <= bound:
            raise ValueError(
                f"{key!r} holds {largest:.6g}, beyond the weight range {bound:g} of the secure "
                "Fisher merge (8x the initial model's largest |weight|); allowed: |weight| <= "
                f"{bound:g}, or secagg-clipping-range set (it then bounds the weights)"
            )
    values = {k: u[k] * state[k].double() * (clipping_range / bound) for k in u}
    masses = {k: u[k] * clipping_range for k in u}
    return values, masses


def fisher_from_means(
    values: Mapping[str, Tensor],
    masses: Mapping[str, Tensor],
    clipping_range: float,
    weight_range: float | None = None,
) -> StateDict:
    r"""The Fisher merge from the secure means of :func:`fisher_parts`:
    :math:`b\,\overline{u\theta c/b} / \overline{c\,u}` per entry (float64)."""
    bound = clipping_range if weight_range is None else float(weight_range)
    return {k: bound * values[k].double() / masses[k].double().clamp_min(1e-300) for k in values}


def fisher_error_bound(
    entry_error: float, clipping_range: float, epsilon: float, weight_range: float | None = None
) -> float:
    r"""The largest difference of a securely merged value from the clear Fisher merge when each
    entry of a secure mean is off by at most :math:`\delta` = ``entry_error`` (:math:`3Nc/(QS)`
    for :math:`N` clients, clipping range :math:`c`, :math:`Q` levels and summed shares
    :math:`S`: one level :math:`2c/Q` per client and the shares' rounding, as the plain
    average's bound), the weights within :math:`b` = ``weight_range`` (default :math:`c`):

    .. math::

        |\varepsilon_F| \le \frac{2\,\delta\, b/c}{\varepsilon/(1+\varepsilon) - \delta/c}.

    The values are sent times :math:`c/b` and the masses times :math:`c`, so their means, in
    their own units, are off by :math:`|\alpha| \le \delta b/c` and :math:`|\beta| \le
    \delta/c`. With :math:`A = \sum_i w_i u_i\theta_i`, :math:`B = \sum_i w_i u_i \ge
    \varepsilon/(1+\varepsilon)` and :math:`|A/B| \le b` (a convex combination of the clients'
    weights), :math:`|\hat A/\hat B - A/B| \le (|\alpha| + |A/B|\,|\beta|)/(B - |\beta|)`.
    Infinite when :math:`\delta/c` reaches the floor (the quantisation cannot tell an entry's
    mass from 0)."""
    bound = clipping_range if weight_range is None else float(weight_range)
    floor = epsilon / (1.0 + epsilon)
    resolution = entry_error / clipping_range
    if not floor > resolution:
        return math.inf
    return 2.0 * resolution * bound / (floor - resolution)
