"""LEWC cosine, reciprocal orthogonality, ReLU additivity and weight ranks."""

import math

import pytest
import torch

from fedlmc.diagnostics import (
    apply_without_bias,
    effective_rank,
    lewc_cosine,
    linear_layers,
    reciprocal_orthogonality,
    relu_additivity_error,
    stable_rank,
    weight_ranks,
)
from fedlmc.merge import average, load_state
from fedlmc.models import build_model


def _mlp(seed: int, width: float = 0.125, **options):
    torch.manual_seed(seed)
    return build_model("mlp", width=width, bias=False, **options)


def _inputs(n: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 1, 28, 28, generator=torch.Generator().manual_seed(seed))


def test_lewc_cosine_is_one_when_merging_a_model_with_itself():
    model = _mlp(0)
    sd = model.state_dict()
    cosines = lewc_cosine(model, [sd, sd], [0.5, 0.5], average([sd, sd]), _inputs())
    assert len(cosines) == len(model.layer_names) == 4
    assert all(c == pytest.approx(1.0, abs=1e-9) for c in cosines)


def test_lewc_cosine_is_one_for_positively_rescaled_layers():
    # theta_b = theta_a with layer k scaled by c_k > 0: by positive homogeneity of ReLU every layer
    # output of a, b and of any average is a positive multiple of f_l(x; theta_a)
    model = _mlp(1)
    sd_a = model.state_dict()
    scales = [0.5, 3.0, 1.7, 0.2]
    sd_b = {key: value * scales[i] for i, (key, value) in enumerate(sd_a.items())}
    merged = average([sd_a, sd_b], [0.3, 0.7])
    cosines = lewc_cosine(model, [sd_a, sd_b], [3, 7], merged, _inputs())
    assert all(c == pytest.approx(1.0, abs=1e-9) for c in cosines)


def test_lewc_cosine_is_clearly_below_one_for_independent_narrow_models():
    a, b = _mlp(2), _mlp(3)
    sds = [a.state_dict(), b.state_dict()]
    cosines = lewc_cosine(a, sds, None, average(sds), _inputs())
    assert all(-1.0 <= c <= 1.0 for c in cosines)
    assert max(cosines[1:]) < 0.99
    with pytest.raises(ValueError, match="layer_names"):
        lewc_cosine(torch.nn.Linear(2, 2), sds, None, sds[0], _inputs())


def test_reciprocal_orthogonality_is_one_for_identical_models_including_convs():
    torch.manual_seed(4)
    model = build_model("resnet20", width=0.125, in_shape=(1, 28, 28))
    rows = reciprocal_orthogonality(model, load_state(model, model.state_dict()), _inputs(8))
    assert [r["layer"] for r in rows] == list(linear_layers(model))
    assert (
        any("shortcut" in r["layer"] or "downsample" in r["layer"] for r in rows) or len(rows) > 19
    )
    for row in rows:
        assert row["ratio_ab"] == pytest.approx(1.0, abs=1e-9)
        assert row["ratio_ba"] == pytest.approx(1.0, abs=1e-9)


def test_apply_without_bias_reproduces_strided_convolution():
    conv = torch.nn.Conv2d(3, 5, 3, stride=2, padding=1, bias=True).double()
    z = torch.randn(2, 3, 9, 9, dtype=torch.float64)
    expected = conv(z) - conv.bias[None, :, None, None]
    torch.testing.assert_close(apply_without_bias(conv, z), expected.detach())


def test_reciprocal_orthogonality_is_zero_for_orthogonal_hidden_subspaces():
    a, b = _mlp(5, 1.0, depth=1, base_hidden=4), _mlp(6, 1.0, depth=1, base_hidden=4)
    a_sd, b_sd = a.state_dict(), b.state_dict()
    hidden, head = "hidden.0.linear.weight", "classifier.weight"
    with torch.no_grad():
        a_sd[hidden].abs_()[2:] = 0  # a uses hidden units 0, 1 only
        a_sd[head][:, 2:] = 0
        b_sd[hidden].abs_()[:2] = 0  # b uses hidden units 2, 3 only
        b_sd[head][:, :2] = 0
    a.load_state_dict(a_sd)
    b.load_state_dict(b_sd)
    rows = reciprocal_orthogonality(a, b, _inputs())
    assert [r["layer"] for r in rows] == ["hidden.0.linear", "classifier"]
    assert rows[0]["ratio_ab"] == pytest.approx(1.0) and rows[0]["ratio_ba"] == pytest.approx(1.0)
    assert rows[1]["ratio_ab"] == 0.0 and rows[1]["ratio_ba"] == 0.0


def test_relu_additivity_error_is_zero_for_equal_inputs_and_one_for_opposite_inputs():
    a = _mlp(7, depth=1)
    assert relu_additivity_error(a, load_state(a, a.state_dict()), _inputs()) == [0.0]
    negated = {k: (-v if k == "hidden.0.linear.weight" else v) for k, v in a.state_dict().items()}
    b = load_state(a, negated)  # z_b = -z_a: relu(0) = 0 but the mixture of relus is |z| / 2
    assert relu_additivity_error(a, b, _inputs(), lam=0.5) == [pytest.approx(1.0)]
    errors = relu_additivity_error(_mlp(8), _mlp(9), _inputs(), lam=0.3)
    assert len(errors) == 3 and all(0 < e < math.inf for e in errors)


def test_ranks_of_matrices_with_known_rank():
    assert stable_rank(torch.eye(7)) == pytest.approx(7.0)
    assert effective_rank(torch.eye(7)) == pytest.approx(7.0)
    rank_one = torch.randn(6, 1) @ torch.randn(1, 9)
    assert stable_rank(rank_one) == pytest.approx(1.0, rel=1e-6)
    assert effective_rank(rank_one) == pytest.approx(1.0, rel=1e-6)
    diag = torch.diag(torch.tensor([3.0, 4.0]))
    assert stable_rank(diag) == pytest.approx(25 / 16)
    p = torch.tensor([3 / 7, 4 / 7])
    assert effective_rank(diag) == pytest.approx(math.exp(-(p * p.log()).sum().item()))
    conv = torch.zeros(4, 2, 3, 3)
    conv[:, 0, 1, 1] = torch.tensor([1.0, 2.0, 3.0, 4.0])  # rank 1 after reshape to (4, 18)
    assert stable_rank(conv) == pytest.approx(1.0)
    assert stable_rank(torch.zeros(3, 3)) == 0.0 and effective_rank(torch.zeros(3, 3)) == 0.0
    with pytest.raises(ValueError, match="shape"):
        stable_rank(torch.ones(3))


def test_weight_ranks_lists_every_weight_matrix():
    model = build_model("mlp", width=0.125)
    table = weight_ranks(model.state_dict())
    weights = [k for k, v in model.state_dict().items() if v.ndim >= 2]
    assert list(table["key"]) == weights
    for _, row in table.iterrows():
        w = model.state_dict()[row["key"]]
        assert row["stable_rank"] == pytest.approx(stable_rank(w))
        assert 1.0 <= row["stable_rank"] <= row["effective_rank"] <= min(w.shape) + 1e-9
