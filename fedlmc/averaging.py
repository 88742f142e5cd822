r"""Merging of state dicts by weighted averaging and linear interpolation.

For models :math:`\theta_1, \dots, \theta_N` with non-negative weights :math:`c_i`
(e.g. sample counts), the merged model is

.. math:: \bar\theta = \sum_i w_i \theta_i, \qquad w_i = c_i / \textstyle\sum_j c_j .

Floating-point tensors are accumulated in float64 and cast back to their dtype; integer buffers
(BatchNorm's ``num_batches_tracked``) are not averaged but take their maximum. Inputs are never
mutated.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

StateDict = dict[str, Tensor]


def normalised_weights(weights: Sequence[float] | None, count: int) -> list[float]:
    r"""Weights :math:`w_i = c_i / \sum_j c_j`; uniform ``1/count`` when ``weights`` is None."""
    if weights is None:
        return [1.0 / count] * count
    values = [float(w) for w in weights]
    if len(values) != count:
        raise ValueError(
            f"weights has {len(values)} entries, expected one per state dict ({count})"
        )
    if not all(math.isfinite(w) and w >= 0 for w in values) or not sum(values) > 0:
        raise ValueError(f"weights must be finite, >= 0 with a positive sum, got {values}")
    total = sum(values)
    return [w / total for w in values]


def check_compatible(state_dicts: Sequence[Mapping[str, Tensor]]) -> None:
    """Raise ``ValueError`` naming the first key that is missing, has a different shape, or is
    complex (averaging in float64 would drop the imaginary part)."""
    reference = state_dicts[0]
    for key, tensor in reference.items():
        if tensor.is_complex():
            raise ValueError(
                f"key {key!r} is a complex tensor ({tensor.dtype}); allowed: real floating-point, "
                "integer or bool tensors"
            )
    for index, sd in enumerate(state_dicts[1:], start=1):
        missing = set(reference) ^ set(sd)
        if missing:
            key = sorted(missing)[0]
            raise ValueError(f"state dict {index} and state dict 0 differ in key {key!r}")
        for key, tensor in reference.items():
            if tuple(sd[key].shape) != tuple(tensor.shape):
                raise ValueError(
                    f"key {key!r} has shape {tuple(sd[key].shape)} in state dict {index}, "
                    f"expected {tuple(tensor.shape)}"
                )


def average(
    state_dicts: Sequence[Mapping[str, Tensor]], weights: Sequence[float] | None = None
) -> StateDict:
    r"""Weighted average :math:`\sum_i w_i \theta_i` of ``state_dicts`` (weights normalised).

    Float tensors are summed in float64 and cast back to the first dict's dtype and device;
    integer/bool tensors (e.g. ``num_batches_tracked``) take the elementwise maximum.
    """
    if len(state_dicts) == 0:
        raise ValueError("average needs at least one state dict, got none")
    check_compatible(state_dicts)
    w = normalised_weights(weights, len(state_dicts))
    merged: StateDict = {}
    for key, ref in state_dicts[0].items():
        tensors = [sd[key] for sd in state_dicts]
        if ref.is_floating_point():
            merged[key] = _weighted_sum64(w, tensors, ref).to(ref.dtype)
        else:
            merged[key] = torch.stack([t.detach().to(ref.device) for t in tensors]).amax(dim=0)
    return merged


class LeaveOneOutMean:
    r"""The weighted means of all models but one, :math:`\bar\theta_{-i} = \sum_{j \ne i} w_j
    \theta_j / \sum_{j \ne i} w_j`, kept as one float64 running sum
    :math:`S = \sum_j w_j \theta_j`: :math:`\bar\theta_{-i} = (S - w_i \theta_i) / (1 - w_i)`
    costs one model's work instead of :math:`N - 1`, and :meth:`replace` updates :math:`S` at the
    same cost (MergeMany's pass is then linear in N, not quadratic). Integer buffers take the
    others' elementwise maximum, as in :func:`average`; where every other model weighs 0 the
    others' unweighted mean is returned, as :func:`average` would. Equal to
    ``average(others, their weights)`` up to float64 rounding."""

    def __init__(
        self, state_dicts: Sequence[Mapping[str, Tensor]], weights: Sequence[float] | None = None
    ) -> None:
        check_compatible(state_dicts)
        self.states = [dict(sd) for sd in state_dicts]
        self.weights = normalised_weights(weights, len(self.states))
        pairs = list(zip(self.weights, self.states, strict=True))
        self.total = {
            key: sum(w * sd[key].detach().double() for w, sd in pairs)
            for key, ref in self.states[0].items()
            if ref.is_floating_point()
        }

    def mean_without(self, index: int) -> StateDict:
        """:math:`\bar\theta_{-i}` for ``index`` = i, cast back to each tensor's dtype."""
        others = [j for j in range(len(self.states)) if j != index]
        rest = sum(self.weights[j] for j in others)
        if not rest > 0:
            return average([self.states[j] for j in others])
        own, w = self.states[index], self.weights[index]
        mean: StateDict = {}
        for key, ref in own.items():
            if key in self.total:
                value = (self.total[key] - w * ref.detach().double()) / rest
                mean[key] = value.to(dtype=ref.dtype, device=ref.device)
            else:
                mean[key] = torch.stack([self.states[j][key] for j in others]).amax(dim=0)
        return mean

    def replace(self, index: int, state_dict: Mapping[str, Tensor]) -> None:
        """Model ``index`` becomes ``state_dict`` (same keys and shapes); :math:`S` follows."""
        check_compatible([self.states[index], state_dict])
        w, old = self.weights[index], self.states[index]
        for key in self.total:
            self.total[key] += w * (state_dict[key].detach().double() - old[key].detach().double())
        self.states[index] = dict(state_dict)


def _float64_copy(t: Tensor, like: Tensor) -> Tensor:
    """A float64 copy of ``t`` on ``like``'s device (never ``t`` itself: it is changed in place)."""
    return t.detach().to(device=like.device, dtype=torch.float64, copy=True)


def _weighted_sum64(weights: Sequence[float], tensors: Sequence[Tensor], ref: Tensor) -> Tensor:
    r""":math:`\sum_i w_i t_i` in float64 on ``ref``'s device, with the operations and rounding of
    ``sum(w_i * t_i.double())`` (from 0: a leading -0.0 becomes +0.0), computed in place."""
    acc = _float64_copy(tensors[0], ref).mul_(weights[0]).add_(0.0)
    for wi, t in zip(weights[1:], tensors[1:], strict=True):
        acc.add_(_float64_copy(t, ref).mul_(wi))
    return acc


def interpolate(sd_a: Mapping[str, Tensor], sd_b: Mapping[str, Tensor], lam: float) -> StateDict:
    r""":math:`\theta(\lambda) = \lambda\theta_a + (1-\lambda)\theta_b` (``lam = 1`` is model a).

    Computed in float64 and cast back, so ``lam = 1`` and ``lam = 0`` reproduce the endpoints
    exactly; integer buffers take the maximum, as in :func:`average`. ``lam`` may lie outside
    [0, 1] (extrapolation) and must be finite.
    """
    lam = float(lam)
    if not math.isfinite(lam):
        raise ValueError(f"lam must be a finite number, got {lam}")
    check_compatible([sd_a, sd_b])
    merged: StateDict = {}
    for key, a in sd_a.items():
        b = sd_b[key]
        if a.is_floating_point():
            value = _float64_copy(a, a).mul_(lam).add_(_float64_copy(b, a).mul_(1.0 - lam))
            merged[key] = value.to(a.dtype)
        else:
            merged[key] = torch.maximum(a.detach(), b.detach().to(a.device))
    return merged


def load_state(template: nn.Module, state_dict: Mapping[str, Tensor]) -> nn.Module:
    """A deep copy of ``template`` with ``state_dict`` loaded strictly (template unchanged).

    The plain tensors and parameters that ``state_dict`` fills are not copied from the template
    first: the copy gets uninitialised ones of the same type, shape, dtype, device and
    ``requires_grad``, which the strict load then overwrites (the same model; the template's
    values never leak). Everything else (non-persistent buffers, extra state, lazy parameters,
    tensor subclasses) is deep-copied as before."""
    filled = template.state_dict(keep_vars=True)  # alive until the copy: the memo keys by id
    memo: dict[int, object] = {}
    for tensor in filled.values():
        if type(tensor) not in (Tensor, nn.Parameter):
            continue
        blank = torch.empty_like(tensor.detach())
        if isinstance(tensor, nn.Parameter):
            blank = nn.Parameter(blank, tensor.requires_grad)
        elif tensor.requires_grad:
            blank.requires_grad_(True)
        memo[id(tensor)] = blank
    model = copy.deepcopy(template, memo)
    model.load_state_dict(dict(state_dict), strict=True)
    return model
