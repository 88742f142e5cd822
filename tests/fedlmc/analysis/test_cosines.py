"""fedlmc.analysis.cosines: MeasuredOutput gives exactly what the functions give (it only computes
the measured side once), and layer_predictions(lewc=False) leaves the LEWC entries NaN and every
other entry as it is with LEWC."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedlmc.analysis.cosines import (
    MeasuredOutput,
    centred_cosine,
    mean_cosine,
    shuffled_cosine,
)
from fedlmc.analysis.diagnostics import layer_predictions
from fedlmc.averaging import average
from fedlmc.models.classifiers import build_model


def _relu_maps(n: int, seed: int) -> torch.Tensor:
    """Conv-like float64 ReLU outputs (n, 4, 5, 5): channel 0 constant over the samples, one
    sample all zeros."""
    g = torch.Generator().manual_seed(seed)
    t = torch.relu(torch.randn(n, 4, 5, 5, generator=g, dtype=torch.float64))
    t[:, 0] = 0.75
    t[n // 2] = 0.0
    return t


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("n", [1, 9])
def test_measured_output_gives_the_functions_numbers_bit_for_bit(n):
    measured = _relu_maps(n, 0)
    out = MeasuredOutput(measured)
    for seed in (1, 2):  # the same cached measured side against two predictions
        prediction = _relu_maps(n, seed).float()
        assert _same(out.cosine(prediction), mean_cosine(measured, prediction))
        assert _same(out.centred_cosine(prediction), centred_cosine(measured, prediction))
        assert _same(out.shuffled_cosine(prediction), shuffled_cosine(measured, prediction))
    assert out.norm() == float(measured.norm())
    # one sample has no other to be paired with; with 9 the zero sample is only left out
    assert math.isnan(out.shuffled_cosine(prediction)) == (n == 1)


class _Residual(nn.Module):
    """A residual block: LEWC's depth exponent is undefined here."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.block, self.head = nn.Linear(12, 16), nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x.flatten(1)))
        return self.head(torch.relu(h + self.block(h)))


@pytest.mark.parametrize("kind", ["mlp", "residual"])
def test_without_lewc_the_lewc_entries_are_nan_and_the_others_unchanged(kind):
    def model(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return build_model("mlp", width=0.125, bias=False) if kind == "mlp" else _Residual()

    template, other = model(0), model(1)
    states = [template.state_dict(), other.state_dict()]
    shape = (32, 1, 28, 28) if kind == "mlp" else (32, 12)
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(0))
    names = None if kind == "mlp" else ["stem", "block", "head"]
    weights = [0.25, 0.75]
    merged = average(states, weights)
    full = layer_predictions(template, states, weights, merged, x, names)
    llfc_only = layer_predictions(template, states, weights, merged, x, names, lewc=False)
    assert [list(r) for r in llfc_only] == [list(r) for r in full]  # same entries, same order
    for with_lewc, without in zip(full, llfc_only, strict=True):
        for key, value in without.items():
            if key.startswith("lewc_"):
                assert math.isnan(value) and not math.isnan(with_lewc[key])
            else:
                assert value == with_lewc[key] or _same(value, with_lewc[key]), key
