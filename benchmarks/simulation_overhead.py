"""Overhead of running a one-shot federation through Flower's simulation engine.

Two pipelines on the embedded mnist5k digits, timed in the same run, with the same run config
(2 clients, ``strategy = average``, server-side temperature, no diagnostics):

- ``direct``: one process calls fedlmc: load the data, partition it, train client 0 then client 1
  (same seeds as the ClientApp), average them, fit the temperature, evaluate the two rows;
- ``flower``: :func:`fedlmc.simulations.runs.federation.run_federation` (Ray backend, one actor
  per client with ``num-cpus`` CPUs, so the two clients train at the same time).

ratio = flower wall time / direct wall time. The breakdown of the flower run: ``ray_init``
(``ray.init`` + ``ray.shutdown`` measured on its own before the run), the clients' data loading
and training (their own ``load-seconds`` / ``train-seconds`` metrics, max over clients: they run
in parallel), ``serialisation`` (ArrayRecord encode + decode of one client model, measured in
this process, times the number of clients), the server's evaluation, and the remainder (actor
start-up with its imports, message passing, shutdown). Prints a table and writes JSON.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/simulation_overhead.py            # ~1 min of training
    OMP_NUM_THREADS=1 python benchmarks/simulation_overhead.py --quick    # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

DEFAULT_OUT = Path(__file__).parent / "results" / "simulation_overhead.json"


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "dataset": "mnist5k",
        "model": "mlp",
        "width": args.width,
        "depth": 3,
        "base-hidden": 128,
        "epochs": args.epochs,
        "num-clients": 2,
        "strategy": "average",
        "calibration": "server",
        "diagnostics": False,
        "num-cpus": 1.0,
        "device": "cpu",
        "timeout": 1800.0,
    }


def direct(config: dict[str, Any]) -> dict[str, Any]:
    """Training + merging + evaluation by calling fedlmc in this process (no Flower)."""
    from fedlmc.averaging import average, load_state
    from fedlmc.evaluation import predict_logits
    from fedlmc.merging.calibrate import fit_temperature
    from fedlmc.simulations.task import (
        build_from_config,
        client_data,
        client_seed,
        load_splits,
        train_options,
    )
    from fedlmc.study.model_rows import endpoint_metrics, merge_rows
    from fedlmc.train import train_model

    start = time.perf_counter()
    splits = load_splits(config)
    parts = [client_data(config, pid, 2) for pid in range(2)]
    loaded = time.perf_counter()
    states, train_seconds = [], []
    for pid, part in enumerate(parts):
        model = build_from_config(config, splits, seed=client_seed(config["seed"], pid))
        model, history = train_model(
            model,
            part,
            **train_options(config),
            seed=client_seed(config["seed"], pid, 1),
            device="cpu",
        )
        states.append({k: v.detach().cpu() for k, v in model.state_dict().items()})
        train_seconds.append(history.seconds)
    trained = time.perf_counter()
    template = build_from_config(config, splits)
    merged = average(states, [len(p[1]) for p in parts])
    model = load_state(template, merged).eval()
    temperature = fit_temperature(predict_logits(model, splits.server[0]), splits.server[1])
    device = torch.device("cpu")
    endpoints = endpoint_metrics([template] * len(states), states, splits, device)
    rows = merge_rows(
        "average",
        model,
        splits,
        device=device,
        num_clients=2,
        calibrated=True,
        temperature=temperature,
        endpoints=endpoints,
    )
    end = time.perf_counter()
    return {
        "wall_seconds": end - start,
        "load_seconds": loaded - start,
        "train_seconds_sum": sum(train_seconds),
        "train_wall_seconds": trained - loaded,
        "merge_evaluate_seconds": end - trained,
        "accuracy": rows[0]["accuracy"],
        "merged": merged,
    }


def ray_init_seconds() -> float:
    import ray

    start = time.perf_counter()
    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    ray.shutdown()
    return time.perf_counter() - start


def serialisation_seconds(state: dict[str, torch.Tensor], repeats: int = 5) -> float:
    """State dict -> ArrayRecord in a RecordDict -> pickle (what Ray ships between processes)
    -> unpickle -> state dict; best of ``repeats``."""
    import pickle

    from flwr.app import RecordDict

    from fedlmc.strategies.protocol import record_to_state, state_to_record

    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        payload = pickle.dumps(RecordDict({"arrays": state_to_record(state)}))
        record_to_state(pickle.loads(payload)["arrays"])
        best = min(best, time.perf_counter() - start)
    return best


def flower(config: dict[str, Any]) -> dict[str, Any]:
    from fedlmc.simulations.runs.federation import run_federation_outcome

    start = time.perf_counter()
    outcome = run_federation_outcome(config)
    wall = time.perf_counter() - start
    report = outcome.reports["average"]
    load = max(u.metrics.get("load-seconds", 0.0) for u in report.survivors)
    train = max(u.metrics.get("train-seconds", 0.0) for u in report.survivors)
    return {
        "wall_seconds": wall,
        "client_load_seconds_max": load,
        "client_train_seconds_max": train,
        "client_train_seconds_sum": sum(u.metrics["train-seconds"] for u in report.survivors),
        "round_seconds": float(outcome.rows[0]["round_seconds"]),
        "server_seconds": outcome.timings["server_seconds"],
        "accuracy": outcome.rows[0]["accuracy"],
        "merged": outcome.merged["average"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--width", type=float, default=4.0)
    parser.add_argument("--quick", action="store_true", help="tiny run (smoke test)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.width = 2, 0.5
    from fedlmc.simulations.config import validate_run_config

    config = validate_run_config(run_config(args))
    ray_seconds = ray_init_seconds()
    ours = direct(config)
    fed = flower(config)
    serial = 2 * serialisation_seconds(ours["merged"])
    diff = max(float((fed["merged"][k] - ours["merged"][k]).abs().max()) for k in ours["merged"])
    other = (
        fed["wall_seconds"]
        - ray_seconds
        - fed["client_load_seconds_max"]
        - fed["client_train_seconds_max"]
        - serial
        - (fed["server_seconds"] - fed["round_seconds"])
    )
    ratio = fed["wall_seconds"] / ours["wall_seconds"]
    table = [
        ("direct: total", ours["wall_seconds"]),
        ("direct: data loading", ours["load_seconds"]),
        ("direct: training (2 clients, one after the other)", ours["train_wall_seconds"]),
        ("direct: merge + temperature + evaluation", ours["merge_evaluate_seconds"]),
        ("flower: total", fed["wall_seconds"]),
        ("flower: ray.init + shutdown (measured alone)", ray_seconds),
        ("flower: client data loading (max over clients)", fed["client_load_seconds_max"]),
        ("flower: client training (max, clients in parallel)", fed["client_train_seconds_max"]),
        ("flower: serialisation (2 models, encode + decode)", serial),
        (
            "flower: server merge + calibration + evaluation",
            fed["server_seconds"] - fed["round_seconds"],
        ),
        ("flower: other (actor start-up/imports, messaging)", other),
    ]
    width = max(len(name) for name, _ in table)
    print(f"{'step'.ljust(width)}  seconds")
    for name, seconds in table:
        print(f"{name.ljust(width)}  {seconds:8.2f}")
    print(f"ratio flower / direct: {ratio:.2f}x  (target <= 1.3x when training takes ~1 min)")
    print(
        f"accuracy direct {ours['accuracy']:.4f}, flower {fed['accuracy']:.4f}; "
        f"max |merged weight difference| {diff:.2e}"
    )
    result = {
        "config": {k: v for k, v in config.items()},
        "epochs": args.epochs,
        "width": args.width,
        "ratio": ratio,
        "table": {name: seconds for name, seconds in table},
        "direct": {k: v for k, v in ours.items() if k != "merged"},
        "flower": {k: v for k, v in fed.items() if k != "merged"},
        "max_merged_weight_difference": diff,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
