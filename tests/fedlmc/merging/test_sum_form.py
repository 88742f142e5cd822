"""The weighted-sum form of a ``sum`` rule (fedlmc.merging.sum_form): the clients' pre-scaled
arrays, averaged at their shares and post-scaled on the server, are exactly the clear merge
(``average_lewc_bias`` and ``average``) on a tiny MLP with biases; the held values divided by
the summed holder masks are exactly ``heterofl``'s clear merge on clients of two widths; the
exponents, the range of what is sent, and the error bounds. In process, float64, no Flower."""

from __future__ import annotations

import pytest
import torch

from fedlmc.averaging import average
from fedlmc.merging.method_registry import merge_method
from fedlmc.merging.methods import merge_states
from fedlmc.merging.sum_form import (
    client_scaled,
    divided_by_holders,
    embedded_for_sum,
    error_bound,
    held_for_sum,
    holder_error_bound,
    lewc_bias_exponents,
    plain_exponents,
    secure_sum_merge,
    server_rescaled,
)
from fedlmc.models.classifiers import build_model
from fedlmc.permutation import permutation_spec
from fedlmc.strategies.secure_forms import runs_securely, secure_form

SHARES = [0.3, 0.125, 0.45]  # n_i / M for three clients, summing to 0.875 (< 1: a scale to undo)


def secure_holder_merge(states, server, spec, shares) -> dict[str, torch.Tensor]:
    """What the server obtains for a holder-divided rule in exact arithmetic: each client's
    ``held_for_sum`` arrays, their ``shares``-weighted means, ``divided_by_holders``
    (threshold 0). Floating-point keys only."""
    sent = [held_for_sum(sd, server, spec, 1.0) for sd in states]
    plain = dict.fromkeys(sent[0][0], 0)
    mean = secure_sum_merge([values for values, _ in sent], plain, shares)
    mask_mean = secure_sum_merge([masks for _, masks in sent], plain, shares)
    return divided_by_holders(mean, mask_mean, 1.0, 0.0)


def _clients(template, count: int = 3) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        {
            k: torch.randn(v.shape, generator=generator, dtype=torch.float64)
            for k, v in template.state_dict().items()
        }
        for _ in range(count)
    ]


@pytest.fixture(scope="module")
def mlp():
    return build_model("mlp", width=0.125, bias=True).double()  # 3 hidden layers: 4 biases


def test_lewc_exponents_are_depth_minus_one_on_the_biases_and_zero_on_the_weights(mlp):
    state = mlp.state_dict()
    exponents = lewc_bias_exponents(permutation_spec(mlp), state)
    biases = [k for k in state if k.endswith(".bias")]
    assert [exponents[k] for k in biases] == [0, 1, 2, 3]
    assert all(exponents[k] == 0 for k in state if k.endswith(".weight"))
    assert plain_exponents(None, state) == dict.fromkeys(state, 0)
    assert secure_form("average_lewc_bias").sum_exponents is lewc_bias_exponents
    residual = build_model("resnet20", width=0.25)
    with pytest.raises(ValueError, match="not one chain"):
        lewc_bias_exponents(permutation_spec(residual), residual.state_dict())


def test_prescaled_then_postscaled_weighted_mean_is_the_lewc_bias_merge_exactly(mlp):
    states = _clients(mlp)
    spec = permutation_spec(mlp)
    secure = secure_sum_merge(states, lewc_bias_exponents(spec, states[0]), SHARES)
    clear, _ = merge_states("average_lewc_bias", mlp, states, SHARES)
    plain = average(states, SHARES)
    for key in clear:
        torch.testing.assert_close(secure[key], clear[key], rtol=0, atol=1e-13)
    deepest = [k for k in clear if k.endswith(".bias")][-1]  # w^4 vs w: the rules differ
    assert float((clear[deepest] - plain[deepest]).abs().max()) > 0.1
    # Without the post-scale the mean is off by the summed shares to the power l - 1.
    exponents = lewc_bias_exponents(spec, states[0])
    sent = [client_scaled(sd, exponents, s) for sd, s in zip(states, SHARES, strict=True)]
    mean = average(sent, SHARES)
    torch.testing.assert_close(mean[deepest] / sum(SHARES) ** 3, clear[deepest])


def test_the_plain_average_needs_no_scaling(mlp):
    states = _clients(mlp)
    secure = secure_sum_merge(states, plain_exponents(None, states[0]), SHARES)
    clear = average(states, SHARES)
    for key in clear:
        torch.testing.assert_close(secure[key], clear[key], rtol=0, atol=1e-13)
    sent = client_scaled(states[0], plain_exponents(None, states[0]), 0.3)
    assert all(torch.equal(states[0][k], v) for k, v in sent.items())


def test_mixed_widths_embedded_by_each_client_then_averaged_are_the_embed_average_merge():
    server = build_model("mlp", width=0.25, bias=True).double()
    narrow = build_model("mlp", width=0.125, bias=True).double()
    states = _clients(narrow, 1) + _clients(server, 2)
    spec = permutation_spec(server)
    sent = [embedded_for_sum(sd, server, spec) for sd in states]
    assert all(sent[0][k].shape == v.shape for k, v in server.state_dict().items())
    assert float(sent[0]["hidden.0.linear.weight"][16:].abs().max()) == 0.0  # zero-padded
    assert all(torch.equal(sent[2][k], v) for k, v in states[2].items())  # server width: as is
    secure = secure_sum_merge(sent, plain_exponents(spec, sent[0]), SHARES)
    clear, _ = merge_states("embed_average", server, states, SHARES)
    for key in clear:
        torch.testing.assert_close(secure[key], clear[key], rtol=0, atol=1e-13)


def test_what_a_client_sends_is_never_larger_than_its_trained_weights(mlp):
    state = _clients(mlp, 1)[0]
    exponents = lewc_bias_exponents(permutation_spec(mlp), state)
    sent = client_scaled(state, exponents, 0.3)
    for key, value in state.items():
        assert float(sent[key].abs().max()) <= float(value.abs().max())
        assert torch.allclose(sent[key], value * 0.3 ** exponents[key])
    with pytest.raises(ValueError, match=r"share = 1.5: allowed: 0 < share <= 1"):
        client_scaled(state, exponents, 1.5)
    with pytest.raises(ValueError, match=r"total_share = 0: allowed: > 0"):
        server_rescaled(state, exponents, 0)


def test_the_error_bound_is_the_plain_one_at_exponent_0_and_grows_with_the_post_scale():
    plain = error_bound(0, 3, 8.0, 2**22, 0.875)
    assert plain == pytest.approx(3 * 3 * 8.0 / (2**22 * 0.875))
    assert error_bound(3, 3, 8.0, 2**22, 0.875) > error_bound(3, 3, 8.0, 2**22, 1.0) > plain


def test_held_values_over_held_masks_are_the_heterofl_merge_on_clients_of_two_widths():
    """Server 0.25 (32 units), clients 0.125 (16) and 0.1875 (24): the shares-weighted mean of
    the held values divided by that of the masks is ``heterofl``'s clear merge; units 24..31,
    held by nobody, keep the empty-slot value 0 in both; ``embed_average`` differs where only
    the wider client holds an entry."""
    server = build_model("mlp", width=0.25, bias=True).double()
    widths = [0.125, 0.1875, 0.125]
    states = [_clients(build_model("mlp", width=w, bias=True).double(), 1)[0] for w in widths]
    spec = permutation_spec(server)
    values, masks = held_for_sum(states[0], server, spec, 8.0)
    assert set(masks) == set(values) == set(server.state_dict())
    assert float(masks["hidden.0.linear.weight"][:16].min()) == 8.0
    assert float(masks["hidden.0.linear.weight"][16:].abs().max()) == 0.0
    secure = secure_holder_merge(states, server, spec, SHARES)
    clear, _ = merge_states("heterofl", server, states, SHARES)
    embedded, _ = merge_states("embed_average", server, states, SHARES)
    for key in clear:
        torch.testing.assert_close(secure[key], clear[key], rtol=0, atol=1e-13)
    weight = "hidden.0.linear.weight"
    assert float(secure[weight][24:].abs().max()) == 0.0  # held by nobody
    torch.testing.assert_close(secure[weight][16:24], states[1][weight][16:24])  # one holder
    assert float((clear[weight][:24] - embedded[weight][:24]).abs().max()) > 0.1


def test_an_entry_held_by_nobody_takes_the_empty_slot_value_and_the_threshold_decides():
    mean = {"bn.running_var": torch.tensor([0.6, 1e-9, 0.0]), "fc.bias": torch.tensor([0.3, 0.0])}
    masks = {"bn.running_var": torch.tensor([0.75, 1e-9, 0.0]), "fc.bias": torch.ones(2)}
    masks = {k: 8.0 * v for k, v in masks.items()}  # sent times the clipping range
    got = divided_by_holders(mean, masks, 8.0, threshold=0.1)
    torch.testing.assert_close(got["bn.running_var"], torch.tensor([0.8, 1.0, 1.0]))
    torch.testing.assert_close(got["fc.bias"], torch.tensor([0.3, 0.0]))
    heterofl = merge_method("heterofl")
    assert runs_securely(heterofl.name) and secure_form(heterofl.name).divide_by_holders


def test_the_holder_bound_grows_as_the_smallest_share_shrinks_and_refuses_too_small_shares():
    bound = holder_error_bound(3, 8.0, 2**22, 0.125)
    assert bound == pytest.approx(4 * 3 * 8 / (2**22 * 0.125 - 6) + 3 * 8 / (2**22 * 0.125))
    assert holder_error_bound(3, 8.0, 2**22, 0.0625) > bound > error_bound(0, 3, 8.0, 2**22, 0.875)
    with pytest.raises(ValueError, match=r"smallest share 1e-06 with 3 clients"):
        holder_error_bound(3, 8.0, 2**22, 1e-6)


def test_a_clear_sums_merge_is_its_parts_means_on_their_keys_and_the_average_elsewhere():
    from fedlmc.merging.sum_form import clear_sums_merge

    states = [
        {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([4.0]), "n": torch.tensor(3)},
        {"w": torch.tensor([3.0, 6.0]), "b": torch.tensor([0.0]), "n": torch.tensor(5)},
    ]
    statistics = [2.0, 1.0]  # one number a client, say: the part it sends is w * statistic

    def parts(state, statistic):
        return [{"w": state["w"].double() * statistic}, {"w": torch.full((2,), statistic)}]

    merged = clear_sums_merge(
        states,
        statistics,
        [1.0, 3.0],
        "numbers",
        parts,
        lambda top, mass: {"w": top["w"] / mass["w"]},
    )
    # w: (0.25*2*w1 + 0.75*1*w2) / (0.25*2 + 0.75*1); b: the plain average at 1/4, 3/4
    assert torch.allclose(merged["w"], torch.tensor([(0.5 + 2.25) / 1.25, (1.0 + 4.5) / 1.25]))
    assert merged["w"].dtype == torch.float32
    assert torch.allclose(merged["b"], torch.tensor([1.0]))
    assert merged["n"] == average(states, [0.25, 0.75])["n"]
    with pytest.raises(ValueError, match="2 client states but 1 numbers"):
        clear_sums_merge(states, statistics[:1], [1.0, 1.0], "numbers", parts, dict)
