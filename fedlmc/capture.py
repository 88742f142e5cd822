"""The layers of a model that carry weights: what REPAIR rescales and the diagnostics read."""

from __future__ import annotations

from torch import nn


def linear_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Linear and Conv1d/2d/3d modules of ``model`` in ``named_modules`` order."""
    kinds = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    return {n: m for n, m in model.named_modules() if isinstance(m, kinds)}
