r"""The weighted-sum form of a ``sum`` merge rule: what each client sends so that secure
aggregation's weighted mean, rescaled on the server, is the rule's merge.

Secure aggregation (Flower's SecAgg+) gives the server one thing: the weighted mean
:math:`\sum_i s_i x_i / \sum_j s_j` of what the clients send, with public shares
:math:`s_i \propto n_i` (the example counts travel in the clear). A rule that is a sum with a
per-key *power* of the weights,

.. math::

    \bar\theta[k] = \sum_i w_i^{\,1 + e_k}\, \theta_i[k], \qquad w_i = \frac{s_i}{\sum_j s_j},

runs as one such mean: client :math:`i` pre-scales key :math:`k` by :math:`s_i^{\,e_k}` (its
own share, no other client's), and the server post-scales the mean by
:math:`(\sum_j s_j)^{-e_k}` (the public counts):

.. math::

    \Big(\sum_j s_j\Big)^{-e_k} \frac{\sum_i s_i\, s_i^{\,e_k} \theta_i[k]}{\sum_j s_j}
    = \sum_i \Big(\frac{s_i}{\sum_j s_j}\Big)^{1+e_k} \theta_i[k].

The plain average has every exponent :math:`e_k = 0` (:func:`plain_exponents`);
``average_lewc_bias`` (LEWC's bias rule :math:`\sum_i w_i^{\,l} b^{(i)}_l`) has
:math:`e = l - 1` on the bias of chain layer :math:`l` and 0 elsewhere
(:func:`lewc_bias_exponents`). The private layer registers a method's exponents as its
``sum_exponents`` (``fedlmc.strategies.secure_forms``); that is what makes it run under secure
aggregation.

**Mixed widths.** A method that takes clients of different widths (``embed_average``) is
the plain weighted mean of the clients embedded into the server's shapes at their first units
(HeteroFL's nesting, zero elsewhere): each client embeds its own model before it sends it
(:func:`embedded_for_sum`), with no other client's model needed, and the exponents are 0.

**Holder division** (``heterofl``: each entry averaged over the clients that hold it,
:math:`\bar\theta[k] = \sum_i s_i m_i[k]\, x_i[k] / \sum_i s_i m_i[k]`, :math:`m_i` client
:math:`i`'s holder mask, 1 where its nested-width model holds the entry): in the same secure
round each client sends its embedded model with the entries it does not hold set to 0 and,
per floating-point key, its holder mask times the clipping range :math:`c` (:func:`held_for_sum`;
twice the arrays, so about twice the bytes). The server gets both weighted means,
:math:`A[k] = \sum_i s_i m_i[k] x_i[k] / S` and :math:`cB[k] = c \sum_i s_i m_i[k] / S`, and
divides (:func:`divided_by_holders`): :math:`A/B` where some client holds the entry, the
empty-slot value (:func:`fedlmc.permutation.embed.fill_value`: 0, 1 for ``running_var``) where
none does, as the clear rule. The masks are summed securely too: the server never learns which
client holds what. Scaling the masks by :math:`c` puts them on the clipping range, so their
quantisation error relative to :math:`B` is :math:`1/c` of the values' (:func:`holder_error_bound`).

**Several means at once** (Fisher merging, RegMean: a ratio of two sums, a linear solve of
sums): a :class:`SecureSums` rule says what each client sends, computed from its own model and
data alone (its parts: :math:`u_i \odot \theta_i` and :math:`c\,u_i` for Fisher merging), and
how the server merges the parts' secure means; every part travels in the same secure round.

**Range.** With :math:`s_i \le 1` (SecAgg+'s :math:`s_i = n_i / M`, no client above
``max_weight`` :math:`M`), a pre-scaled value :math:`|s_i^{\,e} x| \le |x|`: whatever range holds
the clients' trained weights holds what they send, so the clipping rule on the initial model is
unchanged; each client checks the arrays it actually sends.

**Error.** The post-scale multiplies the mean's quantisation error by
:math:`(\sum_j s_j)^{-e_k}` (:func:`error_bound`). No Flower import here, and no torch at
import time (the run-config validation reads the registry).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor, nn

    from fedlmc.permutation.spec import PermutationSpec

StateDict = dict[str, "Tensor"]
Exponents = dict[str, int]
SumExponents = Callable[["PermutationSpec", Mapping[str, "Tensor"]], Exponents]

__all__ = [
    "clear_sums_merge",
    "Exponents",
    "SecureSums",
    "weighted_means",
    "SumExponents",
    "client_scaled",
    "divided_by_holders",
    "embedded_for_sum",
    "error_bound",
    "held_for_sum",
    "holder_error_bound",
    "lewc_bias_exponents",
    "plain_exponents",
    "secure_sum_merge",
    "server_rescaled",
]


@dataclass(frozen=True)
class SecureSums:
    r"""A ``sum`` rule merged from several secure means of one round (see the module docstring);
    ``options`` are the merge's method options (:class:`~fedlmc.merging.method_registry.MergeJob`
    ``options``) with the round's ``clipping_range`` (:math:`c`), ``weight_range`` (:math:`b
    \le c`, the weights' bound the values are scaled by) and ``statistics_range`` (:math:`R`,
    ``secagg-statistics-range``), and, for the client, ``statistics_seed``; for the server,
    ``entry_error`` (the largest error of one entry of a secure mean, :math:`3Nc/(QS)`).

    - ``part_shapes(template)``: per part, in the order the clients send them, its keys and
      shapes (how the server splits the aggregate);
    - ``client_parts(model, data, options)``: the parts one client sends, from its own trained
      ``model`` and training ``data`` ``(x, y)``, every value within :math:`[-c, c]`;
    - ``merge(template, means, options)``: the merge (the template's floating-point keys,
      float64) from the parts' weighted means, and the bound on its difference from the clear
      rule.
    """

    part_shapes: Callable[[nn.Module], list[dict[str, tuple[int, ...]]]]
    client_parts: Callable[[nn.Module, tuple[Tensor, Tensor], Mapping[str, Any]], list[StateDict]]
    merge: Callable[[nn.Module, list[StateDict], Mapping[str, Any]], tuple[StateDict, float]]


def weighted_means(
    parts: Sequence[Sequence[Mapping[str, Tensor]]], weights: Sequence[float]
) -> list[StateDict]:
    r"""Per part, :math:`\sum_i w_i p_i` of the clients' parts (``parts[i]``: client :math:`i`'s)
    at normalised ``weights``, float64: what a secure round gives in exact arithmetic, and how
    a :class:`SecureSums` rule's clear merge combines the same parts."""
    import torch

    total = float(sum(weights))
    clients = list(zip(weights, parts, strict=True))
    return [
        {k: sum(w * p[j][k].to(torch.float64) for w, p in clients) / total for k in parts[0][j]}
        for j in range(len(parts[0]))
    ]


def clear_sums_merge(
    states: Sequence[Mapping[str, Tensor]],
    statistics: Sequence[Any],
    weights: Sequence[float],
    what: str,
    parts: Callable[[Mapping[str, Tensor], Any], Sequence[StateDict]],
    from_means: Callable[..., StateDict],
) -> StateDict:
    r"""A :class:`SecureSums` rule merged in the clear, by the same parts and merge as its secure
    form, unscaled: client :math:`i`'s ``parts(state_i, statistics_i)``, their
    :func:`weighted_means` at the normalised ``weights``, then ``from_means(*means)`` on its keys
    and the plain average on every other key (integer buffers as the plain average takes them),
    each cast back to the clients' dtype. ``ValueError`` when the clients' states and their
    ``statistics`` (named ``what``: Fisher diagonals, Gram matrices) differ in number."""
    from fedlmc.averaging import average, normalised_weights

    if len(states) != len(statistics):
        raise ValueError(f"{len(states)} client states but {len(statistics)} {what}")
    w = normalised_weights(weights, len(states))
    sent = [parts(sd, found) for sd, found in zip(states, statistics, strict=True)]
    merged = average(states, w)
    for key, value in from_means(*weighted_means(sent, w)).items():
        merged[key] = value.to(states[0][key].dtype)
    return merged


def plain_exponents(spec: PermutationSpec | None, state: Mapping[str, Tensor]) -> Exponents:
    """The plain average :math:`\\sum_i w_i \\theta_i`: exponent 0 on every key."""
    return {key: 0 for key in state}


def lewc_bias_exponents(spec: PermutationSpec, state: Mapping[str, Tensor]) -> Exponents:
    r""":math:`e = l - 1` on the bias of chain layer :math:`l` (1-based, input to output), 0
    elsewhere: ``average_lewc_bias``'s :math:`\sum_i w_i^{\,l} b^{(i)}_l`. ``ValueError`` for a
    model that is no norm-free plain chain (:func:`fedlmc.permutation.chain.norm_free_chain`)."""
    from fedlmc.permutation.chain import norm_free_chain

    exponents = plain_exponents(spec, state)
    for depth, layer in enumerate(norm_free_chain(spec, state), start=1):
        if f"{layer}.bias" in state:
            exponents[f"{layer}.bias"] = depth - 1
    return exponents


def client_scaled(
    state: Mapping[str, Tensor], exponents: Mapping[str, int], share: float
) -> StateDict:
    r"""What client :math:`i` sends: every key :math:`k` times :math:`s_i^{\,e_k}` (its own
    ``share``, in float64, cast back to the key's dtype; keys of exponent 0 unchanged)."""
    if not 0 < share <= 1:
        raise ValueError(f"share = {share}: allowed: 0 < share <= 1 (n_i / max_weight)")
    return {k: _scaled(v, share ** exponents.get(k, 0)) for k, v in state.items()}


def server_rescaled(
    mean: Mapping[str, Tensor], exponents: Mapping[str, int], total_share: float
) -> StateDict:
    r"""The merge from the secure weighted mean: every key :math:`k` times
    :math:`(\sum_j s_j)^{-e_k}` (``total_share`` :math:`= \sum_j s_j` over the clients in the
    sum)."""
    if not total_share > 0:
        raise ValueError(f"total_share = {total_share}: allowed: > 0")
    return {k: _scaled(v, total_share ** -exponents.get(k, 0)) for k, v in mean.items()}


def _scaled(value: Tensor, factor: float) -> Tensor:
    import torch

    if factor == 1.0 or not value.is_floating_point():
        return value
    return (value.detach().to(torch.float64) * factor).to(value.dtype)


def embedded_for_sum(
    state: Mapping[str, Tensor], server: nn.Module, spec: PermutationSpec
) -> StateDict:
    """``state`` embedded into ``server``'s shapes at its first units
    (:func:`fedlmc.permutation.embed.embed_state`; unchanged when the shapes already agree):
    what a client of a mixed-width ``sum`` rule sends (``embed_average``'s embedding)."""
    from fedlmc.permutation.embed import embed_state

    shapes = {k: tuple(v.shape) for k, v in server.state_dict().items()}
    if all(tuple(v.shape) == shapes.get(k) for k, v in state.items()):
        return dict(state)
    return dict(embed_state(state, server, "first", spec=spec))


def secure_sum_merge(
    states: Sequence[Mapping[str, Tensor]], exponents: Mapping[str, int], shares: Sequence[float]
) -> StateDict:
    r"""What the server obtains in exact arithmetic (no quantisation): the clients'
    :func:`client_scaled` arrays, their ``shares``-weighted mean, :func:`server_rescaled`.
    Floating-point keys only (the mean is in float64, cast back)."""
    import torch

    sent = [client_scaled(sd, exponents, s) for sd, s in zip(states, shares, strict=True)]
    total = float(sum(shares))
    mean = {}
    for key, ref in states[0].items():
        if ref.is_floating_point():
            summed = sum(s * sd[key].to(torch.float64) for s, sd in zip(shares, sent, strict=True))
            mean[key] = (summed / total).to(ref.dtype)
    return server_rescaled(mean, exponents, total)


def error_bound(
    exponent: int, num_clients: int, clipping_range: float, levels: int, total_share: float
) -> float:
    r"""The largest difference of a securely merged value of exponent :math:`e` from the clear
    rule at the clients' count weights :math:`n_i / \sum_j n_j`, with :math:`N` clients,
    clipping range :math:`c`, :math:`Q` quantisation levels and :math:`S = \sum_j s_j`:

    .. math::

        |\varepsilon_e| \le \frac{N c}{Q S}\,\big(2 S^{-e} + e + 1\big).

    The mean's quantisation (one level :math:`2c/Q` per client, :math:`2Nc/(QS)`) is multiplied
    by the post-scale :math:`S^{-e}`; the shares' rounding to a level (:math:`|s_i - n_i/M| \le
    1/(2Q)`) moves the normalised weights by :math:`N/(QS)` in all, and
    :math:`w^{1+e}` by at most :math:`1 + e` times that (:math:`|a^p - b^p| \le p|a - b|` on
    :math:`[0, 1]`), a value by :math:`c` times that. :math:`e = 0` is the plain average's
    :math:`3Nc/(QS)`."""
    base = num_clients * clipping_range / (levels * total_share)
    return base * (2.0 * total_share**-exponent + exponent + 1)


def held_for_sum(
    state: Mapping[str, Tensor], server: nn.Module, spec: PermutationSpec, mask_scale: float
) -> tuple[StateDict, StateDict]:
    """What a client of a holder-divided rule (``heterofl``) sends: ``state`` embedded into
    ``server``'s shapes at its first units with every entry it does not hold set to 0
    (``running_var``'s empty slots too), and, per floating-point key, its holder mask times
    ``mask_scale`` (``mask_scale`` where it holds the entry, 0 elsewhere; all ``mask_scale``
    at the server's width)."""
    import torch

    from fedlmc.permutation.embed import embed_state

    embedded = embed_state(state, server, "first", spec=spec)
    values, masks = {}, {}
    for key, value in embedded.items():
        if not value.is_floating_point():
            values[key] = value
            continue
        held = embedded.holders[key].to(value.device)
        values[key] = torch.where(held, value, torch.zeros_like(value))
        masks[key] = held.to(value.dtype) * mask_scale
    return values, masks


def divided_by_holders(
    mean: Mapping[str, Tensor],
    mask_mean: Mapping[str, Tensor],
    mask_scale: float,
    threshold: float,
) -> StateDict:
    r"""The holder-divided merge from the secure means: :math:`A[k]/B[k]` with :math:`A` =
    ``mean`` and :math:`B` = ``mask_mean / mask_scale`` where :math:`B[k]` is above
    ``threshold`` (some client holds the entry), else the empty-slot value
    (:func:`fedlmc.permutation.embed.fill_value`), as
    :func:`fedlmc.merging.widths.holder_average` fills an entry held by nobody. In float64,
    cast back to ``mean``'s dtypes; a key without a mask is kept."""
    import torch

    from fedlmc.permutation.embed import fill_value

    merged = {}
    for key, value in mean.items():
        if key not in mask_mean:
            merged[key] = value
            continue
        held = mask_mean[key].to(torch.float64) / mask_scale
        ratio = value.to(torch.float64) / held.clamp_min(max(threshold, 1e-300))
        merged[key] = torch.where(held > threshold, ratio, fill_value(key)).to(value.dtype)
    return merged


def holder_error_bound(
    num_clients: int, clipping_range: float, levels: int, min_share: float
) -> float:
    r"""The largest difference of a holder-divided secure value (:func:`divided_by_holders`)
    from the clear rule at the count weights, with :math:`N` clients, clipping range :math:`c`,
    :math:`Q` levels and :math:`r = \min_i s_i` the smallest client share:

    .. math::

        |\varepsilon| \le \frac{4 N c}{Q r - 2 N} + \frac{N c}{Q r}.

    With :math:`S = \sum_j s_j`, the server's means are :math:`A = a + \alpha`,
    :math:`B = b + \beta` with :math:`|\alpha| \le 2Nc/(QS)` (one level :math:`2c/Q` per client)
    and :math:`|\beta| \le 2N/(QS)` (the masks are sent times :math:`c`, the mean divided by
    :math:`c`). Then

    .. math::

        \frac{A}{B} - \frac{a}{b} = \frac{\alpha - (a/b)\,\beta}{b + \beta}, \qquad
        \Big|\frac{A}{B} - \frac{a}{b}\Big| \le \frac{|\alpha| + c|\beta|}{b - |\beta|}
        \le \frac{4Nc/(QS)}{r/S - 2N/(QS)},

    since :math:`a/b` is a convex combination of the holders' values (:math:`|a/b| \le c`) and
    an entry held by anyone has :math:`b \ge r/S`. The shares' rounding to a level
    (:math:`|s_i - n_i/M| \le 1/(2Q)`) moves the holders' normalised weights by at most
    :math:`N/(Q R) \le N/(Q r)` in all (:math:`R \ge r` their summed shares), a value by
    :math:`c` times that. An entry held by nobody has :math:`|B| \le 2N/(QS) < r/(2S)`, one held
    by anyone :math:`B > r/(2S)`: the threshold :math:`r/(2S)` tells them apart exactly when
    :math:`Q r > 4N` (``ValueError`` otherwise)."""
    n, c = num_clients, clipping_range
    if not levels * min_share > 4 * n:
        raise ValueError(
            f"smallest share {min_share:g} with {n} clients and {levels} levels: allowed: "
            f"share > 4 * clients / levels = {4 * n / levels:g} (the holder masks' "
            "quantisation would hide who holds an entry)"
        )
    return 4 * n * c / (levels * min_share - 2 * n) + n * c / (levels * min_share)
