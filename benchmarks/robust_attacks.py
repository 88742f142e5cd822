"""The attack table of docs/reliability.md: each attack against each defence, merged accuracy and
who was named.

Every client is trained in process exactly as the ClientApp trains it (same data split, seeds
and training; mnist5k, MLP with BatchNorm at width 0.5, depth 2, ``init = "shared"``, 3 epochs,
IID), the honest clients once per seed and reused by every attack. Each attack is a set of
replies (real Flower messages, real ``Array`` payloads); each defence is the real one-shot
strategy's round on them (``merge_round``: the reply screen, the robust screen, the client
check, the merge rule, BatchNorm statistics re-estimated on the server split), and the merged
model is evaluated on the test split (accuracy, and the NLL at T = 1). "honest only" is the
plain average of the attack's honest clients alone (the free rider and the attackers left out).

    nice -n 10 .venv/bin/python benchmarks/robust_attacks.py            # seeds 0 1 2
    nice -n 10 .venv/bin/python benchmarks/robust_attacks.py --seeds 0  # one seed

Writes ``benchmarks/results/robust_attacks.json`` and prints the Markdown tables (accuracy with
who was named, then the NLL).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity
from tqdm import tqdm

from fedlmc.averaging import load_state
from fedlmc.evaluation import metrics_from_logits, predict_logits
from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.task import (
    build_from_config,
    client_seed,
    client_train_data,
    load_splits,
    train_options,
)
from fedlmc.strategies import (
    ClientsFailedError,
    OneShotAverage,
    PermutationAlignedAverage,
    StrategyOptions,
)
from fedlmc.strategies.protocol import state_to_record
from fedlmc.strategies.robust import OFF, RobustScreen
from fedlmc.train import train_model

RESULTS = Path(__file__).resolve().parent / "results" / "robust_attacks.json"
CONFIG = {
    "dataset": "mnist5k",
    "model": "mlp",
    "norm": "bn",
    "init": "shared",
    "width": 0.5,
    "depth": 2,
    "base-hidden": 64,
    "epochs": 3,
    "batch-size": 128,
}
DEFENCES: dict[str, dict] = {
    "none": {"method": "average", "robust": OFF, "client_check": "off"},
    "outlier screen": {"method": "average", "robust": RobustScreen(), "client_check": "off"},
    "median": {"method": "median", "robust": OFF, "client_check": "off"},
    "trimmed mean": {"method": "trimmed_mean", "robust": OFF, "client_check": "off"},
    # Krum's fewest clients at f = 0 (2f + 3): its strategy refuses a smaller min_clients
    "Krum": {"method": "krum", "robust": OFF, "client_check": "off", "min_clients": 3},
    "server-split check": {"method": "average", "robust": OFF, "client_check": "server-split"},
    "fedlmc default": {
        "method": "average",
        "robust": RobustScreen(),
        "client_check": "server-split",
    },
}
"""Each defence alone (the reply screen, payloads included, always runs), and what a `fedlmc
run` of an IID cell does by default (the outlier screen and the client check, plain average).
The rules take Flower's defaults: trim fraction 0.2, Krum f = 0."""


def train(config: dict, splits, shared: dict, pid: int, n: int, flip: bool = False) -> dict:
    """Partition ``pid`` of ``n`` trained as the ClientApp trains it, from the shared start;
    ``flip``: on its labels shifted by one class (``y -> (y + 1) mod 10``)."""
    model = build_from_config(config, splits, seed=client_seed(config["seed"], pid))
    model.load_state_dict(shared)
    x, y = client_train_data(config, pid, n)
    if flip:
        y = (y + 1) % splits.num_classes
    model, _ = train_model(
        model,
        (x, y),
        **train_options(config),
        seed=client_seed(config["seed"], pid, 1),
        augment=splits.augment,
    )
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def scaled(state: dict, factor: float) -> dict:
    return {k: v * factor if v.is_floating_point() else v for k, v in state.items()}


def last_layer_negated(state: dict) -> dict:
    return {k: -v if k.startswith("classifier.") else v for k, v in state.items()}


def lying_record(state: dict) -> ArrayRecord:
    """``state``'s record with the classifier's weight replaced by 3 floats labelled with its
    shape (the bytes of a 3-element array under the template's dtype and shape labels)."""
    buffer = io.BytesIO()
    np.save(buffer, np.ones(3, np.float32), allow_pickle=False)
    record = state_to_record(state)
    shape = tuple(record["classifier.weight"].shape)
    lie = Array(dtype="float32", shape=shape, stype="numpy.ndarray", data=buffer.getvalue())
    return ArrayRecord({**dict(record.items()), "classifier.weight": lie})


def attacks(h3: list, f3: dict, h5: list, f5: dict) -> dict[str, tuple[list, list]]:
    """Attack -> (replies as (partition, state or record), the honest clients' states)."""
    return {
        "no attack (3 honest)": (list(enumerate(h3)), h3),
        "weights x9 (1 of 3)": ([(0, h3[0]), (1, h3[1]), (2, scaled(h3[2], 9.0))], h3[:2]),
        "weights x100 (1 of 3)": ([(0, h3[0]), (1, h3[1]), (2, scaled(h3[2], 100.0))], h3[:2]),
        "label flip (1 of 3)": ([(0, h3[0]), (1, h3[1]), (2, f3)], h3[:2]),
        "two colluding label flips (2 of 5)": (
            [*enumerate(h5[:3]), (3, f5), (4, f5)],
            h5[:3],
        ),
        "free rider: copy of client 0 (1 of 3)": ([(0, h3[0]), (1, h3[1]), (2, h3[0])], h3[:2]),
        "last layer negated (1 of 3)": (
            [(0, h3[0]), (1, h3[1]), (2, last_layer_negated(h3[2]))],
            h3[:2],
        ),
        "mismatched payload (1 of 3)": (
            [(0, h3[0]), (1, h3[1]), (2, lying_record(h3[2]))],
            h3[:2],
        ),
    }


def reply(pid: int, sent, examples: int) -> Message:
    record = sent if isinstance(sent, ArrayRecord) else state_to_record(sent)
    metrics = MetricRecord({"num-examples": examples, "partition-id": pid})
    content = RecordDict({"arrays": record, "metrics": metrics})
    instruction = Message(RecordDict(), dst_node_id=100 + pid, message_type="train")
    return Message(content, reply_to=instruction)


def defend(defence: dict, template, replies: list[Message], server) -> tuple[dict | None, str]:
    """The defence's one-shot round on ``replies``: (merged state, who was named and why)."""
    n = len(replies)
    options = StrategyOptions(
        num_clients=n,
        min_clients=defence.get("min_clients", 2),
        calibration="none",
        server_data=server,
        robust=defence["robust"],
        client_check=defence["client_check"],
    )
    if defence["method"] == "average":
        strategy = OneShotAverage(template, options)
    else:
        strategy = PermutationAlignedAverage(template, options, method=defence["method"])
    strategy.expect_replies(state_to_record(template.state_dict()), [100 + p for p in range(n)])
    try:
        found = strategy.merge_round(1, replies)
    except (ValueError, ClientsFailedError) as err:  # fewer survivors than the rule needs
        return None, str(err).split(";")[0]
    named = [f"p{f.partition_id}: {short(f.reason)}" for f in found.report.failures]
    if "krum_selected" in found.merge_info:
        named.append(f"kept {found.merge_info['krum_selected']}")
    return found.merged_state, "; ".join(named)


def short(reason: str) -> str:
    """The drop reason's kind, in a few words."""
    for words, kind in (
        ("server split", "accuracy"),
        ("a copy of", "copy"),
        ("x the median", "norm"),
        ("point away", "cosine"),
        ("bytes", "payload"),
    ):
        if words in reason:
            return kind
    return reason[:40]


def scores(template, state: dict | None, test) -> dict[str, float]:
    """Accuracy and NLL (T = 1) of the merged model on the test split (NaN: no merge)."""
    if state is None:
        return {"accuracy": float("nan"), "nll": float("nan")}
    model = load_state(template, state).eval()
    found = metrics_from_logits(predict_logits(model, test[0]), test[1], 1.0)
    return {"accuracy": float(found["accuracy"]), "nll": float(found["nll"])}


def one_seed(seed: int, bar: Callable[[], None]) -> dict:
    """Every attack against every defence for ``seed``: accuracies, names, honest-only."""
    config = validate_run_config({**CONFIG, "seed": seed, "num-clients": 3})
    five = validate_run_config({**CONFIG, "seed": seed, "num-clients": 5})
    splits = load_splits(config)
    template = build_from_config(config, splits, seed=seed)
    shared = template.state_dict()
    h3 = [train(config, splits, shared, p, 3) for p in range(3)]
    h5 = [train(five, splits, shared, p, 5) for p in range(5)]
    f3, f5 = train(config, splits, shared, 2, 3, flip=True), train(five, splits, shared, 3, 5, True)
    examples = len(client_train_data(config, 0, 3)[1])
    found: dict[str, dict] = {}
    for attack, (sent, honest) in attacks(h3, f3, h5, f5).items():
        honest_replies = [reply(p, s, examples) for p, s in enumerate(honest)]
        honest_only, _ = defend(DEFENCES["none"], template, honest_replies, splits.server)
        row = {"honest only": scores(template, honest_only, splits.test)}
        for name, defence in DEFENCES.items():
            replies = [reply(p, s, examples) for p, s in sent]
            merged, named = defend(defence, template, replies, splits.server)
            row[name] = {**scores(template, merged, splits.test), "named": named}
            bar()
        found[attack] = row
    return found


def cell(values: list[float]) -> str:
    clean = [v for v in values if v == v]
    if not clean:
        return "no merge"
    if len(clean) == 1:
        return f"{clean[0]:.3f}"
    return f"{statistics.mean(clean):.3f} ± {statistics.stdev(clean):.3f}"


def markdown(runs: dict[int, dict], metric: str = "accuracy") -> str:
    """The table: per attack and defence, mean ± std of ``metric`` over the seeds and, for the
    accuracy, who was named (every seed's names, joined by ``/`` where they differ)."""
    seeds = sorted(runs)
    first = runs[seeds[0]]
    columns = ["honest only", *DEFENCES]
    lines = [
        f"| attack ({metric}) | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for attack in first:
        cells = []
        for column in columns:
            text = cell([runs[s][attack][column][metric] for s in seeds])
            named = {runs[s][attack][column].get("named", "") for s in seeds}
            if metric == "accuracy" and column != "honest only" and named != {""}:
                shown = sorted(named)[0] if len(named) == 1 else " / ".join(sorted(named))
                text += f" ({shown})"
            cells.append(text)
        lines.append(f"| {attack} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SUPERLINK_NODE_ID
    torch.set_num_threads(1)
    start = time.perf_counter()
    total = len(args.seeds) * 8 * len(DEFENCES)
    with tqdm(total=total, desc="attack x defence", unit="merge") as bar:
        runs = {seed: one_seed(seed, lambda: bar.update(1)) for seed in args.seeds}
    table = markdown(runs) + "\n\n" + markdown(runs, "nll")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "date": datetime.date.today().isoformat(),
                "seeds": args.seeds,
                "config": CONFIG,
                "defences": {k: {**v, "robust": str(v["robust"])} for k, v in DEFENCES.items()},
                "machine": platform.processor() or platform.machine(),
                "seconds": round(time.perf_counter() - start, 1),
                "runs": {str(s): r for s, r in runs.items()},
                "table": table,
            },
            indent=1,
        )
    )
    print(table)
    print(f"\n{RESULTS} written in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
