r"""OT fusion (Singh and Jaggi, "Model Fusion via Optimal Transport", NeurIPS 2020), weight-based:
every client's hidden units transported onto the reference client's (client 0) layer by layer,
then the weighted average; the optimal-transport problems are solved by POT (the ``pot``
package: ``ot.emd``, ``ot.sinkhorn``).

For a hidden layer :math:`l` of client :math:`i` (weights :math:`W_l`, bias :math:`b_l`, the
layer's input already carried into the reference's basis by the previous layer's map
:math:`M_{l-1}`, :math:`\tilde W_l = W_l M_{l-1}^\top`), the ground cost between its unit
:math:`a` and the reference's unit :math:`b` is the Euclidean distance of their incoming weights
(and bias) :math:`C_{ab} = \|[\tilde W_l, b_l]_a - [W^{(0)}_l, b^{(0)}_l]_b\|_2` (their
``ground_metric = "euclidean"``, not squared), the marginals are uniform, :math:`\mu = 1/n_i`,
:math:`\nu = 1/n_0` (their default without activation histograms), and the transport plan
:math:`T` (``n_i x n_0``) solves

.. math:: \min_{T \ge 0,\ T\mathbf 1 = \mu,\ T^\top \mathbf 1 = \nu} \langle T, C\rangle
    \;(+\,\gamma \max(C) \textstyle\sum T \log T).

:math:`\gamma = 0` (``ot-reg``, the default) is the exact problem (``ot.emd``, their default
``exact``); :math:`\gamma > 0` Sinkhorn's entropic one (``ot.sinkhorn``, log-domain), relative to
the largest cost. The map into the reference's basis is the barycentric projection
:math:`M_l = \mathrm{diag}(1/\nu)\, T^\top` (``n_0 x n_i``, rows summing to 1: their
"correction"), so :math:`W'_l = M_l \tilde W_l`, :math:`b'_l = M_l b_l`; the output layer only
gets its input carried, :math:`W'_L = W_L M_{L-1}^\top`. The fused model is
:math:`\sum_i w_i \theta'_i` with :math:`\theta'_0 = \theta_0`: every client aligned to one
reference (client 0), as the paper fuses more than two models.

At equal widths the exact problem has a permutation among its solutions, which the network
simplex returns: :math:`M` is then a permutation matrix (a hard alignment, one greedy pass of
layer-wise matching by distance); with :math:`\gamma > 0` it is a dense doubly-stochastic map
(soft alignment, units averaged). ``ot_map_softness`` reports :math:`1 - \max_a M_{ba}` averaged
over the reference's units, the clients and the layers: 0 for a permutation.

Models: norm-free plain feed-forward chains (:func:`fedlmc.permutation.chain.norm_free_chain`),
as CCA Merge: a map that mixes units does not pass through a per-unit normalisation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from fedlmc.permutation.chain import norm_free_chain
from fedlmc.permutation.spec import PermutationSpec

StateDict = dict[str, Tensor]

__all__ = ["fuse_onto", "ot_fusion", "transport_map"]


def transport_map(source: Tensor, target: Tensor, reg: float = 0.0) -> Tensor:
    r""":math:`M = \mathrm{diag}(1/\nu) T^\top` (``n_target x n_source``, float64) of the optimal
    plan between the rows of ``source`` and of ``target`` (units x features) under the
    Euclidean cost and uniform marginals (see the module docstring)."""
    import ot

    if reg < 0:
        raise ValueError(f"ot reg = {reg}: allowed: >= 0 (0: exact)")
    if source.shape[1:] != target.shape[1:]:
        raise ValueError(
            f"units of {tuple(source.shape[1:])} features cannot be matched to "
            f"{tuple(target.shape[1:])}"
        )
    a = source.double().reshape(len(source), -1).numpy()
    b = target.double().reshape(len(target), -1).numpy()
    cost = ot.dist(a, b, metric="euclidean")
    mu = np.full(len(a), 1.0 / len(a))
    nu = np.full(len(b), 1.0 / len(b))
    if reg == 0:
        plan = ot.emd(mu, nu, cost)
    else:
        scale = max(float(cost.max()), 1e-300)
        plan = ot.sinkhorn(mu, nu, cost / scale, reg, method="sinkhorn_log", numItermax=10000)
    return torch.as_tensor(plan.T / nu[:, None], dtype=torch.float64)


def _features(weight: Tensor, bias: Tensor | None) -> Tensor:
    """Each unit's incoming weights (flattened) and bias, one row per unit."""
    rows = weight.reshape(len(weight), -1)
    return rows if bias is None else torch.cat([rows, bias.reshape(-1, 1)], dim=1)


def fuse_onto(
    state: Mapping[str, Tensor],
    reference: Mapping[str, Tensor],
    layers: Sequence[str],
    reg: float = 0.0,
) -> tuple[StateDict, list[Tensor]]:
    """``state`` carried into ``reference``'s basis along the chain ``layers`` (input to output)
    and the maps of its hidden layers (see the module docstring)."""
    out = {k: v.clone() for k, v in state.items()}
    maps: list[Tensor] = []
    previous: Tensor | None = None
    for depth, layer in enumerate(layers):
        key, bias_key = f"{layer}.weight", f"{layer}.bias"
        weight = state[key].double()
        if previous is not None:
            weight = torch.einsum("om...,jm->oj...", weight, previous)
        bias = state[bias_key].double() if bias_key in state else None
        if depth < len(layers) - 1:
            target_bias = reference[bias_key].double() if bias is not None else None
            target = _features(reference[key].double(), target_bias)
            mapping = transport_map(_features(weight, bias), target, reg)
            weight = torch.einsum("jo,o...->j...", mapping, weight)
            if bias is not None:
                out[bias_key] = (mapping @ bias).to(state[bias_key].dtype)
            maps.append(mapping)
            previous = mapping
        out[key] = weight.to(state[key].dtype)
    return out, maps


def ot_fusion(
    spec: PermutationSpec, states: Sequence[Mapping[str, Tensor]], reg: float = 0.0
) -> tuple[list[StateDict], float]:
    """Every state in client 0's basis (client 0 unchanged) and ``ot_map_softness``, the mean
    over clients 1.. and hidden layers of the mean over the reference's units of
    ``1 - max`` of its row of the map (0: every map a permutation). ``ValueError`` for a model
    that is no norm-free plain chain."""
    try:
        layers = norm_free_chain(spec, states[0])
    except ValueError as error:
        raise ValueError(
            "ot_fusion: the model is not supported; allowed: norm-free plain chains (MLP, VGG-11 "
            f"with norm = 'none'): {str(error).split('; ', 1)[-1]}"
        ) from None
    aligned = [dict(states[0])]
    softness = []
    for state in states[1:]:
        fused, maps = fuse_onto(state, states[0], layers, reg)
        aligned.append(fused)
        softness += [float((1.0 - m.max(dim=1).values).mean()) for m in maps]
    return aligned, (sum(softness) / len(softness) if softness else 0.0)
