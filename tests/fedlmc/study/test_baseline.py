r"""fedlmc.study.baseline: the ensembles every merge is compared with: identical clients make
both ensembles the client itself (agreement 1, no gap, the same T); otherwise the probability
ensembles are computed by hand (:math:`\sum_i w_i \mathrm{softmax}(z_i)`, the equal-weight
mean, each member at its own server-fitted :math:`T_i`), and the reference row's gaps and
ratios follow from the baseline."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedlmc.data.splits import DataSplits
from fedlmc.merging.calibrate import fit_temperature
from fedlmc.study.baseline import (
    AGREEMENT_COLUMNS,
    ClientBaseline,
    agreement_columns,
    client_baseline,
    reference_row,
    temperature_columns,
)
from fedlmc.study.compare import study_context


def splits() -> DataSplits:
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(90, 1, 4, 4, generator=g), torch.randint(0, 10, (90,), generator=g)
    return DataSplits(
        "constructed", (x[:30], y[:30]), (x[30:60], y[30:60]), (x[60:], y[60:]), 10, (1, 4, 4)
    )


def linear(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 10)).eval()


def context_of(seeds, weights=None):
    states = [linear(s).state_dict() for s in seeds]
    return study_context(
        linear(0), states, weights, splits(), device=torch.device("cpu"), diagnostics=False
    )


def test_identical_clients_make_both_ensembles_the_client_itself():
    context = context_of((1, 1))
    baseline = client_baseline(context)
    common = baseline.common
    assert common["ensemble_acc"] == pytest.approx(common["endpoint_acc_mean"])
    assert common["logit_ensemble_acc"] == pytest.approx(common["endpoint_acc_mean"])
    assert common["logit_ensemble_temperature"] == pytest.approx(
        common["endpoint_temperature_mean"], rel=1e-4
    )
    for method in ("ensemble", "logit_ensemble"):
        row = reference_row(context, baseline, method)
        assert row["merge_gap_accuracy"] == pytest.approx(0.0, abs=1e-12)
        assert row["merge_gap_loss"] == pytest.approx(0.0, abs=1e-6)
        assert row[AGREEMENT_COLUMNS["ensemble"]] == row[AGREEMENT_COLUMNS["logit_ensemble"]] == 1.0
        assert row["merged_parameters_ratio"] == 2.0


def test_the_probability_ensemble_is_the_weighted_mean_of_the_softmaxes():
    context = context_of((1, 2, 3), weights=[1, 1, 2])
    baseline = client_baseline(context)
    x, y = context.splits.test
    with torch.no_grad():
        probs = sum(
            w * linear(s)(x).softmax(dim=1)
            for w, s in zip((0.25, 0.25, 0.5), (1, 2, 3), strict=True)
        )
    assert torch.equal(baseline.top1["ensemble"], probs.argmax(dim=1))
    accuracy = float((probs.argmax(dim=1) == y).double().mean())
    assert baseline.common["ensemble_acc"] == pytest.approx(accuracy)
    nll = float(-probs[torch.arange(len(y)), y].log().mean())
    assert baseline.common["ensemble_nll"] == pytest.approx(nll, rel=1e-5)
    row = reference_row(context, baseline, "ensemble")
    assert row["merge_gap_accuracy"] == pytest.approx(
        baseline.common["endpoint_acc_mean"] - accuracy
    )
    assert len(baseline.endpoints) == 3 and row["num_clients"] == 3


def test_agreement_is_the_fraction_of_equal_top1_labels():
    top1 = {"ensemble": torch.tensor([0, 1, 2, 3]), "logit_ensemble": torch.tensor([0, 0, 0, 0])}
    assert agreement_columns(top1, torch.tensor([0, 1, 0, 0])) == {
        "agreement_prob_ensemble": 0.5,
        "agreement_logit_ensemble": 0.75,
    }


def test_temperature_ratios_divide_the_merges_t_by_the_baselines():
    baseline = ClientBaseline(
        (), {}, {}, {"endpoint_temperature_mean": 2.0, "logit_ensemble_temperature": 4.0}
    )
    assert temperature_columns(baseline, 3.0) == {
        "merge_temperature": 3.0,
        "temperature_ratio_endpoints": 1.5,
        "temperature_ratio_logit_ensemble": 0.75,
    }


def _by_hand(context, seeds, weights, temperatures=None):
    """The test-split ensemble of the members ``linear(seed)`` computed here:
    ``sum_i w_i softmax(z_i / T_i)``, and its accuracy and NLL."""
    x, y = context.splits.test
    temperatures = temperatures or [1.0] * len(seeds)
    with torch.no_grad():
        probs = sum(
            w * (linear(s)(x).double() / t).softmax(dim=1)
            for w, s, t in zip(weights, seeds, temperatures, strict=True)
        )
    accuracy = float((probs.argmax(dim=1) == y).double().mean())
    return accuracy, float(-probs[torch.arange(len(y)), y].log().mean())


def test_the_equal_weight_ensemble_is_the_plain_mean_of_the_softmaxes():
    """With weights 3 : 1 the ``ensemble_equal`` row is (1/2) sum softmax(z_i), not the
    weighted ensemble, and every row carries its accuracy."""
    context = context_of((1, 2), weights=[3, 1])
    baseline = client_baseline(context)
    accuracy, nll = _by_hand(context, (1, 2), (0.5, 0.5))
    row = reference_row(context, baseline, "ensemble_equal")
    assert row["accuracy"] == pytest.approx(accuracy) and row["temperature"] == 1.0
    assert row["nll"] == pytest.approx(nll, rel=1e-9) and row["nll_raw"] == row["nll"]
    assert baseline.common["ensemble_equal_acc"] == row["accuracy"]
    _, weighted = _by_hand(context, (1, 2), (0.75, 0.25))
    assert abs(nll - weighted) > 1e-3  # the weights matter in this example
    assert reference_row(context, baseline, "ensemble")["nll"] == pytest.approx(weighted, rel=1e-9)
    assert row["merged_parameters_ratio"] == 2.0 and row["server_sees"] == "each model"


def test_the_calibrated_ensemble_tempers_each_member_with_its_own_temperature():
    """``ensemble_calibrated`` is ``sum_i w_i softmax(z_i / T_i)`` with ``T_i`` member ``i``'s
    own temperature fitted on the server split; its raw columns are the members at T = 1."""
    seeds, weights = (1, 2, 3), (0.25, 0.25, 0.5)
    context = context_of(seeds, weights=[1, 1, 2])
    x_server, y_server = context.splits.server
    with torch.no_grad():
        own = [fit_temperature(linear(s)(x_server), y_server) for s in seeds]
    assert max(own) / min(own) > 1.05  # the members' temperatures differ here
    baseline = client_baseline(context)
    accuracy, nll = _by_hand(context, seeds, weights, own)
    row = reference_row(context, baseline, "ensemble_calibrated")
    assert row["accuracy"] == pytest.approx(accuracy)
    assert row["nll"] == row["nll_calibrated"] == pytest.approx(nll, rel=1e-6)
    mean_t = sum(own) / len(own)  # one shared T would give another ensemble
    assert abs(_by_hand(context, seeds, weights, [mean_t] * 3)[1] - nll) > 1e-4
    assert row["nll_raw"] == pytest.approx(_by_hand(context, seeds, weights)[1], rel=1e-9)
    assert math.isnan(row["temperature"])
    assert baseline.common["ensemble_calibrated_acc"] == row["accuracy"]
    endpoints = sum(e["nll_calibrated"] for e in baseline.endpoints) / 3
    assert row["merge_gap_loss_calibrated"] == pytest.approx(row["nll_calibrated"] - endpoints)
