r"""Hidden-unit permutations of networks (the symmetry Git Re-Basin aligns).

A ReLU network computes the same function after its hidden units are reordered, provided every
tensor that touches those units is reordered consistently. A :class:`PermutationSpec` lists, for
each permutation group ``p`` (one set of interchangeable hidden units), the ``(key, axis)`` pairs
of the state dict that carry those units. Applying permutations ``{p: \pi_p}`` means

.. math:: W'[\ldots, i, \ldots] = W[\ldots, \pi_p(i), \ldots]

on every listed axis, i.e. ``W.index_select(axis, perm)``: new unit ``i`` is old unit ``perm[i]``.
For a dense layer ``h = relu(W_1 x + b_1)``, ``y = W_2 h`` this is ``W_1' = P W_1``,
``b_1' = P b_1``, ``W_2' = W_2 P^T`` and ``y`` is unchanged. Input and output axes are never
permuted. Keys without a permuted axis (``num_batches_tracked``, the classifier bias) are copied.

Each built-in model has a hand-written ``permutation_spec()`` method that walks its own
submodules with :func:`unit_axes` / :func:`fan_in_axes`. For any other model,
:func:`derive_spec` derives the spec from the model's ``torch.fx`` graph
(:mod:`fedlmc.spec_tracing`), and :func:`check_spec` checks that a spec is a symmetry: permuting
every group leaves the model's outputs unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from fedlmc import spec_tracing
from fedlmc.spec_core import (
    Axis,
    PermutationSpec,
    StateDict,
    apply_permutation,
    check_spec,
    checked_permutations,
    example_args,
    fan_in_axes,
    identity_permutations,
    in_eval_mode,
    invert_permutation,
    perm_sizes,
    random_permutations,
    restrict_spec,
    spec_from_groups,
    unit_axes,
)
from fedlmc.spec_tracing import SpecDerivationWarning

__all__ = [
    "apply_permutation",
    "Axis",
    "check_spec",
    "checked_permutations",
    "derive_layer_names",
    "derive_spec",
    "example_args",
    "fan_in_axes",
    "identity_permutations",
    "in_eval_mode",
    "invert_permutation",
    "perm_sizes",
    "permutation_spec",
    "PermutationSpec",
    "random_permutations",
    "restrict_spec",
    "spec_from_groups",
    "SpecDerivationWarning",
    "StateDict",
    "unit_axes",
]


def permutation_spec(
    model: nn.Module, example_input: Tensor | tuple[Tensor, ...] | None = None
) -> PermutationSpec:
    """The permutation spec of ``model``.

    A model with a ``permutation_spec()`` method (every built-in model) gives its own spec;
    ``example_input`` is then ignored. Any other model gets a spec derived from its graph by
    :func:`derive_spec` on ``example_input``; without one, a model with
    ``model.config["in_shape"]`` is traced on a seeded random batch of 2 inputs of that shape.
    """
    builder = getattr(model, "permutation_spec", None)
    if callable(builder):
        return builder()
    if example_input is None:
        example_input = _config_example(model)
    if example_input is None:
        raise ValueError(
            f"model {type(model).__name__!r} has no permutation_spec() method and no "
            "example_input was given; allowed: models from fedlmc.models.build_model, or any "
            "torch.fx-traceable model with an example input"
        )
    return derive_spec(model, example_input)


def _config_example(model: nn.Module) -> Tensor | None:
    """A seeded random batch of 2 inputs of shape ``model.config["in_shape"]``, if it exists."""
    config = getattr(model, "config", None)
    shape = config.get("in_shape") if isinstance(config, Mapping) else None
    if not isinstance(shape, tuple | list) or not all(isinstance(n, int) for n in shape):
        return None
    tensor = next(iter(model.state_dict().values()), None)
    device = tensor.device if tensor is not None else torch.device("cpu")
    generator = torch.Generator().manual_seed(0)
    return torch.randn(2, *shape, generator=generator).to(device)


def derive_spec(
    model: nn.Module, example_input: Tensor | tuple[Tensor, ...], *, seed: int = 0
) -> PermutationSpec:
    """The spec of ``model`` derived from its torch.fx graph and checked on ``example_input``.

    See :func:`fedlmc.spec_tracing.derive_spec`.
    """
    return spec_tracing.derive_spec(model, example_input, seed=seed)


def derive_layer_names(model: nn.Module, example_input: Tensor | tuple[Tensor, ...]) -> list[str]:
    """The modules whose outputs are the LEWC layer outputs, derived from the graph.

    See :func:`fedlmc.spec_tracing.derive_layer_names`.
    """
    return spec_tracing.derive_layer_names(model, example_input)
