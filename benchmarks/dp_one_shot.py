"""Benchmark: merged accuracy of the one-shot plain average under central differential privacy.

One Flower simulation (Ray) per width, with fedlmc's ClientApp and a ServerApp that runs, on
the same grid, Flower's ``FedAvg`` in one round inside
``DifferentialPrivacyServerSideFixedClipping``
(:func:`fedlmc.strategies.private.private_one_shot_average`) for every (noise multiplier,
clipping norm) pair. The clients (mnist5k split IID, the 3-hidden-layer MLP with biases,
``init = "shared"``, 12 epochs, seed 0) retrain from the server's initialisation for every
pair (same seeds: the same models). Reported per width and pair: the test accuracy of the
noisy merge, the norm of the average's update (noise included) and the one-round epsilon at
delta = 1e-5 from Flower's RDP accountant (needs ``dp-accounting``; "n/a" without).

    python benchmarks/dp_one_shot.py                                  # widths 1 4, 2 clients
    python benchmarks/dp_one_shot.py --widths 1 --clients 8 --epochs 2   # quick run
"""

from __future__ import annotations

import argparse
import math

import torch


def run_width(width: float, clients: int, epochs: int, pairs) -> list[dict]:
    from flwr.app import ConfigRecord, Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from fedlmc.averaging import load_state
    from fedlmc.evaluation import metrics_from_logits, predict_logits
    from fedlmc.simulations.client_app import app as client_app
    from fedlmc.simulations.config import validate_run_config
    from fedlmc.simulations.task import build_from_config, load_splits
    from fedlmc.strategies.private import one_round_epsilon, private_one_shot_average
    from fedlmc.strategies.protocol import record_to_state, state_to_record

    config = validate_run_config(
        {
            "dataset": "mnist5k",
            "model": "mlp",
            "width": width,
            "num-clients": clients,
            "init": "shared",
            "epochs": epochs,
            "strategy": "average",
        }
    )
    splits = load_splits(config)
    template = build_from_config(config, splits)
    initial = {k: v.detach().clone() for k, v in template.state_dict().items()}
    rows: list[dict] = []
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        for noise, clip in pairs:
            strategy = private_one_shot_average(clients, noise, clip)
            result = strategy.start(
                grid=grid,
                initial_arrays=state_to_record(initial),
                num_rounds=1,
                train_config=ConfigRecord(dict(config)),
            )
            merged = record_to_state(result.arrays)
            step = math.sqrt(sum(float(((merged[k] - initial[k]) ** 2).sum()) for k in initial))
            model = load_state(template, merged).eval()
            logits = predict_logits(model, splits.test[0])
            found = metrics_from_logits(logits, splits.test[1], 1.0)
            epsilon = one_round_epsilon(noise, clients, 1e-5) if noise > 0 else math.inf
            rows.append(
                {
                    "width": width,
                    "noise": noise,
                    "clip": clip,
                    "accuracy": found["accuracy"],
                    "update_norm": step,
                    "epsilon": epsilon,
                }
            )

    run_simulation(
        server_app=server,
        client_app=client_app,
        num_supernodes=clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=12)
    args = parser.parse_args()
    pairs = [(0.0, 10.0), (0.01, 10.0), (0.1, 10.0), (1.0, 10.0), (0.1, 1.0), (1.0, 1.0)]
    torch.manual_seed(0)
    print(
        "| width | noise multiplier | clipping norm | accuracy | update norm "
        "| epsilon (1 round, delta 1e-5) |"
    )
    print("|---|---|---|---|---|---|")
    for width in args.widths:
        for row in run_width(width, args.clients, args.epochs, pairs):
            eps = row["epsilon"]
            eps_text = (
                "none (no noise)" if eps == math.inf else ("n/a" if eps is None else f"{eps:.2f}")
            )
            print(
                f"| {row['width']:g} | {row['noise']:g} | {row['clip']:g} | "
                f"{row['accuracy']:.3f} | {row['update_norm']:.2f} | {eps_text} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
