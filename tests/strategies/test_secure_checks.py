"""What the server checks of a real SecAgg+ round with one bad client of three, in process:
Flower's server workflow (:func:`fedlmc.strategies.secure.secure_round`) and Flower's client
mod on both sides of the in-process grid of tests/strategies/test_secure_dropped.py. Node 33
answers what a bad client would (its own mod masks it as an honest one's); the round is
refused with one line (:class:`ImplausibleAggregateError`), never merged. The merged model
against the server split (a constant inside the clipping range) is tested through the
ServerApp in tests/simulations/private/test_secure_server_checks.py."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Message
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from flwr.compat.common import recorddict_compat as compat

from fedlmc.strategies.secure import secure_round
from fedlmc.strategies.secure_checks import (
    ImplausibleAggregateError,
    aggregate_problem,
    chance_accuracy,
    merged_model_problem,
    weight_problem,
)
from fedlmc.strategies.strategy_utils import ClientsFailedError
from tests.strategies.test_secure_dropped import (
    COUNTS,
    NODES,
    SETTINGS,
    InProcessGrid,
    clear_average,
    client_arrays,
    max_gap,
)

BAD = 33


@pytest.fixture(autouse=True)
def server_task(task_identity):
    """The identity a ServerApp process has (see test_secure_dropped.py)."""


def answering(arrays_of=None, count: float | None = None):
    """The masked-vector stage's fit handler: node :data:`BAD` sends ``arrays_of(node)`` and
    claims ``count`` examples; the others answer :func:`client_arrays` honestly."""

    def fit(message: Message, context) -> Message:
        node = context.node_id
        arrays, claimed = client_arrays(node), COUNTS[node]
        if node == BAD:
            arrays = arrays_of(node) if arrays_of else arrays
            claimed = count if count is not None else claimed
        fit_res = FitRes(Status(Code.OK, "ok"), ndarrays_to_parameters(arrays), claimed, {})
        return Message(compat.fitres_to_recorddict(fit_res, keep_input=True), reply_to=message)

    return fit


class LyingGrid(InProcessGrid):
    """Node :data:`BAD` weights its masked vector by its true count but reports ``reported``
    examples in the clear (a client that runs its own mod)."""

    def __init__(self, reported: int) -> None:
        super().__init__({})
        self.reported = reported

    def send_and_receive(self, messages, *, timeout=None):
        replies = super().send_and_receive(messages, timeout=timeout)
        for reply in replies:
            configs = reply.content.config_records.get(RECORD_KEY_CONFIGS, {})
            if reply.metadata.src_node_id == BAD and Key.MASKED_PARAMETERS in configs:
                counts = reply.content.metric_records["fitres.num_examples"]
                counts["num_examples"] = self.reported  # the legacy FitRes's clear count
        return replies


def run_round(grid):
    sent = [np.zeros((4, 3)), np.zeros((5,))]
    return secure_round(grid, sent, len(NODES), {}, SETTINGS, timeout=30.0)


def test_an_honest_round_merges_and_its_unmasked_total_share_is_the_clear_counts():
    found = run_round(InProcessGrid({}, answering()))
    levels = SETTINGS.quantization_range
    assert found.total_share == sum(round(COUNTS[n] / SETTINGS.max_weight * levels) for n in NODES)
    assert max_gap(found.aggregate, clear_average(NODES)) <= found.error_bound


@pytest.mark.parametrize(
    ("arrays_of", "count", "words"),
    [
        (lambda n: [np.full_like(a, np.nan) for a in client_arrays(n)], None, "of the unmasked"),
        (None, 10**9, "the 3 clients claim 1e+09 examples in all, the largest claim 1e+09"),
        (None, 1500, "the largest claim 1500; allowed: at most max_weight = 1000 each"),
    ],
    ids=["NaN", "1e9 examples", "above max_weight"],
)
def test_one_bad_client_of_three_refuses_the_round_with_one_line(arrays_of, count, words):
    grid = InProcessGrid({}, answering(arrays_of, count))
    with pytest.raises(ImplausibleAggregateError) as raised:
        run_round(grid)
    text = str(raised.value)
    assert "\n" not in text and text.startswith("SecAgg+ round refused: ")
    assert words in text
    assert "hides which client sent it" in text
    assert isinstance(raised.value, ClientsFailedError)  # the CLI's exit 1: the clients failed


def test_a_client_reporting_another_count_than_it_masked_refuses_the_round():
    """Node 33 masks with 400 examples and reports 100 in the clear: each count is plausible,
    but the unmasked total of the shares is not the clear counts'."""
    with pytest.raises(ImplausibleAggregateError) as raised:
        run_round(LyingGrid(reported=100))
    assert "the unmasked sum of the clients' shares is 1.2, the clear example counts give 0.9" in (
        str(raised.value)
    )


def test_the_weight_rule_in_numbers():
    levels, modulus = 2**22, 2**32
    shares = sum(round(n / 1000 * levels) for n in (300, 500, 400))
    assert weight_problem([300, 500, 400], shares, 1000.0, levels, modulus) is None
    assert weight_problem([300, 500, 400], None, 1000.0, levels, modulus) is None
    assert "at least 1" in weight_problem([300, 0, 400], shares, 1000.0, levels, modulus)
    assert "equal" in weight_problem([300, 500, 400], shares + 1, 1000.0, levels, modulus)


def test_the_aggregate_rule_in_numbers():
    assert aggregate_problem([np.array([8.0, -8.0])], 8.0, 1e-6) is None
    assert "holds 8.001" in aggregate_problem([np.array([8.001])], 8.0, 1e-6)
    assert "non-finite" in aggregate_problem([np.zeros(2), np.array([np.inf])], 8.0, 1e-6)


def test_the_merged_model_rule_refuses_no_better_than_the_initial_model_from_a_shared_start():
    labels = np.repeat(np.arange(10), 40)  # balanced: chance 0.1 + 3 x 0.015
    assert chance_accuracy(labels) == pytest.approx(0.1 + 3 * (0.09 / 400) ** 0.5)
    assert "no better than chance" in merged_model_problem((0.12, 9.0), 2.3, labels, True)
    # an undertrained honest merge: at chance, but its loss below the initial model's
    assert merged_model_problem((0.13, 2.25), 2.3, labels, True) is None
    assert merged_model_problem((0.12, 9.0), 2.3, labels, False) is None  # independent starts
    assert merged_model_problem((0.6, 3.0), 2.3, labels, True) is None
    assert "allowed: finite" in merged_model_problem((0.6, float("nan")), 2.3, labels, False)
    skewed = np.array([0] * 90 + [1] * 10)  # a constant predictor gets 0.9
    assert "no better than chance" in merged_model_problem((0.9, 2.5), 2.3, skewed, True)
