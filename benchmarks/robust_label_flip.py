"""A client inside the robust screen's factor: label flipping with its weights scaled by k < 10.

Trains three clients in-process exactly as the ClientApp does (the client-count study's
setting, ``configs/clients_quick.toml``: mnist5k, bias-free 3-hidden-layer MLP at 512 units,
12 epochs, IID, ``init = "shared"`` so that the plain average is the merge that works), client 2
on flipped labels ``9 - y`` with every floating tensor then multiplied by ``k``. Prints, per seed
and ``k``, what the screen of the train replies (:func:`fedlmc.strategies.robust.weight_outliers`
at the default factor 10) says about it, its largest per-tensor norm ratio to the median, and the
test accuracy of the plain average of the three against the honest clients' merge (client 2
dropped) and the all-honest one (client 2 trained on true labels); writes
``benchmarks/results/robust_label_flip.json``.

    nice -n 10 .venv/bin/python benchmarks/robust_label_flip.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from robust_calibration import spread, train_client

from fedlmc.averaging import average, load_state
from fedlmc.evaluation import metrics_from_logits, predict_logits
from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.task import build_from_config, client_train_data, load_splits
from fedlmc.strategies.robust import RobustScreen, weight_outliers

SETTING = {
    "dataset": "mnist5k",
    "model": "mlp",
    "bias": False,
    "width": 4,
    "num-clients": 3,
    "partition": "iid",
    "init": "shared",
    "epochs": 12,
}
SCALES = (1.0, 3.0, 9.0)
SEEDS = (0, 1, 2)
OUT = Path(__file__).parent / "results" / "robust_label_flip.json"


def accuracy(config: dict, splits, states: list[dict[str, torch.Tensor]]) -> float:
    """Test accuracy of the plain average of ``states`` (equal partitions: equal weights)."""
    template = build_from_config(config, splits, seed=config["seed"])
    model = load_state(template, average(states)).eval()
    x, y = splits.test
    return float(metrics_from_logits(predict_logits(model, x), y, 1.0)["accuracy"])


def one_seed(seed: int) -> list[dict]:
    """The rows of one seed: every scale ``k`` of the flipped client against the same honest
    clients."""
    config = validate_run_config({**SETTING, "seed": seed})
    splits = load_splits(config)
    shared = build_from_config(config, splits, seed=seed).state_dict()
    data = [client_train_data(config, pid, 3) for pid in range(3)]
    honest = [train_client(config, splits, pid, data[pid], shared) for pid in range(3)]
    x, y = data[2]
    flipped = train_client(config, splits, 2, (x, 9 - y), shared)
    reference = {
        "honest_only": accuracy(config, splits, honest[:2]),
        "all_honest": accuracy(config, splits, honest),
    }
    rows = []
    for k in SCALES:
        attacker = {key: v * k if v.is_floating_point() else v for key, v in flipped.items()}
        states = [*honest[:2], attacker]
        dropped = weight_outliers(states, RobustScreen())
        rows.append(
            {
                "seed": seed,
                "scale": k,
                "dropped": 2 in dropped,
                "max_norm_ratio": spread(states)[0],
                "merged_accuracy": accuracy(config, splits, states),
                **reference,
            }
        )
        print(json.dumps(rows[-1]))
        sys.stdout.flush()
    return rows


def main() -> None:
    rows = [row for seed in SEEDS for row in one_seed(seed)]
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"setting": SETTING, "rows": rows}, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
