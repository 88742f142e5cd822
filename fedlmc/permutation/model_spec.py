r"""The permutation spec of a model: its own ``permutation_spec()``, or derived from its graph.

See :mod:`fedlmc.permutation` for what a spec is and :mod:`fedlmc.permutation.tracing` for the
derivation.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from fedlmc.permutation import tracing as spec_tracing
from fedlmc.permutation.spec import (
    PermutationSpec,
)


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
    model: nn.Module,
    example_input: Tensor | tuple[Tensor, ...],
    *,
    seed: int = 0,
    declared: PermutationSpec | None = None,
) -> PermutationSpec:
    """The spec of ``model`` derived from its torch.fx graph and checked on ``example_input``,
    with the ``declared`` groups added for what the graph cannot tell (attention heads).

    See :func:`fedlmc.permutation.tracing.derive_spec`.
    """
    return spec_tracing.derive_spec(model, example_input, seed=seed, declared=declared)


def derive_layer_names(model: nn.Module, example_input: Tensor | tuple[Tensor, ...]) -> list[str]:
    """The modules whose outputs are the LEWC layer outputs, derived from the graph.

    See :func:`fedlmc.permutation.tracing.derive_layer_names`.
    """
    return spec_tracing.derive_layer_names(model, example_input)
