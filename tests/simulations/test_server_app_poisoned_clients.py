"""Poisoned but well-formed clients in a real Flower simulation (the sweep engine, Ray): our
ClientApp wrapped so that some clients send a plausible-looking but poisoned reply
(:mod:`fedlmc.strategies.robust`). Two cells run in one simulation: ``attacked`` (10 clients, 5
of them misbehaving, each in another way) and ``honest-only`` (the same clients, the weight
attackers and the spoofer failing instead, the query attackers honest). The robust screen drops
every attacker by name, and the merged accuracy equals the honest-only merge's.

The wrapper picks each client's behaviour from the cell's ``out-dir`` name (the one run-config
key that does not change what a cell computes). ``python
tests/simulations/test_server_app_poisoned_clients.py`` runs one 3-client cell per attack instead
(2 honest clients, partition 2 attacking, screened and unscreened) and prints the table of
docs/reliability.md.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd
import pytest

from fedlmc.simulations.config import validate_run_config

pytestmark = pytest.mark.slow

CONFIG = {
    "dataset": "mnist5k",
    "model": "mlp",
    "norm": "bn",
    "init": "shared",
    "width": 0.5,
    "depth": 2,
    "base-hidden": 64,
    "epochs": 2,
    "batch-size": 128,
    "min-clients": 2,
    "strategy": "average",
    "calibration": "federated",
    "timeout": 300.0,
}
ATTACKED = {  # partition -> attack, in the 10-client "attacked" cell
    3: "grad1e300",
    4: "scaled100",
    5: "constant",
    6: "negated",
    7: "bn_shift",
    8: "spoof",
    9: "raise_outside",
    1: "bad_metrics",
}
WEIGHT_ATTACKS = ("scaled100", "scaled1e4", "constant", "negated")
QUERY_ATTACKS = ("bn_shift", "grad1e300")


def attack_plan(config) -> dict[int, str]:
    """Partition -> attack for the cell of ``config`` (from its ``out-dir`` name)."""
    name = Path(str(config.get("out-dir", ""))).name
    if name == "attacked":
        return dict(ATTACKED)
    if name.startswith("attack-"):
        return {2: name.split("-", 1)[1]}
    return {}


def poisoned_app():
    """Our ClientApp with the attacks of :func:`attack_plan` (nested functions: Ray pickles
    them by value)."""
    import numpy as np
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    from fedlmc.simulations import client_app as ours

    def plan_of(message, context) -> str | None:
        config = ours._message_config(message)
        return attack_plan(config).get(ours._partition(message, context)[0])

    def rebuilt(reply, message, change):
        if reply.has_error():
            return reply
        content = RecordDict(dict(reply.content.items()))
        change(content)
        return Message(content, reply_to=message)

    def poisoned(arrays, attack):
        out = {}
        for key, array in arrays.items():
            values = np.asarray(array.numpy())
            if np.issubdtype(values.dtype, np.floating):
                if attack == "constant":
                    values = np.full_like(values, 9.9e5)
                else:
                    factor = {"scaled100": 100.0, "scaled1e4": 1e4, "negated": -100.0}[attack]
                    values = values * factor
            out[key] = Array(np.array(values, copy=True))
        return ArrayRecord(out)

    def train(message, context):
        attack = plan_of(message, context)
        if attack == "raise_outside":
            raise RuntimeError(
                "\x1b[31mboom\x1b[0m in <ray.actor.ActorHandle object at 0x7f00beef>"
            )
        reply = TRAIN(message, context)

        def change(content):
            metrics = dict(content["metrics"])
            if attack in WEIGHT_ATTACKS:
                content["arrays"] = poisoned(content["arrays"], attack)
            if attack == "spoof":
                metrics["partition-id"] = 0
            if attack == "bad_metrics":
                metrics["train-seconds"] = 1e300
                metrics["epoch-train-loss"] = [1e308 for _ in metrics["epoch-train-loss"]]
            content["metrics"] = MetricRecord(metrics)

        return rebuilt(reply, message, change)

    def temperature(message, context):
        reply = TEMPERATURE(message, context)
        if plan_of(message, context) != "grad1e300":
            return reply

        def change(content):
            for name in list(content.metric_records):
                record = dict(content[name])
                record["grad-sum"] = [1e300 for _ in record["grad-sum"]]
                content[name] = MetricRecord(record)

        return rebuilt(reply, message, change)

    def bn_stats(message, context):
        reply = BN(message, context)
        if plan_of(message, context) != "bn_shift":
            return reply

        def change(content):  # every input shifted by 1e4: consistent sums and squares
            shift = 1e4
            arrays, counts = content["moments"], content["counts"]
            out = {}
            for key in arrays:
                layer = key.rsplit("/", 1)[0]
                n = float(counts[f"{layer}/count"])
                s1 = np.asarray(arrays[f"{layer}/sum"].numpy())
                s2 = np.asarray(arrays[f"{layer}/sum_sq"].numpy())
                if key.endswith("/sum"):
                    out[key] = Array(s1 + shift * n)
                else:
                    out[key] = Array(s2 + 2 * shift * s1 + shift**2 * n)
            content["moments"] = ArrayRecord(out)

        return rebuilt(reply, message, change)

    TRAIN = ours._guarded(ours.ERROR_TRAIN_FAILED, ours.train_reply)
    TEMPERATURE = ours._guarded(ours.ERROR_QUERY_FAILED, ours.temperature_reply)
    BN = ours._guarded(ours.ERROR_QUERY_FAILED, ours.bn_stats_reply)
    app = ClientApp()
    app.train()(train)
    app.query(ours.TEMPERATURE_QUERY)(temperature)
    app.query(ours.BN_QUERY)(bn_stats)
    return app


def run_cells_with_poisoned_clients(configs: dict[str, dict]) -> dict[str, object]:
    """Cell key -> its ServerOutcome (or the exception that ended it): every config in one
    simulation of the sweep engine, with :func:`poisoned_app` as the ClientApp."""
    from fedlmc.simulations import client_app
    from fedlmc.simulations.engine.cells import run_cells
    from fedlmc.simulations.engine.sweep_server import CellJob

    results = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(client_app, "app", poisoned_app())
        run_cells(
            [CellJob(key, validate_run_config(config)) for key, config in configs.items()],
            lambda r: results.__setitem__(r.key, r.outcome or r.error),
        )
    return results


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    """The ``attacked`` and ``honest-only`` cells (module docstring): outcome, results.csv rows
    and training.csv rows of each."""
    root = tmp_path_factory.mktemp("poisoned")
    failing = [p for p, a in ATTACKED.items() if a not in (*QUERY_ATTACKS, "bad_metrics")]
    configs = {
        "attacked": {**CONFIG, "num-clients": 10, "out-dir": str(root / "attacked")},
        "honest-only": {
            **CONFIG,
            "num-clients": 10,
            "out-dir": str(root / "honest-only"),
            "inject-failure": ",".join(f"raise:{p}" for p in sorted(failing)),
        },
    }
    outcomes = run_cells_with_poisoned_clients(configs)
    found = {}
    for key in configs:
        assert not isinstance(outcomes[key], BaseException), outcomes[key]
        folder = root / key
        rows = pd.read_csv(folder / "results.csv").fillna({"clients_dropped_reasons": ""})
        found[key] = (outcomes[key], rows, pd.read_csv(folder / "training.csv"))
    return found


def _row(rows: pd.DataFrame, method: str) -> pd.Series:
    return rows[rows.method == method].iloc[0]


def test_every_poisoned_client_is_dropped_by_name(cells):
    outcome, rows, _ = cells["attacked"]
    report = outcome.reports["average"]
    assert report.survivor_ids == [0, 1, 2, 3, 7]  # the query attackers stay merged
    reasons = {f.partition_id: f.describe() for f in report.dropped}
    for pid in (4, 5, 6):  # scaled x100, every weight 9.9e5, negated x(-100)
        assert "x the median over clients" in reasons[pid], reasons[pid]
    assert "grad-sum 1e+300 above" in reasons[3] and "temperature reply" in reasons[3]
    assert "bn_stats reply" in reasons[7] and "root mean square" in reasons[7]
    assert "claims partition-id 0; the server assigned partition 8" in reasons[8]
    assert 0 in report.survivor_ids  # the spoofed client keeps its place
    text = _row(rows, "average")["clients_dropped_reasons"]
    assert "(partition 9)" in text and "boom" in text  # raised outside the guard: named
    assert "\x1b" not in text and " at 0x" not in text  # plain text, no escape codes or reprs


def test_the_attacked_merge_matches_the_honest_only_merge(cells):
    attacked, honest = cells["attacked"][1], cells["honest-only"][1]
    for method in ("average", "average_t"):
        got, want = _row(attacked, method), _row(honest, method)
        assert abs(got["accuracy"] - want["accuracy"]) <= 0.01, method
        assert got["accuracy"] > 0.5  # a trained merge (chance: 0.1)
    temperature = _row(attacked, "average_t")["temperature"]
    assert 0.5 < temperature / _row(honest, "average_t")["temperature"] < 2


def test_unscreened_history_and_timing_do_not_reach_the_files(cells):
    _, rows, training = cells["attacked"]
    assert math.isnan(_row(rows, "average")["train_seconds"])  # undefined, not 1e300
    assert 1 not in set(training["client"].dropna())  # its history was dropped
    assert {0, 2}.issubset(set(training["client"].dropna()))
    assert training.select_dtypes("number").abs().max().max() < 1e6
    _, honest_rows, _ = cells["honest-only"]
    assert 0 < _row(honest_rows, "average")["train_seconds"] < 1e4


# ----------------------------------------------------------------------------- the docs table


def attack_table(root: Path) -> pd.DataFrame:
    """One 3-client cell per attack (partition 2 attacking), screened and unscreened
    (``outlier-factor = 1e300``; the exact temperature bounds stay), and the honest-only cell
    (partition 2 failing): merged accuracy, calibrated NLL and temperature of each."""
    base = {**CONFIG, "num-clients": 3}
    attacks = ("scaled100", "scaled1e4", "constant", "negated", "bn_shift", "grad1e300", "spoof")
    configs = {"honest-only": {**base, "inject-failure": "raise:2"}, "none": {**base}}
    for attack in attacks:
        configs[attack] = {**base}
        configs[f"{attack} (unscreened)"] = {**base, "outlier-factor": 1e300}
    for key, config in configs.items():
        name = f"attack-{key.split()[0]}" if key in attacks or "unscreened" in key else key
        config["out-dir"] = str(root / key.replace(" ", "_").strip("()") / name)
    outcomes = run_cells_with_poisoned_clients(configs)
    table = []
    for key, outcome in outcomes.items():
        if isinstance(outcome, BaseException):
            table.append({"cell": key, "error": str(outcome)[:120]})
            continue
        plain, calibrated = (_row(outcome.table(), m) for m in ("average", "average_t"))
        table.append(
            {
                "cell": key,
                "accuracy": plain["accuracy"],
                "nll_calibrated": calibrated["nll"],
                "temperature": calibrated["temperature"],
                "survivors": plain["clients_survived"],
                "dropped": plain["clients_dropped_reasons"],
            }
        )
    return pd.DataFrame(table)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        pd.set_option("display.width", 250, "display.max_colwidth", 90)
        print(attack_table(Path(folder)).to_string(index=False))
        sys.stdout.flush()
