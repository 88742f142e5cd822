"""A real SecAgg+ round of the ServerApp (simulations/private/secure_server.py) with one bad
client of three, in process: the real ServerApp and ClientApps with Flower's SecAgg+ on the
in-process Grid of test_secure_server_statistics.py. Partition 2 trains as an honest client,
then, inside its own SecAgg+ mod, sends every value 8 (inside the clipping range), NaN, or
claims 1e9 examples: the round is refused with one line and no row, never merged at chance.
An honest round of the same cell merges (its merged model far above chance on the server
split)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from flwr.app import Message
from flwr.client.mod import secaggplus_mod
from flwr.common import FitRes, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat as compat

from fedlmc.simulations.client_app import train_reply
from fedlmc.simulations.private.secure_client import is_secure_message, secure_fit_reply
from fedlmc.simulations.server_app import run_server
from fedlmc.strategies import ClientsFailedError
from tests.simulations.private.test_secure_server_statistics import SecureGrid
from tests.simulations.test_client_app_warmup import TINY

CELL = {**TINY, "num-clients": 3, "epochs": 1, "strategy": "average", "calibration": "none"}
CELL |= {"secure-aggregation": "secagg+"}
BAD_NODE = 3  # partition 2


def constant(value: float):
    return lambda fit_res: FitRes(
        fit_res.status,
        ndarrays_to_parameters(
            [np.full_like(a, value) for a in parameters_to_ndarrays(fit_res.parameters)]
        ),
        fit_res.num_examples,
        fit_res.metrics,
    )


def claims(count: int):
    return lambda fit_res: FitRes(fit_res.status, fit_res.parameters, count, fit_res.metrics)


class BadClientGrid(SecureGrid):
    """Node :data:`BAD_NODE` trains honestly and then changes its reply (``change``: a
    ``FitRes`` to ``FitRes``) before its own ``secaggplus_mod`` masks it."""

    def __init__(self, change) -> None:
        super().__init__(3)
        self.change = change

    def bad_fit(self, message: Message, context) -> Message:
        honest = secure_fit_reply(message, context, train_reply)
        fit_res = self.change(compat.recorddict_to_fitres(honest.content, keep_input=True))
        return Message(compat.fitres_to_recorddict(fit_res, keep_input=True), reply_to=message)

    def send_and_receive(self, messages, *, timeout=None):
        bad = [m for m in messages if m.metadata.dst_node_id == BAD_NODE]
        if not bad or not is_secure_message(bad[0]):
            return super().send_and_receive(messages, timeout=timeout)
        rest = [m for m in messages if m.metadata.dst_node_id != BAD_NODE]
        replies = super().send_and_receive(rest, timeout=timeout)
        context = self.contexts[BAD_NODE]
        return [*replies, secaggplus_mod(copy.deepcopy(bad[0]), context, self.bad_fit)]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (constant(8.0), "no better than the initial model's"),
        (constant(float("nan")), "of the unmasked mean holds"),
        (claims(10**9), "the largest claim 1e+09; allowed: at most max_weight = "),
    ],
    ids=["constant 8", "NaN", "1e9 examples"],
)
def test_one_bad_client_of_three_refuses_the_secure_round_with_one_line(
    task_identity, tmp_path, change, words
):
    out = tmp_path / "out"
    with pytest.raises(ClientsFailedError) as raised:  # the CLI's exit 1: the clients failed
        run_server(BadClientGrid(change), {**CELL, "out-dir": str(out)}, simulated=True)
    assert type(raised.value).__name__ == "ImplausibleAggregateError"
    text = str(raised.value)
    print(f"\n{text}")
    assert "\n" not in text and text.startswith("SecAgg+ round refused: ") and words in text
    assert not (out / "results.csv").exists()  # no row of a merge at chance


def test_an_honest_secure_round_of_the_same_cell_merges(task_identity):
    outcome = run_server(SecureGrid(3), CELL, simulated=True)
    (row,) = outcome.rows
    print(f"\nhonest secure average: test accuracy {row['accuracy']:.3f}")
    assert row["clients_survived"] == 3 and row["accuracy"] > 0.2
