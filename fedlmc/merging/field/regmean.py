r"""RegMean (Jin, Ren, Preotiuc-Pietro, Cheng, "Dataless Knowledge Fusion by Merging Weights of
Language Models", ICLR 2023): every linear layer merged by the least-squares fit of the clients'
outputs on their own inputs.

For a linear layer :math:`y = W x` (PyTorch's weight :math:`W` is ``out x in``) and client
:math:`i`'s layer inputs :math:`X_i` (``m_i x in``, :math:`m_i \le` ``regmean-samples`` of its
training examples, a seeded subset), the Gram matrix of the inputs is
:math:`G_i = X_i^\top X_i / m_i` (:func:`gram_matrices`: one batched forward pass with pre-hooks
on the layers). RegMean minimises :math:`\sum_i w_i \|X_i W^\top - X_i W_i^\top\|^2 / m_i`:

.. math:: W^\top = \Big(\sum_i w_i \tilde G_i + \lambda I\Big)^{-1}
    \Big(\sum_i w_i \tilde G_i W_i^\top + \lambda \sum_i w_i W_i^\top\Big), \qquad
    \tilde G_i = \alpha\, G_i + (1 - \alpha)\,\mathrm{diag}(G_i),

(:func:`regmean_solution`), with :math:`w_i` the clients' weights (at equal counts the paper's
unweighted sum of per-model mean Grams, as its code and FusionBench compute them).

- :math:`\alpha`: the paper's reduction of the non-diagonal entries (their code's
  ``regmean_reduce_nondiag``, FusionBench's ``reduce_non_diagonal_ratio``); the default
  (``regmean-alpha``) is FusionBench's for CLIP, 0.6 (their code's default leaves :math:`G` as
  it is, :math:`\alpha = 1`, which fails whenever a client has fewer samples than a layer has
  inputs: :math:`G` is then singular; FusionBench's base default is 0.1).
- :math:`\lambda = \rho\,\mathrm{tr}(\sum_i w_i \tilde G_i) / d_{in}` (:math:`\rho` = 1e-4,
  ours): the paper inverts the sum as it is, which fails when an input never varies (a dead
  unit: a zero row and column); the ridge pulls only such directions to the plain
  average, and makes RegMean of identical clients that client.
- Layers: every ``nn.Linear`` of the model, the output layer included (the models share their
  label space; the reference code merges every linear module its ``exclude_param_regex``, empty
  by default, does not exclude). Biases, norms, convolutions and every other key: the plain
  weighted average (their code averages what RegMean does not cover; convolutions would need
  the unfolded inputs, :math:`(C k^2)^2` entries per layer: left to the average here).

**Sum form** (secure aggregation). Every sum is over the clients of what each computes alone:
client :math:`i` sends its weights, :math:`\tilde G_i` and :math:`\tilde G_i W_i^\top` per
layer in one secure round (:func:`regmean_parts`), the statistics scaled by :math:`c/R` into the
clipping range (:math:`R` = ``secagg-statistics-range``); the server solves from the three
means (:func:`regmean_from_means`; bound :func:`regmean_error_bound`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

StateDict = dict[str, Tensor]

__all__ = [
    "gram_matrices",
    "reduced_gram",
    "regmean_error_bound",
    "regmean_from_means",
    "regmean_layers",
    "regmean_merge",
    "regmean_parts",
    "regmean_solution",
    "solution_growth",
]


def regmean_layers(model: nn.Module) -> list[str]:
    """The ``nn.Linear`` modules of ``model`` (``named_modules`` order): the layers RegMean
    merges."""
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def gram_matrices(model: nn.Module, x: Tensor, layers: Sequence[str]) -> dict[str, Tensor]:
    r""":math:`G = X^\top X / m` of each layer's inputs over the ``m`` inputs ``x`` (eval mode,
    batches of 1024, accumulated in float64), float32 on the CPU."""
    from fedlmc.capture import forward_capture

    if len(x) == 0:
        raise ValueError("the Gram matrices need at least one example, got none")
    sums: dict[str, Tensor] = {}

    def hook_of(name: str):
        def hook(_module, inputs):
            flat = inputs[0].detach().double().reshape(-1, inputs[0].shape[-1])
            sums[name] = sums.get(name, 0) + flat.T @ flat

        return hook

    with forward_capture(model, {n: hook_of(n) for n in layers}, kind="input") as forward:
        for start in range(0, len(x), 1024):
            forward(x[start : start + 1024])
    return {name: (sums[name] / len(x)).float().cpu() for name in layers}


def reduced_gram(gram: Tensor, alpha: float) -> Tensor:
    r""":math:`\alpha G + (1 - \alpha)\,\mathrm{diag}(G)` (float64): the non-diagonal entries
    scaled by :math:`\alpha`."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"regmean alpha = {alpha}: allowed: 0 <= alpha <= 1")
    g = gram.double()
    return alpha * g + (1 - alpha) * torch.diag(torch.diagonal(g))


def regmean_solution(
    gram_sum: Tensor, product_sum: Tensor, weight_sum: Tensor, ridge: float
) -> Tensor:
    r"""The merged weight (``out x in``) from :math:`\sum_i w_i \tilde G_i` (``gram_sum``),
    :math:`\sum_i w_i \tilde G_i W_i^\top` (``product_sum``) and :math:`\sum_i w_i W_i^\top`
    (``weight_sum``): :math:`(\sum \tilde G + \lambda I)^{-1}(\sum \tilde G W^\top + \lambda
    \sum W^\top)`, transposed, in float64."""
    if not ridge > 0:
        raise ValueError(f"regmean ridge = {ridge}: allowed: > 0")
    g = gram_sum.double()
    size = g.shape[0]
    lam = ridge * max(float(torch.diagonal(g).mean()), 1e-12)
    system = g + lam * torch.eye(size, dtype=torch.float64)
    rhs = product_sum.double() + lam * weight_sum.double()
    return torch.linalg.solve(system, rhs).T


def regmean_merge(
    states: Sequence[Mapping[str, Tensor]],
    grams: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    alpha: float,
    ridge: float,
) -> StateDict:
    """RegMean of ``states`` (see the module docstring): every layer of ``grams`` (client ->
    layer -> Gram matrix) solved, every other key the plain weighted average; the same parts
    and solve as the secure form (:func:`regmean_parts`, :func:`regmean_from_means`),
    unscaled."""
    from fedlmc.merging.sum_form import clear_sums_merge

    return clear_sums_merge(
        states,
        grams,
        weights,
        "sets of Gram matrices",
        lambda state, gram: regmean_parts(state, gram, alpha, 1.0),
        lambda *means: regmean_from_means(*means, 1.0, ridge),
    )


def solution_growth(
    merged: Mapping[str, Tensor], states: Sequence[Mapping[str, Tensor]], layers: Sequence[str]
) -> dict[str, float]:
    r"""Per layer, :math:`\|W\|_F / \max_i \|W_i\|_F`: the merged weight's norm against the
    largest of the clients' (0 when every client's is 0). With positive semi-definite Grams the
    solve is a matrix-weighted average of the clients' weights; it grows far past them only
    where the summed Gram is nearly singular along a direction some client's Gram weights
    differently (a Gram crafted to blow the solution up)."""
    growth = {}
    for layer in layers:
        key = f"{layer}.weight"
        largest = max(_norm(sd[key]) for sd in states)
        norm = _norm(merged[key])
        growth[layer] = norm / largest if largest > 0 else (math.inf if norm > 0 else 0.0)
    return growth


def _norm(tensor: Tensor) -> float:
    """The Frobenius norm, accumulated in float64 (no float64 copy)."""
    return float(torch.linalg.vector_norm(tensor, dtype=torch.float64))


def regmean_parts(
    state: Mapping[str, Tensor],
    grams: Mapping[str, Tensor],
    alpha: float,
    scale: float,
) -> tuple[StateDict, StateDict, StateDict]:
    r"""What one client sends in the secure round: its floating-point weights, and per layer
    :math:`\tilde G` and :math:`\tilde G W^\top` times ``scale`` (:math:`c/R`), float64."""
    weights = {k: v.double() for k, v in state.items() if v.is_floating_point()}
    reduced = {layer: reduced_gram(g, alpha) for layer, g in grams.items()}
    gram_part = {layer: g * scale for layer, g in reduced.items()}
    product_part = {
        layer: (g @ state[f"{layer}.weight"].double().T) * scale for layer, g in reduced.items()
    }
    return weights, gram_part, product_part


def regmean_from_means(
    weights: Mapping[str, Tensor],
    grams: Mapping[str, Tensor],
    products: Mapping[str, Tensor],
    scale: float,
    ridge: float,
) -> StateDict:
    """The RegMean merge from the secure means of :func:`regmean_parts` (float64): each layer
    solved, every other key the mean of the weights."""
    merged = {k: v.double() for k, v in weights.items()}
    for layer, gram in grams.items():
        key = f"{layer}.weight"
        merged[key] = regmean_solution(
            gram.double() / scale, products[layer].double() / scale, merged[key].T, ridge
        )
    return merged


def regmean_error_bound(
    grams: Mapping[str, Tensor],
    merged: Mapping[str, Tensor],
    delta_weights: float,
    delta_statistics: float,
    ridge: float,
) -> float:
    r"""A bound on the largest difference of a securely merged RegMean weight from the clear
    rule, from what the server holds after the round: the summed Gram matrices ``grams`` (in
    their own units), the merge ``merged`` and the largest error of one entry of a secure mean
    of the weights (``delta_weights``) and of the statistics (``delta_statistics``, both
    :math:`3Nc/(QS)` in the units sent, the statistics' divided by :math:`c/R`).

    With :math:`M = \sum w \tilde G + \lambda I` and :math:`B = \sum w\tilde G W^\top +
    \lambda\sum w W^\top` the clear system :math:`MW^\top = B` and :math:`\hat M = M + E_M`,
    :math:`\hat B = B + E_B` the secure one, :math:`\hat W^\top - W^\top = \hat M^{-1}(E_B - E_M
    W^\top)`, so

    .. math:: \|\hat W - W\|_2 \le \frac{s\,(e_B + e_M \|\hat W\|_2)}{1 - s\, e_M},
        \qquad s = \|\hat M^{-1}\|_2,

    with :math:`e_M \le d_{in}\,\delta_G (1 + \rho)` (the ridge moves with the trace) and
    :math:`e_B \le \sqrt{d_{in} d_{out}}\,(\delta_G + \lambda\delta_W + \rho\,\delta_G
    \max|W|)` (Frobenius norms of entrywise bounds); every entry is within the 2-norm. The
    other keys' entries are within ``delta_weights``. The maximum over both is returned (inf
    when :math:`s\,e_M \ge 1`)."""
    worst = float(delta_weights)
    for layer, gram in grams.items():
        g = gram.double()
        size = g.shape[0]
        w = merged[f"{layer}.weight"].double()
        lam = ridge * max(float(torch.diagonal(g).mean()), 1e-12)
        smallest = float(torch.linalg.eigvalsh(g + lam * torch.eye(size, dtype=g.dtype))[0])
        s = 1.0 / smallest if smallest > 0 else math.inf
        e_m = size * delta_statistics * (1 + ridge)
        e_b = math.sqrt(w.numel()) * (
            delta_statistics + lam * delta_weights + ridge * delta_statistics * float(w.abs().max())
        )
        norm = float(torch.linalg.matrix_norm(w, ord=2))
        if not s * e_m < 1:
            return math.inf
        worst = max(worst, s * (e_b + e_m * norm) / (1 - s * e_m))
    return worst
