"""A merge that is a model of another architecture (``builds_model``: ``preserve_first``) in the
study (fedlmc.study.merge, compare, diagnostic_columns): its raw and ``_t`` rows evaluate that
model (finite accuracy, a temperature fitted on its logits), its barrier, path and LEWC columns
are NaN with the reason stated, ``merged_parameters_ratio`` is ``1 + (N - 1) P_early / P`` (1 for
a template-shaped merge, N for the ensembles) and no template state dict is kept for it."""

from __future__ import annotations

import math

import pytest
import torch

from fedlmc.data.loading import from_arrays
from fedlmc.evaluation import predict_logits
from fedlmc.merging.baselines.preserve_first import PFM_LAYERS, preserve_first
from fedlmc.merging.calibrate import fit_temperature
from fedlmc.models.classifiers import build_model
from fedlmc.study.compare import compare_methods
from fedlmc.study.diagnostic_columns import NOT_TEMPLATE_REASON

SHAPE = (1, 4, 4)
METHODS = ["average", "preserve_first", "preserve_first_t", "ensemble"]
PATHS = ("loss_barrier_half", "loss_barrier_max_calibrated", "accuracy_barrier_half")
CLIENT_PATHS = ("client_to_merge_path_loss_barrier_half_mean",)
LEWC = ("lewc_error_mean", "llfc_cos_mean", "logit_norm_ratio_logit_ensemble")


def mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", width=0.125, depth=2, in_shape=SHAPE)


def splits():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(160, *SHAPE, generator=g)
    y = torch.randint(0, 10, (160,), generator=g)
    return from_arrays(x[:100], y[:100], x[100:], y[100:], num_classes=10, server_fraction=0.3)


def expected_ratio(template: torch.nn.Module, clients: int) -> float:
    """``1 + (N - 1) P_early / P``: the first two Linear layers (k = 1 preserved, the second's
    outputs averaged) are held once per client."""
    early = ("hidden.0.", "hidden.1.")
    named = dict(template.named_parameters())
    total = sum(p.numel() for p in named.values())
    kept = sum(p.numel() for n, p in named.items() if n.startswith(early))
    assert kept and kept < total  # the names above are the MLP's first two layers
    return 1 + (clients - 1) * kept / total


@pytest.mark.parametrize("clients", [2, 3])
def test_its_rows_evaluate_the_built_model_and_leave_paths_and_lewc_nan(clients):
    template = mlp(0)
    states = [mlp(seed).state_dict() for seed in range(clients)]
    data = splits()
    found = compare_methods(template, states, None, data, METHODS, lambdas=3, diagnostic_samples=16)
    rows = {row["method"]: row for row in found.rows}
    raw, calibrated, plain = rows["preserve_first"], rows["preserve_first_t"], rows["average"]
    assert math.isfinite(raw["accuracy"]) and raw["accuracy"] == calibrated["accuracy"]
    assert raw["temperature"] == 1.0 and calibrated["temperature"] != 1.0
    assert calibrated["nll"] == calibrated["nll_calibrated"]
    pfm = preserve_first(template, states, None, PFM_LAYERS)  # T: fitted on this model's logits
    server_x, server_y = data.server
    fitted = fit_temperature(predict_logits(pfm, server_x, device="cpu"), server_y)
    assert calibrated["temperature"] == pytest.approx(float(fitted), rel=1e-6)
    assert raw["nll_raw"] != pytest.approx(plain["nll_raw"], rel=1e-4)  # not the average
    assert raw["merge_gap_loss"] == pytest.approx(raw["nll_raw"] - raw["endpoint_nll_mean"])
    assert raw["merged_parameters_ratio"] == pytest.approx(expected_ratio(template, clients))
    assert plain["merged_parameters_ratio"] == 1.0
    assert rows["ensemble"]["merged_parameters_ratio"] == clients
    paths = PATHS if clients == 2 else CLIENT_PATHS
    assert all(math.isfinite(plain[c]) for c in paths + LEWC)  # measured for the average
    assert all(math.isnan(row[c]) for row in (raw, calibrated) for c in paths + LEWC)
    assert raw["curve"] == "" and raw["lewc_error_layers"] == ""
    assert (
        raw["lewc_undefined_reason"] == NOT_TEMPLATE_REASON and plain["lewc_undefined_reason"] == ""
    )
    assert math.isfinite(raw["recip_orth_mean"])  # the clients' own columns stay
    assert sorted(found.merged) == ["average"]  # no template state dict to save for it
