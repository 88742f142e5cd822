"""A ``fisher`` cell under ``secure-aggregation = "secagg+"`` through the ServerApp
(simulations/private/secure_server.py: the finest quantisation, the clients' parts, the
server's division), in process: the real ServerApp and ClientApp with Flower's SecAgg+ on a Grid
that hands each message to the ClientApp. It equals the clear ``aligned`` fisher cell on the
same clients (the weights within the bound, the NLL within 1e-5); the server's rows are those
of a secure round (four message rounds, no endpoint it could not see)."""

from __future__ import annotations

import copy
import math

import torch

from fedlmc.simulations.server_app import run_server
from tests.simulations.test_client_app_warmup import TINY, ClientAppGrid

CELL = {**TINY, "num-clients": 3, "epochs": 1, "strategy": "aligned", "align": "fisher"}
CELL |= {"calibration": "server", "fisher-samples": 64}


class _Run:
    run_id = 7


class SecureGrid(ClientAppGrid):
    """The in-process Grid with the run Flower's legacy workflow reads, each node getting its
    own copy of a message (the SecAgg+ mod edits what it receives)."""

    run = _Run()

    def send_and_receive(self, messages, *, timeout=None):
        copies = [copy.deepcopy(m) for m in messages]
        return super().send_and_receive(copies, timeout=timeout)


def test_a_secure_fisher_cell_is_the_clear_one_within_its_bound(task_identity):
    secure = run_server(SecureGrid(3), {**CELL, "secure-aggregation": "secagg+"}, simulated=True)
    clear = run_server(ClientAppGrid(3), CELL, simulated=True)
    result = secure.secure["fisher"]
    gap = max(
        float((secure.merged["fisher"][k] - v).abs().max())
        for k, v in clear.merged["fisher"].items()
    )
    assert gap <= result.error_bound
    rows, plain = secure.table().set_index("method"), clear.table().set_index("method")
    assert list(rows.index) == ["fisher", "fisher_t"]
    assert abs(rows.loc["fisher", "nll"] - plain.loc["fisher", "nll"]) <= 1e-5
    assert rows.loc["fisher", "accuracy"] == plain.loc["fisher", "accuracy"]
    assert (rows["rounds"] == 4).all() and (rows["server_sees"] == "sum").all()
    assert rows["secagg_error_bound"].iloc[0] == result.error_bound
    assert math.isnan(rows.loc["fisher", "endpoint_acc_mean"])
    assert result.settings.quantization_range == 2**29  # the finest for 3 clients
    # the clients sent two arrays per weight (u * theta and c * u): twice the clear weights
    assert (
        rows.loc["fisher", "bytes_sent_by_clients"]
        > 2 * plain.loc["fisher", "bytes_sent_by_clients"] * 0.9
    )
    assert all(torch.isfinite(v).all() for v in secure.merged["fisher"].values())
