"""False drops of the default screen: how many honest client replies it refuses.

Every client of a cell is trained in process exactly as the ClientApp trains it (same data
split, seeds, initialisation and training; ``benchmarks/robust_calibration.py``), on the
``fedlmc run`` defaults (mnist5k, the 3-hidden-layer MLP, SGD one-cycle, the server split of
400 digits) over a grid of honest settings: 1 to 12 epochs, 3 to 16 clients, IID and Dirichlet
(alpha 0.5, the default), shared and independent initialisation, widths 0.25 to 4. Each cell's
replies (real Flower messages) go through the real one-shot strategy's screen
(``OneShotAverage.screen``: the reply and payload screen, the relative rule on norms and
cosines, the client check) as ``fedlmc run`` configures it (``outlier-factor`` 10,
``client-check = "auto"``: the server-split accuracy check for IID, copies only for
Dirichlet). Every reply is honest, so every drop is a false drop.

Two accuracy rules are compared on the same clients (the baseline in the same run):

- *median rule* (fedlmc before issue 53): drop when ``a_i < m - max(0.2, 3 MAD)``;
- *chance rule* (:func:`fedlmc.strategies.robust.accuracy_outliers`, the shipped one): drop
  when ``a_i`` is also below the chance floor, 3 standard errors below a random guess's
  accuracy ``1/K`` (0.055 on the 400 digits of the server split).

Both are also applied to the Dirichlet cells (where ``auto`` does not run them), to show what
turning ``client-check = "server-split"`` on there would cost.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/screen_false_drops.py
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/screen_false_drops.py --quick
    .venv/bin/python benchmarks/screen_false_drops.py --tables  # the written JSON's tables

Writes ``benchmarks/results/screen_false_drops.json`` (every cell: its setting, each client's
server-split accuracy, who each rule dropped) and prints the Markdown tables.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from flwr.app import Message, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity
from robust_calibration import train_client

from fedlmc.averaging import load_state
from fedlmc.evaluation import predict_logits
from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.config.defences import client_check
from fedlmc.simulations.task import build_from_config, client_train_data, load_splits
from fedlmc.strategies import OneShotAverage, StrategyOptions
from fedlmc.strategies.protocol import state_to_record
from fedlmc.strategies.robust import RobustScreen, accuracy_outliers, chance_floor

RESULTS = Path(__file__).resolve().parent / "results" / "screen_false_drops.json"
BASE = {"dataset": "mnist5k", "model": "mlp"}
"""On the ``fedlmc run`` defaults (depth 3, 128 base units, batch 128, lr 0.05, one-cycle)."""
GRID = {
    "partition": ("iid", "dirichlet"),
    "init": ("independent", "shared"),
    "num-clients": (3, 4, 8, 16),
    "epochs": (1, 2, 3, 6, 12),
    "width": (0.25, 0.5, 1, 2, 4),
}
QUICK = {**GRID, "num-clients": (3,), "epochs": (1, 2), "width": (0.25, 2)}
SEEDS = {3: (0, 1), 4: (0,), 8: (0,), 16: (0,)}
"""Seeds per client count: two for 3 clients (the median absolute deviation of 3 values is the
degenerate case), one otherwise."""


def median_rule(accuracies: Sequence[float]) -> dict[int, str]:
    """fedlmc's rule before issue 53 (the baseline): ``a_i < m - max(0.2, 3 MAD)``, 3 or more
    clients."""
    if len(accuracies) < 3:
        return {}
    values = torch.tensor(accuracies, dtype=torch.float64)
    centre = float(values.quantile(0.5))
    deviation = float((values - centre).abs().quantile(0.5))
    threshold = centre - max(0.2, 3.0 * deviation)
    return {i: f"{a:.3g} < {threshold:.3g}" for i, a in enumerate(accuracies) if a < threshold}


def reply(pid: int, state: dict, examples: int) -> Message:
    """Client ``pid``'s train reply, as the ClientApp sends it."""
    metrics = MetricRecord({"num-examples": examples, "partition-id": pid})
    content = RecordDict({"arrays": state_to_record(state), "metrics": metrics})
    instruction = Message(RecordDict(), dst_node_id=100 + pid, message_type="train")
    return Message(content, reply_to=instruction)


def screened(config: dict, template, states: list[dict], server, check: str) -> list[int]:
    """The partitions the real strategy's screen drops with ``client_check = check``."""
    n = len(states)
    options = StrategyOptions(
        num_clients=n,
        min_clients=2,
        calibration="none",
        server_data=server,
        robust=RobustScreen(config["outlier-factor"]),
        client_check=check,
    )
    strategy = OneShotAverage(template, options)
    strategy.expect_replies(state_to_record(template.state_dict()), [100 + p for p in range(n)])
    replies = [reply(p, s, len(client_train_data(config, p, n)[1])) for p, s in enumerate(states)]
    report = strategy.screen(1, replies)
    return sorted(f.partition_id for f in report.failures)


def server_accuracy(template, state: dict, server) -> float:
    """The client's own accuracy on the server split, as the strategy computes it."""
    model = load_state(template, state).eval()
    logits = predict_logits(model, server[0])
    return float((logits.argmax(dim=1) == server[1]).double().mean())


def one_cell(setting: dict) -> dict:
    """Train the cell's honest clients; what every screen and rule drops."""
    config = validate_run_config({**BASE, **setting})
    splits = load_splits(config)
    n = config["num-clients"]
    template = build_from_config(config, splits, seed=config["seed"])
    shared = template.state_dict() if config["init"] == "shared" else None
    start = time.perf_counter()
    states = [
        train_client(config, splits, p, client_train_data(config, p, n), shared) for p in range(n)
    ]
    seconds = time.perf_counter() - start
    others = screened(config, template, states, splits.server, "copies")
    kept = [p for p in range(n) if p not in others]
    accuracies = {p: server_accuracy(template, states[p], splits.server) for p in range(n)}
    floor = chance_floor(splits.num_classes, len(splits.server[1]))
    survivors = [accuracies[p] for p in kept]
    old = sorted(kept[i] for i in median_rule(survivors))
    new = sorted(kept[i] for i in accuracy_outliers(survivors, floor))
    check = client_check(config)
    default = screened(config, template, states, splits.server, check)
    accuracy_on = check == "server-split"
    expected = sorted(set(others) | (set(new) if accuracy_on else set()))
    if default != expected:
        raise AssertionError(f"{setting}: the real screen dropped {default}, expected {expected}")
    return {
        "setting": setting,
        "client_check": check,
        "accuracies": [accuracies[p] for p in range(n)],
        "chance": 1.0 / splits.num_classes,
        "floor": floor,
        "other_screens": others,
        "median_rule": old,
        "chance_rule": new,
        "default_before": sorted(set(others) | (set(old) if accuracy_on else set())),
        "default_after": default,
        "train_seconds": round(seconds, 2),
    }


def settings(grid: dict) -> list[dict]:
    """Every grid point, each with its seeds (:data:`SEEDS`)."""
    found = []
    for values in itertools.product(*grid.values()):
        point = dict(zip(grid, values, strict=True))
        found += [{**point, "seed": s} for s in SEEDS[point["num-clients"]]]
    return found


def floor_decides(cell: dict) -> bool:
    """Whether the chance floor alone decides the cell: its median minus ``max(0.2, 3 MAD)``
    lies above the floor (elsewhere the median term keeps every client, the floor aside)."""
    accuracies = cell["accuracies"]
    centre = statistics.median(accuracies)
    deviation = statistics.median([abs(a - centre) for a in accuracies])
    return centre - max(0.2, 3.0 * deviation) > cell["floor"]


def lowest(cells: list[dict]) -> str:
    """The lowest honest accuracy in ``cells`` and its cell's median (``-`` for none)."""
    if not cells:
        return "-"
    low = min(cells, key=lambda c: min(c["accuracies"]))
    return f"{min(low['accuracies']):.3f} ({statistics.median(low['accuracies']):.3f})"


def row(label: str, cells: list[dict]) -> str:
    """One table row: the replies, each screen's and rule's false drops in ``cells`` (with the
    cells holding one, for the screen before), the lowest honest accuracy where the floor
    decides and anywhere (each with its cell's median)."""
    replies = sum(c["setting"]["num-clients"] for c in cells)
    count = {
        key: sum(len(c[key]) for c in cells)
        for key in ("default_before", "default_after", "median_rule", "chance_rule")
    }
    hit = sum(bool(c["default_before"]) for c in cells)
    decided = [c for c in cells if floor_decides(c)]
    return (
        f"| {label} | {len(cells)} | {replies} | {count['default_before']} ({hit} cells) | "
        f"{count['default_after']} | {count['median_rule']} | {count['chance_rule']} | "
        f"{len(decided)}: {lowest(decided)} | {lowest(cells)} |"
    )


HEADER = (
    "| {what} | cells | honest replies | default screen before: false drops | default screen "
    "after | median rule, every cell | chance rule, every cell | cells the floor decides: "
    "lowest accuracy (median) | lowest accuracy anywhere (median) |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def tables(cells: list[dict]) -> str:
    """The false-drop tables: by partition, init and clients; by epochs and width."""
    parts = []
    for title, keys in (
        ("partition, init, clients", ("partition", "init", "num-clients")),
        ("partition, epochs", ("partition", "epochs")),
        ("partition, width", ("partition", "width")),
    ):
        lines = [HEADER.format(what=title)]
        groups: dict[tuple, list[dict]] = {}
        for cell in cells:
            groups.setdefault(tuple(cell["setting"][k] for k in keys), []).append(cell)
        lines += [row(", ".join(str(v) for v in key), group) for key, group in groups.items()]
        lines.append(row("**all**", cells))
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 cells of 3 clients")
    parser.add_argument(
        "--tables", action="store_true", help="print the tables of the written JSON, train nothing"
    )
    args = parser.parse_args()
    if args.tables:  # the tables again from the written cells (the JSON's "table" updated)
        found = json.loads(RESULTS.read_text())
        found["table"] = tables(found["cells"])
        RESULTS.write_text(json.dumps(found, indent=1))
        print(found["table"])
        return
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SUPERLINK_NODE_ID
    torch.set_num_threads(1)
    start = time.perf_counter()
    todo = settings(QUICK if args.quick else GRID)
    cells = []
    for index, setting in enumerate(todo):
        cells.append(one_cell(setting))
        done = cells[-1]
        print(
            f"[{index + 1}/{len(todo)}] {setting}: accuracies "
            f"{[round(a, 3) for a in done['accuracies']]}, before {done['default_before']}, "
            f"after {done['default_after']}, median rule {done['median_rule']}, chance rule "
            f"{done['chance_rule']} ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    table = tables(cells)
    out = RESULTS.with_name("screen_false_drops_quick.json") if args.quick else RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "date": datetime.date.today().isoformat(),
                "base": BASE,
                "grid": QUICK if args.quick else GRID,
                "seeds": {str(k): v for k, v in SEEDS.items()},
                "machine": platform.processor() or platform.machine(),
                "threads": torch.get_num_threads(),
                "seconds": round(time.perf_counter() - start, 1),
                "cpu_seconds": round(time.process_time(), 1),
                "cells": cells,
                "table": table,
            },
            indent=1,
        )
    )
    print(table)
    print(f"\n{out} written in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
