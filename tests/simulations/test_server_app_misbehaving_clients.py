"""Misbehaving clients in a real Flower simulation (Ray): our ClientApp wrapped so that some
clients send what an attacker or a broken node would. One federation exercises every stage of
the one-shot protocol at once (train, client-side alignment, federated temperature queries):
the bad replies are dropped by name, the honest clients are merged, and a client inflating its
counts keeps no more than its true share (``tests/strategies/test_screening.py`` checks the bound
itself).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd
import pytest
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.engine.ray_runtime import backend_config
from fedlmc.simulations.records.server_outcome import ServerOutcome
from fedlmc.simulations.server_app import run_server

pytestmark = pytest.mark.slow

CONFIG = {
    "dataset": "mnist5k",
    "model": "mlp",
    "width": 0.5,
    "depth": 2,
    "base-hidden": 64,
    "epochs": 2,
    "batch-size": 128,
    "num-clients": 6,
    "min-clients": 2,
    "strategy": "aligned",
    "align": "activation_federated",
    "calibration": "federated",
    "timeout": 120.0,
}
INFLATED, INTEGER_WEIGHTS, BAD_PERMUTATION, NAN_TEMPERATURE = 2, 3, 4, 5


def misbehaving_app():
    """Our ClientApp with partition 2 claiming 1e30 examples and 1e9 times its calibration
    samples, 3 sending integer weights, 4 a repeated index in its permutations and 5 NaN
    temperature sums (nested functions: Ray pickles them by value)."""
    import numpy as np
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    from fedlmc.simulations import client_app as ours

    def pid_of(context) -> int:
        return int(context.node_config["partition-id"])

    def rebuilt(reply: Message, message: Message, change) -> Message:
        if reply.has_error():
            return reply
        content = RecordDict(dict(reply.content.items()))
        change(content)
        return Message(content, reply_to=message)

    def train(message, context):
        reply = TRAIN(message, context)
        pid = pid_of(context)

        def change(content):
            if pid == INFLATED:
                metrics = dict(content["metrics"])
                metrics["num-examples"] = 1e30
                content["metrics"] = MetricRecord(metrics)
            if pid == INTEGER_WEIGHTS:
                arrays = content["arrays"]
                content["arrays"] = ArrayRecord(
                    {k: Array(np.asarray(a.numpy()).astype(np.int32)) for k, a in arrays.items()}
                )

        return rebuilt(reply, message, change)

    def temperature(message, context):
        reply = TEMPERATURE(message, context)
        pid = pid_of(context)

        def change(content):
            for name in list(content.metric_records):
                record = dict(content[name])
                if pid == INFLATED:
                    record["count"] = [int(c) * 10**9 for c in record["count"]]
                    for key in ("nll-sum", "grad-sum", "hess-sum"):
                        record[key] = [float(v) * 1e9 for v in record[key]]
                if pid == NAN_TEMPERATURE:
                    record["nll-sum"] = [math.nan for _ in record["nll-sum"]]
                content[name] = MetricRecord(record)

        return rebuilt(reply, message, change)

    def align(message, context):
        reply = ALIGN(message, context)
        if pid_of(context) != BAD_PERMUTATION:
            return reply

        def change(content):
            perms = content["perms"]
            first = next(iter(perms))
            broken = {k: a for k, a in perms.items()}
            broken[first] = Array(np.zeros(perms[first].shape, dtype=np.int32))
            content["perms"] = ArrayRecord(broken)

        return rebuilt(reply, message, change)

    TRAIN = ours._guarded(ours.ERROR_TRAIN_FAILED, ours.train_reply)
    TEMPERATURE = ours._guarded(ours.ERROR_QUERY_FAILED, ours.temperature_reply)
    ALIGN = ours._guarded(ours.ERROR_QUERY_FAILED, ours.align_reply)
    app = ClientApp()
    app.train()(train)
    app.query(ours.TEMPERATURE_QUERY)(temperature)
    app.query(ours.ALIGN_QUERY)(align)
    return app


def server_app_for(run_config: dict, sink: Callable[[ServerOutcome], None]) -> ServerApp:
    """A ServerApp running ``run_config`` (not ``context.run_config``) that hands its outcome
    to ``sink``: the product's server beside this test's own ClientApp."""
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        sink(run_server(grid, run_config, simulated=True))

    return server


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """One federation of 6 clients, 4 of them misbehaving: the outcome and results.csv."""
    from flwr.simulation import run_simulation

    out = tmp_path_factory.mktemp("attacked")
    config = validate_run_config({**CONFIG, "out-dir": str(out)})
    outcomes = []
    run_simulation(
        server_app=server_app_for(config, outcomes.append),
        client_app=misbehaving_app(),
        num_supernodes=CONFIG["num-clients"],
        backend_config=backend_config(config),
    )
    assert outcomes, "the ServerApp produced no outcome (see the Flower log)"
    rows = pd.read_csv(out / "results.csv")
    rows["clients_dropped_reasons"] = rows["clients_dropped_reasons"].fillna("")
    return outcomes[0], rows


def test_bad_replies_are_dropped_by_name_and_the_honest_clients_merged(attacked):
    outcome, rows = attacked
    report = outcome.reports["activation_federated"]
    assert report.survivor_ids == [0, 1, INFLATED, NAN_TEMPERATURE]
    reasons = {f.partition_id: f.describe() for f in report.dropped}
    assert "wrong dtype" in reasons[INTEGER_WEIGHTS]
    assert "align reply" in reasons[BAD_PERMUTATION] and "not one of" in reasons[BAD_PERMUTATION]
    assert "temperature reply" in reasons[NAN_TEMPERATURE]
    assert "non-finite" in reasons[NAN_TEMPERATURE]
    assert (rows["clients_survived"] == 4).all()
    assert (rows["clients_dropped"] == 3).all()
    for pid in (INTEGER_WEIGHTS, BAD_PERMUTATION, NAN_TEMPERATURE):
        assert rows["clients_dropped_reasons"].str.contains(f"partition {pid}").all()
    assert not rows["clients_dropped_reasons"].str.contains(f"partition {INFLATED}").any()


def test_an_inflated_client_stays_merged_and_the_temperature_stays_finite(attacked):
    outcome, rows = attacked
    calibrated = rows[rows.method == "activation_federated_t"].iloc[0]
    assert math.isfinite(calibrated["temperature"]) and 0.001 < calibrated["temperature"] < 1000
    assert 0.001 < calibrated["temperature_server_split"] < 1000
    assert rows["accuracy"].between(0, 1).all()
    assert (rows["endpoint_acc_mean"] > 0.2).all()  # the merged clients trained (chance: 0.1)
    assert INFLATED in outcome.reports["activation_federated"].survivor_ids
