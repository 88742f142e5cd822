"""Tests of fedlmc.evaluation against hand-computed values and torch's own losses."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedlmc.evaluation import (
    ensemble_probs,
    evaluate,
    expected_calibration_error,
    metrics_from_logits,
    metrics_from_probs,
    predict_logits,
    resolve_device,
)


def random_logits(n: int = 50, classes: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, classes, generator=g) * 3, torch.randint(0, classes, (n,), generator=g)


def test_ece_matches_hand_computed_example():
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6]])
    labels = torch.tensor([0, 1, 1, 1])
    # 4 bins of width 0.25: confidences 0.9, 0.8 -> bin 3 (mean conf 0.85, accuracy 1/2);
    # 0.7, 0.6 -> bin 2 (mean conf 0.65, accuracy 1). ECE = 2/4*0.35 + 2/4*0.35 = 0.35.
    assert expected_calibration_error(probs, labels, n_bins=4) == pytest.approx(0.35)


def test_ece_puts_confidence_one_in_the_last_bin_and_is_zero_when_calibrated():
    probs = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert expected_calibration_error(probs, torch.tensor([0, 1])) == pytest.approx(0.0)
    assert expected_calibration_error(probs, torch.tensor([1, 0])) == pytest.approx(1.0)


def test_nll_matches_torch_cross_entropy():
    logits, labels = random_logits()
    for t in (0.5, 1.0, 3.0):
        expected = F.cross_entropy(logits.double() / t, labels).item()
        assert metrics_from_logits(logits, labels, t)["nll"] == pytest.approx(expected, rel=1e-12)


def test_temperature_changes_nll_but_not_accuracy():
    logits, labels = random_logits()
    base = metrics_from_logits(logits, labels)
    for t in (0.1, 0.7, 2.0, 50.0):
        other = metrics_from_logits(logits, labels, temperature=t)
        assert other["accuracy"] == base["accuracy"]
        assert other["nll"] != pytest.approx(base["nll"])


@pytest.mark.parametrize("t", [0.0, -1.0])
def test_non_positive_temperature_raises(t):
    logits, labels = random_logits()
    with pytest.raises(ValueError, match=str(t)):
        metrics_from_logits(logits, labels, temperature=t)


def test_metrics_from_probs_of_one_hot_correct_predictions():
    labels = torch.tensor([2, 0, 1, 1])
    metrics = metrics_from_probs(F.one_hot(labels, 3).float(), labels)
    assert metrics == {"accuracy": 1.0, "nll": 0.0, "ece": 0.0}


def test_metrics_from_probs_agrees_with_metrics_from_logits():
    logits, labels = random_logits()
    from_logits = metrics_from_logits(logits, labels)
    from_probs = metrics_from_probs(F.softmax(logits.double(), dim=1), labels)
    assert from_probs == pytest.approx(from_logits, rel=1e-9)


def test_ensemble_probs_rows_sum_to_one_and_match_weighted_softmax():
    members = [random_logits(seed=s)[0] for s in range(3)]
    probs = ensemble_probs(members, weights=[1.0, 2.0, 1.0])
    assert torch.allclose(probs.sum(dim=1), torch.ones(len(probs), dtype=probs.dtype))
    expected = sum(
        w * F.softmax(z.double(), dim=1) for w, z in zip([0.25, 0.5, 0.25], members, strict=True)
    )
    assert torch.allclose(probs, expected)
    uniform = ensemble_probs(members)
    assert torch.allclose(uniform, sum(F.softmax(z.double(), dim=1) for z in members) / 3)


def test_ensemble_probs_rejects_empty_and_bad_weights():
    members = [random_logits(seed=s)[0] for s in range(2)]
    with pytest.raises(ValueError, match="at least one"):
        ensemble_probs([])
    with pytest.raises(ValueError, match="-1.0"):
        ensemble_probs(members, weights=[2.0, -1.0])
    with pytest.raises(ValueError, match="2 members"):
        ensemble_probs(members, weights=[1.0])


def test_ensemble_probs_on_two_members_with_exact_values():
    """Member 1 gives (3/4, 1/4), member 2 (1/4, 3/4): the equal-weight ensemble is (1/2, 1/2),
    weights 3 : 1 give (5/8, 3/8); member 1 at T = 2 gives (sqrt 3, 1) / (sqrt 3 + 1)."""
    log3 = math.log(3.0)
    members = [
        torch.tensor([[log3, 0.0]], dtype=torch.float64),
        torch.tensor([[0.0, log3]], dtype=torch.float64),
    ]
    assert ensemble_probs(members)[0].tolist() == pytest.approx([0.5, 0.5], abs=1e-12)
    assert ensemble_probs(members, [3, 1])[0].tolist() == pytest.approx([0.625, 0.375], abs=1e-12)
    r = math.sqrt(3.0)
    tempered = [r / (r + 1), 1 / (r + 1)]
    expected = [0.75 * tempered[0] + 0.25 * 0.25, 0.75 * tempered[1] + 0.25 * 0.75]
    got = ensemble_probs(members, [3, 1], temperatures=[2.0, 1.0])
    assert got[0].tolist() == pytest.approx(expected, abs=1e-12)
    same = ensemble_probs(members, temperatures=[2.0, 2.0])  # equal weights, one T: symmetric
    assert same[0].tolist() == pytest.approx([0.5, 0.5], abs=1e-12)


def test_ensemble_probs_rejects_bad_temperatures():
    members = [random_logits(seed=s)[0] for s in range(2)]
    for bad in ([1.0], [1.0, 0.0], [1.0, -2.0], [1.0, float("nan")]):
        with pytest.raises(ValueError, match="2 members' finite positive numbers"):
            ensemble_probs(members, temperatures=bad)


def test_predict_logits_in_batches_equals_one_forward_and_evaluate_uses_them():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4)).train()
    x = torch.randn(37, 6)
    y = torch.randint(0, 4, (37,))
    logits = predict_logits(model, x, batch_size=5)
    assert not model.training
    with torch.no_grad():
        assert torch.allclose(logits, model(x), atol=1e-6)
    expected = metrics_from_logits(logits, y, 2.0)
    assert evaluate(model, (x, y), temperature=2.0) == pytest.approx(expected, rel=1e-6)


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None).type in {"cpu", "cuda"}
