r"""Preserve-First Merging (PFM; Qu and Horvath, "Vanishing Feature: Diagnosing Model Merging and
Beyond", CPAL 2025): keep every client's first layers, merge only the later ones.

The input-dependent features vanish as they propagate through a merge, and they vanish most when
the early layers are merged; PFM therefore does not merge the first :math:`k` layers. For a
plain chain of :math:`L` Linear/Conv layers with clients :math:`\theta_i` in a common basis
(e.g. after weight matching; the identity for the plain average) and weights :math:`w_i`, let
:math:`z^{(i)}_l(x)` be client :math:`i`'s own pre-activation of layer :math:`l` (its own layers
:math:`1..l`, with their nonlinearities). PFM with :math:`k` preserved layers computes

.. math:: h_{k+1}(x) = \sum_i w_i\, z^{(i)}_{k+1}(x),

and then the merged layers :math:`k+2, \dots, L` of :math:`\bar\theta = \sum_i w_i \theta_i`
on :math:`\sigma(h_{k+1})`. So :math:`k = 0` is the merge itself (a layer's pre-activation is
linear in its weights: :math:`\sum_i w_i W^{(i)}_1 x = \bar W_1 x`), and :math:`k = L - 1` is
the logit ensemble :math:`\sum_i w_i z^{(i)}_L(x)`; in between, the model holds :math:`N` copies
of the first :math:`k + 1` layers, so its parameters grow with :math:`k`
(:attr:`~fedlmc.merging.baselines.preserve_first.PreserveFirstModel.parameter_count`).

This follows their ``PFM/model_merger.py``: ``ModelMerge.transform(..., start_at=node)`` merges
the graph from the prefix node ``start_at`` on; ``add_merge_hooks`` puts a forward hook on the
first weight module whose output is merged but whose input is not, and ``forward`` runs every
aligned base model up to that module (``MergedModelStop``), averages its outputs
(``start_val[k] / total``) and feeds the average to the merged model in place of that module's
output. ``PFM/cifar_experiments.py`` sweeps ``start_at`` over every prefix node; there is no
single default. Here the default is :data:`PFM_LAYERS` = 1 preserved layer (the cheapest
setting that is not the merge).

The merged model holds every client's first layers, so it is not a state dict of the template:
it is a model (:class:`PreserveFirstModel`), and the registered methods ``preserve_first`` and
``weight_matching_preserve_first`` (:mod:`fedlmc.merging.baselines.baselines`, with
:data:`PFM_LAYERS`) declare it with the registry's ``builds_model``: the study evaluates this model,
the consumers of template state dicts refuse it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from fedlmc.averaging import average, load_state, normalised_weights
from fedlmc.capture import StopForward
from fedlmc.merging.calibrate import has_batchnorm
from fedlmc.permutation.chain import chain_layers
from fedlmc.permutation.model_spec import permutation_spec

__all__ = ["PFM_LAYERS", "PreserveFirstModel", "preserve_first"]

PFM_LAYERS = 1
"""Default number of preserved (unmerged) layers :math:`k`."""


class PreserveFirstModel(nn.Module):
    """The PFM model: ``clients`` (in a common basis) run up to the output of ``chain[k]`` (the
    :math:`(k+1)`-th layer), their outputs are averaged at ``weights`` and the ``merged`` model
    continues from there."""

    def __init__(
        self,
        merged: nn.Module,
        clients: Sequence[nn.Module],
        weights: Sequence[float],
        chain: Sequence[str],
        k: int,
    ) -> None:
        super().__init__()
        self.merged = merged
        self.clients = nn.ModuleList(clients)
        self.weights = list(normalised_weights(weights, len(clients)))
        self.chain = list(chain)
        self.k = int(k)

    @property
    def layer(self) -> str:
        """The layer whose output is averaged over the clients."""
        return self.chain[self.k]

    @property
    def parameter_count(self) -> int:
        """Parameters PFM needs: the merged model's plus :math:`N - 1` more copies of the layers
        up to and including :attr:`layer`; with :math:`k = 0` only the merged model's (the
        average of the first layer's pre-activations is the merged first layer's)."""
        total = sum(p.numel() for p in self.merged.parameters())
        if self.k == 0:
            return total
        early = tuple(f"{layer}." for layer in self.chain[: self.k + 1])
        kept = sum(p.numel() for n, p in self.merged.named_parameters() if n.startswith(early))
        return total + (len(self.clients) - 1) * kept

    def _layer_output(self, model: nn.Module, x: Tensor) -> Tensor:
        """``model``'s output of :attr:`layer` on ``x`` (the rest of the forward pass skipped)."""
        captured: list[Tensor] = []

        def hook(_module: nn.Module, _inputs: tuple, output: Tensor) -> None:
            captured.append(output)
            raise StopForward

        handle = dict(model.named_modules())[self.layer].register_forward_hook(hook)
        try:
            model(x)
        except StopForward:
            pass
        finally:
            handle.remove()
        return captured[0]

    def forward(self, x: Tensor) -> Tensor:
        pairs = zip(self.weights, self.clients, strict=True)
        mixed = torch.stack([w * self._layer_output(c, x) for w, c in pairs]).sum(0)
        module = dict(self.merged.named_modules())[self.layer]
        handle = module.register_forward_hook(lambda _m, _inputs, _output: mixed)
        try:
            return self.merged(x)
        finally:
            handle.remove()


def preserve_first(
    template: nn.Module,
    states: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float] | None = None,
    layers: int = PFM_LAYERS,
) -> PreserveFirstModel:
    r"""PFM of the clients ``states`` (already in a common basis) with ``layers`` = :math:`k`
    preserved layers, :math:`0 \le k \le L - 1` for a chain of :math:`L` layers (see the module
    docstring), in eval mode. ``ValueError`` for a model that is not a plain chain, has
    BatchNorm layers (their averaged running statistics would need re-estimating) or a
    :math:`k` out of range.
    """
    name = type(template).__name__
    chain = chain_layers(permutation_spec(template), template.state_dict())
    if chain is None or has_batchnorm(template):
        raise ValueError(
            f"preserve_first: model {name!r} is not supported; allowed: plain feed-forward "
            "chains without BatchNorm (MLP, VGG-11 with norm = 'none')"
        )
    if not 0 <= layers <= len(chain) - 1:
        raise ValueError(f"preserve_first: layers = {layers}; allowed: 0 to {len(chain) - 1}")
    w = normalised_weights(weights, len(states))
    merged = load_state(template, average(states, w))
    clients = [load_state(template, sd) for sd in states]
    return PreserveFirstModel(merged, clients, w, chain, layers).eval()
