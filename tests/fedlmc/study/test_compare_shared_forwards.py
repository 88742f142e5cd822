"""compare_methods' shared forward passes: a path's endpoints and midpoint are the clients and
the merge the rows predicted already, every diagnostic of a model reads one pass over the
diagnostic inputs, and every row value equals the unshared computation's."""

from __future__ import annotations

import math

import pytest
import torch

from fedlmc.data.splits import DataSplits
from fedlmc.models.classifiers import build_model
from fedlmc.study.compare import compare_methods

QUICK_METHODS = [
    "average",
    "average_t",
    "average_lewc_bias_t",
    "weight_matching",
    "weight_matching_t",
    "ensemble",
    "logit_ensemble",
]
TEST, SERVER, DIAGNOSTIC = 50, 40, 32  # distinct batch sizes tell the inputs apart


def splits() -> DataSplits:
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(150, 1, 4, 4, generator=g), torch.randint(0, 10, (150,), generator=g)
    return DataSplits(
        "constructed",
        (x[:60], y[:60]),
        (x[60 : 60 + SERVER], y[60 : 60 + SERVER]),
        (x[100:], y[100:]),
        10,
        (1, 4, 4),
    )


def mlp(seed: int, **options) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", width=0.25, num_classes=10, in_shape=(1, 4, 4), **options)


def compared(options: dict, methods: list[str], **kwargs):
    """Rows of two clients and the top-level forward passes per batch size."""
    states = [mlp(seed, **options).state_dict() for seed in (1, 2)]
    template = mlp(0, **options)
    passes: dict[int, int] = {}

    def hook(module, inputs, _output):
        if type(module) is type(template):
            passes[len(inputs[0])] = passes.get(len(inputs[0]), 0) + 1

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        rows = compare_methods(
            template,
            states,
            [1, 1],
            splits(),
            methods,
            lambdas=5,
            device="cpu",
            diagnostic_samples=DIAGNOSTIC,
            **kwargs,
        ).rows
    finally:
        handle.remove()
    return rows, passes


@pytest.mark.parametrize("options", [{"bias": False}, {"bias": True}, {"norm": "bn"}])
def test_every_row_value_equals_the_unshared_computation(options):
    methods = QUICK_METHODS if "norm" not in options else ["average_t", "weight_matching"]
    shared, _ = compared(options, methods)
    unshared, _ = compared(options, methods, share_forwards=False)
    assert [r["method"] for r in shared] == [r["method"] for r in unshared]
    for a, b in zip(shared, unshared, strict=True):
        for column, value in a.items():
            if column == "merge_seconds":
                continue
            other = b[column]
            if isinstance(value, float) and math.isnan(value):
                assert isinstance(other, float) and math.isnan(other), (a["method"], column)
            else:
                assert value == other, (a["method"], column, value, other)


def test_the_path_reuses_the_clients_and_the_merge():
    """lambdas = 5 on the plain average: lam = 1 and 0 are the clients the baseline predicted,
    lam = 1/2 the merge its row evaluated; only 1/4 and 3/4 are new. The test split is predicted
    5 times, not 2 + 1 + 5."""
    _, shared = compared({"bias": True}, ["average"])
    _, unshared = compared({"bias": True}, ["average"], share_forwards=False)
    assert (shared[TEST], unshared[TEST]) == (5, 8)
    assert (shared[SERVER], unshared[SERVER]) == (5, 8)  # each model's temperature, fitted once


def test_each_model_runs_once_over_the_diagnostic_inputs():
    """Biased clients, the plain average and the depth-weighted biases: the two clients, each
    merge and each merge's lambda = 1/4 point are 6 distinct models; unshared, every
    measurement ran its own passes (LEWC/LLFC at the merge and at 1/4, the logit norm ratio,
    dead units, bias shares, orthogonality and ReLU additivity, per merge)."""
    _, shared = compared({"bias": True}, ["average", "average_lewc_bias"])
    _, unshared = compared({"bias": True}, ["average", "average_lewc_bias"], share_forwards=False)
    assert shared[DIAGNOSTIC] == 6
    assert unshared[DIAGNOSTIC] > 4 * shared[DIAGNOSTIC]
