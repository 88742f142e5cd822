"""LEWC cosine and scale-aware predictions, reciprocal orthogonality, ReLU additivity, logit
shrinkage and weight ranks."""

import copy
import math

import pytest
import torch

from fedlmc.analysis.diagnostics import (
    apply_without_bias,
    effective_rank,
    hidden_weight_keys,
    layer_predictions,
    lewc_cosine,
    linear_layers,
    logit_norm_ratios,
    reciprocal_orthogonality,
    relu_additivity_error,
    scaled_error,
    stable_rank,
    stable_ranks,
    weight_ranks,
)
from fedlmc.averaging import average, load_state
from fedlmc.models.classifiers import build_model


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
    with pytest.raises(ValueError, match="layer_names is empty"):
        lewc_cosine(a, sds, None, sds[0], _inputs(), layer_names=[])


def test_a_model_without_layer_names_gets_them_from_its_graph():
    """A user's nn.Sequential: the hidden ReLUs and the output layer, as for the built-in MLP."""
    torch.manual_seed(0)
    user = torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(784, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 10),
    )
    other = copy.deepcopy(user)
    torch.manual_seed(1)
    for module in other:
        if isinstance(module, torch.nn.Linear):
            module.reset_parameters()
    sds = [{k: v.clone() for k, v in user.state_dict().items()}, other.state_dict()]
    x = _inputs()
    cosines = lewc_cosine(user, sds, None, average(sds), x)
    explicit = lewc_cosine(user, sds, None, average(sds), x, layer_names=["2", "4", "5"])
    assert cosines == explicit and len(cosines) == 3
    assert not torch.equal(sds[0]["1.weight"], sds[1]["1.weight"])


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


def test_apply_without_bias_convolves_a_float32_conv_in_float32_and_returns_float64():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 5, 3, padding=1, bias=True)
    z = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    out = apply_without_bias(conv, z)
    assert out.dtype == torch.float64
    # the layer's own float32 arithmetic, no bias: within float32 rounding of the float64 result
    weight = conv.weight.detach()
    float32 = torch.nn.functional.conv2d(z.float(), weight, None, 1, 1)
    assert torch.equal(out, float32.double())
    exact = torch.nn.functional.conv2d(z, weight.double(), None, 1, 1)
    torch.testing.assert_close(out, exact, rtol=1e-5, atol=1e-5)
    assert not torch.equal(out, exact)


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


def _disjoint_pair(hidden: int = 8, depth: int = 3, seed: int = 10):
    """Two bias-free ReLU MLPs whose hidden units live in disjoint coordinates.

    Model a uses the first half of every hidden layer, model b the second half; every weight that
    reads or writes the other half is zero. So W_a z_b = 0 and W_b z_a = 0 exactly (reciprocal
    orthogonality) and the merged hidden layers are block-diagonal.
    """
    half = hidden // 2
    template = _mlp(seed, 1.0, depth=depth, base_hidden=hidden)
    sds = []
    for own in (slice(0, half), slice(half, hidden)):
        torch.manual_seed(seed + 1 + own.start)
        sd = {k: torch.randn_like(v) for k, v in template.state_dict().items()}
        keep = torch.zeros(hidden, dtype=torch.bool)
        keep[own] = True
        for i in range(depth):
            weight = sd[f"hidden.{i}.linear.weight"]
            weight[~keep] = 0  # rows writing the other half
            if i > 0:
                weight[:, ~keep] = 0  # columns reading the other half
        sd["classifier.weight"][:, ~keep] = 0
        sds.append(sd)
    return template, sds


@pytest.mark.parametrize("lam", [0.5, 0.25])
def test_lewc_is_exact_under_reciprocal_orthogonality_and_llfc_only_up_to_scale(lam):
    template, sds = _disjoint_pair()
    x = _inputs(32)
    merged = average(sds, [lam, 1 - lam])
    rows = layer_predictions(template, sds, [lam, 1 - lam], merged, x)
    assert [r["layer"] for r in rows] == template.layer_names
    assert [r["depth"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        assert row["lewc_error"] < 1e-5, row
        assert row["lewc_cos"] == pytest.approx(1.0, abs=1e-9)
        assert row["norm_ratio"] == pytest.approx(row["lewc_norm_ratio"], rel=1e-5)
    assert rows[0]["llfc_scaled_error"] < 1e-5  # layer 1: both predictions coincide
    assert all(row["norm_ratio"] < 0.75 for row in rows[1:])  # the merged outputs shrink
    if lam == 0.5:  # LEWC's prediction is LLFC's times 2^(1-l): LLFC holds up to that scale
        assert all(row["llfc_scaled_error"] < 1e-5 for row in rows)
        assert all(row["llfc_cos"] == pytest.approx(1.0, abs=1e-9) for row in rows)
    else:  # at lambda = 1/4 the directions differ too, and only LEWC's is right
        assert all(row["llfc_scaled_error"] > 0.05 for row in rows[1:]), rows


def test_scaled_error_is_the_residual_of_the_best_positive_scale():
    f = torch.tensor([[3.0, 4.0]])
    assert scaled_error(f, 2 * f) == pytest.approx(0.0, abs=1e-12)
    assert scaled_error(f, torch.tensor([[1.0, 0.0]])) == pytest.approx(0.8)  # sqrt(1 - 0.6^2)
    assert scaled_error(f, -f) == 1.0  # no positive scale helps: c -> 0
    assert math.isnan(scaled_error(f, torch.zeros(1, 2)))
    torch.manual_seed(0)
    p = torch.randn(5, 7)
    measured = torch.randn(5, 7)
    best = min(
        float((measured - c * p).norm() / measured.norm()) for c in torch.linspace(0, 3, 3001)
    )
    assert scaled_error(measured, p) == pytest.approx(best, abs=1e-4)


def test_disjoint_pair_is_reciprocally_orthogonal():
    template, sds = _disjoint_pair()
    rows = reciprocal_orthogonality(
        load_state(template, sds[0]), load_state(template, sds[1]), _inputs()
    )
    assert all(r["ratio_ab"] == 0.0 and r["ratio_ba"] == 0.0 for r in rows[1:])


@pytest.mark.parametrize("weights", [[0.5, 0.5], [0.3, 0.7]])
def test_a_model_merged_with_itself_is_exact_for_llfc_only(weights):
    """theta merged with theta is theta: LLFC sum_i w_i f = f is exact, while LEWC predicts
    (sum_i w_i^l) f, a norm ratio sum_i w_i^l and a relative error |1 - sum_i w_i^l|."""
    model = _mlp(11)
    sd = model.state_dict()
    rows = layer_predictions(model, [sd, sd], weights, average([sd, sd], weights), _inputs())
    for row in rows:
        predicted_scale = sum(w ** row["depth"] for w in weights)
        assert row["llfc_scaled_error"] == pytest.approx(0.0, abs=1e-6)
        assert row["norm_ratio"] == pytest.approx(1.0, rel=1e-6)
        assert row["lewc_norm_ratio"] == pytest.approx(predicted_scale, rel=1e-9)
        assert row["lewc_error"] == pytest.approx(abs(1 - predicted_scale), rel=1e-6, abs=1e-9)
    assert rows[0]["lewc_error"] == pytest.approx(0.0, abs=1e-9)
    assert rows[-1]["lewc_error"] > 0.5


def test_layer_predictions_on_a_chosen_layer_list_and_bad_input():
    model = _mlp(12)
    sd = model.state_dict()
    rows = layer_predictions(model, [sd, sd], None, sd, _inputs(), layer_names=["classifier"])
    assert len(rows) == 1 and rows[0]["depth"] == 1 and rows[0]["lewc_error"] < 1e-6
    with pytest.raises(ValueError, match="not found"):
        layer_predictions(model, [sd], None, sd, _inputs(), layer_names=["nope"])
    with pytest.raises(ValueError, match="at least one"):
        layer_predictions(model, [], None, sd, _inputs())
    with pytest.raises(ValueError, match="weights"):
        layer_predictions(model, [sd, sd], [1.0], sd, _inputs())


def test_the_logit_norm_ratios_divide_by_the_mean_logits_norm_and_by_the_mean_of_the_norms():
    """A hand-computed example: one bias-free linear layer, inputs 1 and 2, client a writes the
    first logit, client b the second. The logit ensemble's logits are (x/2, x/2), norm
    x/sqrt(2); the clients' own norms are x. A merge of logits (x/4, x/4) is half the logit
    ensemble's (what LEWC predicts against) and 1/(2 sqrt 2) of the clients' own norms."""
    template = torch.nn.Linear(1, 2, bias=False)
    a = {"weight": torch.tensor([[1.0], [0.0]])}
    b = {"weight": torch.tensor([[0.0], [1.0]])}
    merged = {"weight": torch.tensor([[0.25], [0.25]])}
    x = torch.tensor([[1.0], [2.0]])
    ratios = logit_norm_ratios(template, [a, b], merged, x)
    assert ratios.logit_ensemble == pytest.approx(0.5, rel=1e-12)
    assert ratios.client_norms == pytest.approx(1 / (2 * math.sqrt(2)), rel=1e-12)
    # weights 3 : 1: the logit ensemble's logits are (3x/4, x/4), norm x sqrt(10)/4
    weighted = logit_norm_ratios(template, [a, b], merged, x, weights=[3, 1])
    assert weighted.logit_ensemble == pytest.approx((math.sqrt(2) / 4) / (math.sqrt(10) / 4))
    assert weighted.client_norms == ratios.client_norms  # both clients' norms are x
    # the logit ensemble itself as the merge: ratio 1 against it, below 1 against the norms
    itself = logit_norm_ratios(template, [a, b], average([a, b]), x)
    assert itself.logit_ensemble == pytest.approx(1.0) and itself.client_norms < 1.0


def test_logit_norm_ratios_measure_logit_shrinkage_and_reach_lewcs_prediction_exactly():
    model = _mlp(13)
    sd = model.state_dict()
    x = _inputs()
    assert tuple(logit_norm_ratios(model, [sd, sd], sd, x)) == pytest.approx((1.0, 1.0))
    shrunk = {**sd, "classifier.weight": 0.25 * sd["classifier.weight"]}
    assert tuple(logit_norm_ratios(model, [sd, sd], shrunk, x)) == pytest.approx((0.25, 0.25))
    # disjoint pair at lam = 1/2: LEWC holds exactly, the logits are (z_a + z_b) / 2^4, so the
    # ratio to the logit ensemble is LEWC's 2^(1-4) and the ratio to the clients' norms below it
    template, sds = _disjoint_pair()
    with torch.no_grad():
        z_a, z_b = (load_state(template, s)(x) for s in sds)
    ratios = logit_norm_ratios(template, sds, average(sds), x)
    assert ratios.logit_ensemble == pytest.approx(2 ** (1 - 4), rel=1e-6)
    expected = (
        (z_a + z_b).norm(dim=1).mean()
        / 16
        / ((z_a.norm(dim=1).mean() + z_b.norm(dim=1).mean()) / 2)
    )
    assert ratios.client_norms == pytest.approx(float(expected), rel=1e-5)
    assert ratios.client_norms < ratios.logit_ensemble


def test_stable_ranks_per_hidden_layer_in_depth_order():
    model = _mlp(14, depth=3)
    sd = model.state_dict()
    assert hidden_weight_keys(sd) == [f"hidden.{i}.linear.weight" for i in range(3)]
    with torch.no_grad():
        sd["hidden.1.linear.weight"] = torch.ones_like(sd["hidden.1.linear.weight"])  # rank 1
    ranks = stable_ranks(sd)
    assert len(ranks) == 3
    assert ranks[1] == pytest.approx(1.0)
    assert ranks[0] == pytest.approx(stable_rank(sd["hidden.0.linear.weight"])) and ranks[0] > 1.5
    assert stable_ranks(sd, ["classifier.weight"]) == [stable_rank(sd["classifier.weight"])]
    with pytest.raises(ValueError, match="hidden.9"):
        stable_ranks(sd, ["hidden.9.linear.weight"])
    conv = build_model("resnet20", width=0.125).state_dict()
    keys = hidden_weight_keys(conv)
    assert keys[0] == "stem.conv.weight" and all(not k.startswith("classifier") for k in keys)
    assert any("shortcut.conv" in k for k in keys) and len(keys) == 21


def test_trained_mlps_shrink_with_depth_as_lewc_predicts():
    """Two tiny bias-free MLPs trained from different seeds, plain average at lam = 1/2: the
    merged layer outputs shrink with depth, and the measured norm ratio is closer (in log) to
    LEWC's predicted 2^(1-l) than to 1 beyond layer 1; LLFC's best-scaled error is never above
    LEWC's at equal weights, by construction."""
    from fedlmc.data.loading import load_dataset
    from fedlmc.train import train_model

    splits = load_dataset("mnist5k")
    sds = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = build_model("mlp", width=0.25, in_shape=splits.in_shape, bias=False)
        model, _ = train_model(
            model,
            splits.train,
            epochs=3,
            lr=0.05,
            weight_decay=3e-3,
            batch_size=128,
            seed=seed,
            device="cpu",
        )
        sds.append(model.state_dict())
    x = splits.test[0][:500]
    merged = average(sds)
    rows = layer_predictions(model, sds, None, merged, x)
    for row in rows:
        assert row["llfc_scaled_error"] <= row["lewc_error"] + 1e-12, row
    for row in rows[1:]:
        assert row["lewc_norm_ratio"] == pytest.approx(2.0 ** (1 - row["depth"]))
        to_lewc = abs(math.log(row["norm_ratio"] / row["lewc_norm_ratio"]))
        assert to_lewc < abs(math.log(row["norm_ratio"])), row
    ratios = [row["norm_ratio"] for row in rows]
    assert all(b < a for a, b in zip(ratios, ratios[1:], strict=False)) and ratios[-1] < 0.5
    assert logit_norm_ratios(model, sds, merged, x).logit_ensemble < 0.5
