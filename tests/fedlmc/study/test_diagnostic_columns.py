r"""fedlmc.study.diagnostic_columns: on two identical clients at weights 1/2 every merge rule
keeps the function, so LLFC's prediction is exact and LEWC's is the same direction scaled by
:math:`\sum_i w_i^l = 2^{1-l}`: its logit ratio is :math:`2^{1-L}` and the plain average's bias
misses LEWC's by :math:`2^{l-1} - 1` at depth :math:`l` (0 for ``average_lewc_bias``); LEWC is
undefined, with the reason, for a residual or untraceable model; stable ranks by hand."""

from __future__ import annotations

import json

import pytest
import torch
from torch import Tensor, nn

from fedlmc.data.splits import DataSplits
from fedlmc.models.classifiers import build_model
from fedlmc.study.compare import study_context
from fedlmc.study.diagnostic_columns import (
    diagnostic_columns,
    lewc_measured_on,
    lewc_undefined_reason,
    stable_rank_columns,
)
from fedlmc.study.merge import merge_in_context


def splits() -> DataSplits:
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(60, 1, 4, 4, generator=g), torch.randint(0, 10, (60,), generator=g)
    return DataSplits(
        "constructed", (x[:20], y[:20]), (x[20:40], y[20:40]), (x[40:], y[40:]), 10, (1, 4, 4)
    )


def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", width=0.125, in_shape=(1, 4, 4), norm="none", bias=True).eval()


@pytest.fixture(scope="module")
def twins():
    """Two identical clients (weights 1/2 each) of a 4-layer MLP."""
    state = mlp(1).state_dict()
    return study_context(
        mlp(0), [state, state], None, splits(), device=torch.device("cpu"), diagnostic_samples=16
    )


def test_identical_clients_make_llfc_exact_and_lewc_a_scaled_copy(twins):
    columns = diagnostic_columns(twins, merge_in_context(twins, "average"))
    depth = len(twins.layer_names)
    assert columns["llfc_cos_mean"] == pytest.approx(1.0)
    assert columns["lewc_cos_mean"] == pytest.approx(1.0)  # the same direction ...
    assert columns["lewc_temperature_ratio"] == pytest.approx(2 * 0.5**depth)  # ... scaled
    assert columns["logit_norm_ratio_logit_ensemble"] == pytest.approx(1.0)
    assert columns["logit_norm_ratio_client_norms"] == pytest.approx(1.0)
    assert json.loads(columns["norm_ratio_layers"]) == pytest.approx([1.0] * depth)
    assert columns["relu_additivity_mean"] == pytest.approx(0.0, abs=1e-7)
    assert columns["lewc_undefined_reason"] == ""
    assert columns["lewc_measured_on"] == "combined weights (the evaluated merge)"
    assert len(json.loads(columns["lewc_error_layers_quarter"])) == depth  # two clients: 1/4


def test_the_bias_mismatch_grows_as_two_to_the_depth_and_vanishes_for_the_lewc_rule(twins):
    plain = diagnostic_columns(twins, merge_in_context(twins, "average"))
    mismatch = json.loads(plain["lewc_bias_mismatch_layers"])
    assert mismatch == pytest.approx([2.0**depth / 2 - 1 for depth in range(1, len(mismatch) + 1)])
    lewc = diagnostic_columns(twins, merge_in_context(twins, "average_lewc_bias"))
    assert json.loads(lewc["lewc_bias_mismatch_layers"]) == pytest.approx([0.0] * len(mismatch))


class Gate(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x if x.sum() > 0 else -x


def test_lewc_is_undefined_with_its_reason_for_residual_and_untraceable_models():
    x = torch.rand(4, 3, 8, 8)
    resnet = build_model("resnet20", width=0.25, in_shape=(3, 8, 8), norm="none")
    reason = lewc_undefined_reason(resnet, None, x, resnet.layer_names)
    assert "not one plain chain (residual)" in reason
    gated = nn.Sequential(nn.Flatten(), nn.Linear(4, 4), Gate(), nn.Linear(4, 2))
    reason = lewc_undefined_reason(gated, None, torch.rand(4, 4), ["2", "3"])
    assert reason.startswith("no permutation spec to find the layers' depths: cannot trace")
    plain = mlp(0)
    assert lewc_undefined_reason(plain, None, torch.rand(4, 1, 4, 4), plain.layer_names) == ""


def test_measured_on_names_what_the_row_adds_after_the_combined_weights(twins):
    merged = merge_in_context(twins, "average")
    assert lewc_measured_on(merged) == "combined weights (the evaluated merge)"
    repaired = merge_in_context(twins, "average_repair")
    assert lewc_measured_on(repaired) == "combined weights, before REPAIR"


def test_stable_ranks_are_averaged_over_clients_and_leave_out_the_head():
    states = [
        {"a.weight": torch.ones(3, 4), "h.weight": torch.eye(2)},  # rank one: stable rank 1
        {"a.weight": torch.eye(3), "h.weight": torch.ones(2, 2)},  # identity: stable rank 3
    ]
    assert stable_rank_columns(states, head="h") == {"stable_rank_layers": "[2.0]"}
