"""Bring your own model: a CNN with BatchNorm and a residual block, merged in a Flower simulation.

No permutation spec is written by hand: fedlmc derives it from the model's torch.fx graph (and
checks it), derives the layer outputs the diagnostics observe, and aligns the two clients by
weight matching and by activation matching. Run from the repository root:

    python examples/custom_cnn.py
"""

from pathlib import Path

import torch
from torch import nn


class ResidualCNN(nn.Module):
    """conv-BN-ReLU stem, one residual block (conv-BN-ReLU-conv-BN + skip, ReLU), GAP, linear."""

    def __init__(self, channels: int, num_classes: int, in_channels: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
        )
        self.block = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
        )
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = self.relu(h + self.block(h))
        return self.head(torch.flatten(self.pool(h), 1))


def make_net(
    width: float, num_classes: int, in_shape: tuple[int, int, int], norm: str
) -> nn.Module:
    """The factory the run config names: ``model = "examples/custom_cnn.py:make_net"``."""
    return ResidualCNN(max(1, round(16 * width)), num_classes, in_shape[0])


if __name__ == "__main__":
    from fedlmc.simulations import run_federation

    rows = run_federation(
        {
            "model": f"{Path(__file__).resolve()}:make_net",
            "width": 1.0,
            "epochs": 8,
            "methods": "average_t,weight_matching_t,activation_matching_t,ensemble",
            "lambdas": 3,  # the path at 0, 1/2, 1: the barrier at 1/2 is what it prints
        }
    )
    shown = ["method", "accuracy", "nll", "loss_barrier_half_calibrated", "llfc_cos_mean"]
    print(rows[shown].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    # a residual block has no single depth exponent: the LEWC columns are NaN, and say why
    print("LEWC:", rows["lewc_undefined_reason"].iloc[0])
    # what the alignment did (0 groups: nothing was permuted, the row is the plain average)
    aligned = rows.set_index("method")["aligned_groups"].dropna().astype(int)
    print("permutation groups aligned:", aligned.to_dict())
