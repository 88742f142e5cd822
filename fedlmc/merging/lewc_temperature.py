r"""A data-free softmax temperature for the plain average, predicted by LEWC.

**Setting.** :math:`N` clients :math:`\theta_i` with normalised weights :math:`w_i`
(:math:`\sum_i w_i = 1`; the example-count shares a one-shot merge uses), each a norm-free plain
chain of :math:`L` weight layers :math:`f_l = \sigma(W_l f_{l-1})` (:math:`\sigma` ReLU, or
another positively homogeneous map such as max pooling), merged by the plain average
:math:`\bar\theta = \sum_i w_i \theta_i`. LEWC (Ito et al. 2025; reciprocal orthogonality and
weak additivity, :mod:`fedlmc.permutation.chain`) predicts the merged logits

.. math:: z(x; \bar\theta) \approx \sum_i w_i^{\,L}\, z_i(x), \qquad z_i = z(\,\cdot\,; \theta_i).

With biases this holds only when layer :math:`l`'s bias is combined as
:math:`\sum_i w_i^{\,l} b^{(i)}_l` (``average_lewc_bias``); the plain average of the biases
stays at full scale while the signal shrinks, so it does not hold there.

**The temperature.** Write the clients' weighted mean logits (the logit ensemble)
:math:`\bar z = \sum_i w_i z_i` and :math:`z_i = \bar z + e_i`, so :math:`\sum_i w_i e_i = 0`.
Then

.. math:: z(x; \bar\theta) \approx \Big(\sum_i w_i^{\,L}\Big)\, \bar z + \sum_i w_i^{\,L} e_i .

At equal weights the second term is :math:`N^{-L} \sum_i e_i = N^{1-L} \sum_i w_i e_i = 0`;
with unequal weights it vanishes in expectation when the clients' deviations from their mean
are uncorrelated with it (:math:`\langle e_i, \bar z\rangle = 0`), and the least-squares scale
of the merged logits on the mean logits, :math:`c = \langle z(\bar\theta), \bar z\rangle /
\lVert\bar z\rVert^2`, is then

.. math:: c = \sum_i w_i^{\,L}.

:func:`lewc_temperature` returns :math:`T = c`, so that :math:`z(x; \bar\theta) / T \approx
\bar z`: the calibrated merge is as confident as the clients' logit ensemble at temperature 1.
At equal weights :math:`T = N^{1-L}` (LEWC's ratio, the column ``lewc_temperature_ratio``
measures :math:`\lVert\sum_i w_i^L z_i\rVert / \lVert\bar z\rVert` on data); for two clients at
shares :math:`\lambda, 1 - \lambda`, :math:`\lambda^L + (1-\lambda)^L`. By the power-mean
inequality :math:`N^{1-L} \le T \le \max_i w_i^{\,L-1} \le 1`, with equality on the left only at
equal weights: a client with most of the weight keeps more of its scale.

**What T is not.** The NLL-minimising temperature of the merge is :math:`c\,T_{\text{ens}}`,
with :math:`T_{\text{ens}}` the logit ensemble's own fitted temperature, which needs data;
:math:`T` assumes :math:`T_{\text{ens}} = 1`. Where the ensemble is over- or under-confident,
the calibrated merge is too, by the same factor. And :math:`T` says nothing about
interference: where the cross terms :math:`W_i f_j` are not small (narrow models, many
clients, deep chains) the merged logits are not a shrunk ensemble, and the prediction is off.

**One basin.** Clients that start from one initialisation (``init = "shared"``, FedAvg's
setting) stay in one basin: reciprocal orthogonality fails, the merge is linear in the weights
to first order (LLFC's :math:`z(\bar\theta) \approx \bar z`) and :math:`c \approx 1`. There
:func:`lewc_temperature` returns :math:`T = 1` (``shared_start=True``): LEWC's
:math:`N^{1-L}` would sharpen the merge by orders of magnitude.

**No data, no query.** :math:`T` needs the chain's depth (:func:`chain_depth`, from the
permutation spec) and the weights, nothing else: no server data, no client round; under
secure aggregation the weights are the public example-count shares, so the server computes the
same :math:`T`. :class:`LewcPrediction` is the prediction as a
:class:`~fedlmc.merging.post_merge.StatisticsSource` (``calibrate(model, LewcPrediction(L, w))``);
:func:`lewc_refusal` says, in one line, where :math:`T` is undefined (a merge other than the
plain average, a residual or normed model, biases averaged plainly).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

    from fedlmc.permutation.spec import PermutationSpec

__all__ = [
    "LEWC_MERGES",
    "ONE_BASIN_NOTE",
    "LewcPrediction",
    "chain_depth",
    "lewc_refusal",
    "lewc_temperature",
]

LEWC_MERGES = ("average", "average_lewc_bias")
"""The merges whose logit scale LEWC predicts: the plain average (bias-free chains) and the plain
average with LEWC's depth-weighted biases."""

CALIBRATION = "lewc"
"""The calibration's name (a value of the strategies' ``calibration``)."""

ONE_BASIN_NOTE = (
    "calibration = 'lewc' with clients that share their initialisation (init = 'shared'): one "
    "basin, where LEWC's N^(1-L) shrinkage does not apply; T = 1 (the raw merge's scale)"
)
"""What a strategy and the run say when LEWC's temperature is 1 because the clients share a
start."""


def lewc_temperature(layers: int, weights: Sequence[float], *, shared_start: bool = False) -> float:
    r""":math:`T = \sum_i w_i^{\,L}` for ``layers`` :math:`= L` weight layers and ``weights``
    (normalised here to sum to 1); 1 with ``shared_start`` (one basin: module docstring)."""
    from fedlmc.averaging import normalised_weights

    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"layers = {layers!r}; allowed: an integer >= 1 (weight layers)")
    if len(weights) == 0:
        raise ValueError("weights is empty; allowed: one weight per client")
    w = normalised_weights(weights, len(weights))
    if shared_start:
        return 1.0
    return math.fsum(wi**layers for wi in w)


def chain_depth(template: nn.Module, spec: PermutationSpec | None = None) -> int:
    """:math:`L`: the Linear/Conv layers of ``template``'s norm-free plain chain (under ``spec``,
    default: its own); ``ValueError`` naming why it is none
    (:func:`fedlmc.merging.request_facts.plain_chain_reason`)."""
    return len(_norm_free_chain(template, spec))


def lewc_refusal(template: nn.Module, method: str, spec: PermutationSpec | None = None) -> str:
    """Why LEWC's temperature is undefined for ``method`` on ``template`` (one line), ``""``
    where it is defined: a merge outside :data:`LEWC_MERGES`, a model that is no norm-free plain
    chain (BatchNorm, LayerNorm, residual blocks), or a chain with biases merged by the plain
    average (they stay at full scale; ``average_lewc_bias`` combines them as LEWC needs)."""
    if method not in LEWC_MERGES:
        return (
            f"calibration = 'lewc' with merge {method!r}: LEWC predicts the logit scale of the "
            f"plain average only; allowed merges: {', '.join(LEWC_MERGES)}"
        )
    try:
        layers = _norm_free_chain(template, spec)
    except ValueError as error:
        return str(error)
    state = template.state_dict()
    biased = [layer for layer in layers if f"{layer}.bias" in state]
    if biased and method == "average":
        return (
            f"calibration = 'lewc' with biases ({biased[0]}.bias) averaged plainly: LEWC's scale "
            "needs bias-free layers; allowed: a bias-free model, or the merge "
            "'average_lewc_bias' (biases combined as sum_i w_i^l b_i)"
        )
    return ""


def _norm_free_chain(template: nn.Module, spec: PermutationSpec | None) -> list[str]:
    from fedlmc.merging.request_facts import plain_chain_reason
    from fedlmc.permutation.chain import chain_layers
    from fedlmc.permutation.model_spec import permutation_spec

    if spec is None:
        try:
            spec = permutation_spec(template)
        except (ValueError, RuntimeError, TypeError) as error:  # torch.fx errors too
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ValueError(f"calibration = 'lewc' needs the model's depth: {first}") from None
    reason = plain_chain_reason(template, spec)
    if reason:
        raise ValueError(f"calibration = 'lewc' needs a norm-free plain chain: {reason}")
    return chain_layers(spec, template.state_dict()) or []


@dataclass(frozen=True)
class LewcPrediction:
    """LEWC's temperature as a :class:`~fedlmc.merging.post_merge.StatisticsSource` (name
    ``lewc``): ``temperature(model)`` is :func:`lewc_temperature` of ``layers`` and ``weights``,
    whatever the model; it holds no data, so BatchNorm and REPAIR statistics are a
    ``ValueError`` (:func:`lewc_refusal` keeps those models and methods away)."""

    layers: int
    weights: tuple[float, ...]
    shared_start: bool = False
    name: str = CALIBRATION

    @classmethod
    def of(
        cls,
        template: nn.Module,
        weights: Sequence[float],
        *,
        spec: PermutationSpec | None = None,
        shared_start: bool = False,
    ) -> LewcPrediction:
        """The prediction for ``template``'s chain (:func:`chain_depth` under ``spec``) and the
        merge ``weights``."""
        return cls(chain_depth(template, spec), tuple(float(w) for w in weights), shared_start)

    def __post_init__(self) -> None:
        """Checked like :func:`lewc_temperature`."""
        lewc_temperature(self.layers, self.weights, shared_start=self.shared_start)

    @property
    def value(self) -> float:
        """The predicted :math:`T`."""
        return lewc_temperature(self.layers, self.weights, shared_start=self.shared_start)

    def bn_statistics(self, model: nn.Module):
        """No data: ``ValueError``."""
        raise ValueError("calibration = 'lewc' holds no data: no BatchNorm statistics")

    def unit_statistics(self, model: nn.Module, layers: Sequence[str]):
        """No data: ``ValueError``."""
        raise ValueError("calibration = 'lewc' holds no data: no REPAIR statistics")

    def temperature(self, model: nn.Module) -> tuple[float, list[dict[str, float]]]:
        """``(T, [])``: the prediction, no fit."""
        return self.value, []
