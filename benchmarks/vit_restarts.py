r"""Benchmark: weight matching of two independently trained ViTs, one descent against restarts.

The clients of ``configs/vit_quick.toml``'s two-client, independent-initialisation cells are
trained here exactly as the sweep's ClientApp trains them (the cell's validated run config,
its data split, each client's seeded initialisation and training seed; one thread), cached on
disk, and client 1 is weight-matched onto client 0 by
:func:`fedlmc.permutation.matching.weight_matching`:

- ``one``: one descent (``restarts=1``: the descent on main before the restarts);
- ``default``: the default (``restarts=None``: :data:`fedlmc.permutation.coordinate_descent.
  STREAM_RESTARTS` descents on a spec with a residual stream, the best objective kept);
- ``best_of_k`` (``--restarts``): ``restarts=k`` for each ``k`` listed (the first ``k``
  descents of a run are those of a run of ``k``; ``descent_objectives``: every descent's final
  objective in the run of the last ``k``).

For each: the objective :math:`J = \sum_w \langle W_a, \pi(W_b)\rangle`, the test accuracy of the
midpoint :math:`(\theta_a + \pi(\theta_b)) / 2` and the wall and CPU seconds of the matching
(one thread, as a sweep cell runs it). The plain average and the endpoints are listed beside.

    python benchmarks/vit_restarts.py --restarts 2 3 8 16          # depth 4, width 4, seeds 0-2
    python benchmarks/vit_restarts.py --widths 1 4 --depths 2 4 --restarts 2 3 8 16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fedlmc.averaging import interpolate, load_state
from fedlmc.evaluation import evaluate
from fedlmc.permutation import permutation_spec
from fedlmc.permutation.matching import matching_objective, weight_matching
from fedlmc.simulations.config.sweep_file import load_sweep_config, unique_cells
from fedlmc.simulations.config.threads import use_threads
from fedlmc.simulations.task import (
    build_from_config,
    client_seed,
    client_train_data,
    device_of,
    load_splits,
    train_options,
)
from fedlmc.train import train_model

ROOT = Path(__file__).parents[1]
DEFAULT_CONFIG = ROOT / "configs" / "vit_quick.toml"
DEFAULT_OUT = Path(__file__).parent / "results" / "vit_restarts.json"


def cell_configs(path: Path, widths, depths, seeds) -> list[dict]:
    """The validated run configs of the sweep's two-client, independent cells at ``widths``,
    ``depths`` and ``seeds``, in grid order."""
    sweep = load_sweep_config(path, check_devices=False)
    return [
        config
        for _point, config in unique_cells(sweep)
        if config["num-clients"] == 2
        and config["init"] == "independent"
        and float(config["width"]) in widths
        and int(config["depth"]) in depths
        and int(config["seed"]) in seeds
    ]


def trained_clients(config: dict, cache: Path) -> tuple[torch.nn.Module, list[dict]]:
    """The cell's two clients trained as the ClientApp trains them (first round, no holdout),
    cached in ``cache``; returns a template model and the two state dicts."""
    key = f"vit_w{config['width']}_d{config['depth']}_e{config['epochs']}_s{config['seed']}"
    splits = load_splits(config)
    states = []
    for pid in range(2):
        path = cache / f"{key}_client{pid}.pt"
        seed = client_seed(config["seed"], pid)
        model = build_from_config(config, splits, seed=seed)
        if path.exists():
            model.load_state_dict(torch.load(path, map_location="cpu"))
        else:
            start = time.perf_counter()
            data = client_train_data(config, pid, 2, 0.0)
            model, _history = train_model(
                model,
                data,
                **train_options(config),
                seed=client_seed(config["seed"], pid, 1),
                device=device_of(config),
                augment=splits.augment,
            )
            torch.save(model.state_dict(), path)
            print(f"trained {path.name} in {time.perf_counter() - start:.0f} s", flush=True)
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return model.eval(), states


def merged_accuracy(template, spec, sd_a, sd_b, perms, test) -> float:
    aligned = sd_b if perms is None else apply(spec, perms, sd_b)
    return evaluate(load_state(template, interpolate(sd_a, aligned, 0.5)), test)["accuracy"]


def apply(spec, perms, sd):
    from fedlmc.permutation import apply_permutation

    return apply_permutation(spec, perms, sd)


def timed_matching(spec, sd_a, sd_b, seed: int, restarts: int | None) -> tuple[dict, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    found = weight_matching(spec, sd_a, sd_b, seed=seed, restarts=restarts)
    return found, time.perf_counter() - wall, time.process_time() - cpu


def cell_row(config: dict, cache: Path, restarts: list[int]) -> dict:
    template, (sd_a, sd_b) = trained_clients(config, cache)
    test = load_splits(config).test
    spec = permutation_spec(template)
    seed = int(config["seed"])
    row = {"width": config["width"], "depth": config["depth"], "seed": seed}
    row["acc_client0"] = evaluate(load_state(template, sd_a), test)["accuracy"]
    row["acc_client1"] = evaluate(load_state(template, sd_b), test)["accuracy"]
    row["acc_plain_average"] = merged_accuracy(template, spec, sd_a, sd_b, None, test)
    row["objective_identity"] = matching_objective(spec, sd_a, sd_b)
    for name, count in [("one", 1), ("default", None)]:
        found, wall, cpu = timed_matching(spec, sd_a, sd_b, seed, count)
        row[f"{name}_objective"] = matching_objective(spec, sd_a, sd_b, found)
        row[f"{name}_acc"] = merged_accuracy(template, spec, sd_a, sd_b, found, test)
        row[f"{name}_seconds"] = wall
        row[f"{name}_cpu_seconds"] = cpu
        row[f"{name}_descents"] = len(found.descents)
    for count in restarts:
        found, wall, cpu = timed_matching(spec, sd_a, sd_b, seed, count)
        row[f"best_of_{count}_objective"] = matching_objective(spec, sd_a, sd_b, found)
        row[f"best_of_{count}_acc"] = merged_accuracy(template, spec, sd_a, sd_b, found, test)
        row[f"best_of_{count}_cpu_seconds"] = cpu
        row["descent_objectives"] = list(found.descents)  # the largest count's, in order
    print(
        f"width {row['width']} depth {row['depth']} seed {seed}: endpoints "
        f"{row['acc_client0']:.3f}/{row['acc_client1']:.3f}, plain {row['acc_plain_average']:.3f}"
        f"; one descent J {row['one_objective']:.2f} acc {row['one_acc']:.3f} "
        f"({row['one_seconds']:.1f} s); default J {row['default_objective']:.2f} acc "
        f"{row['default_acc']:.3f} ({row['default_seconds']:.1f} s, "
        f"{row['default_descents']} descents)",
        flush=True,
    )
    return row


def summary(rows: list[dict], names: list[str]) -> dict:
    """Mean and standard deviation (ddof 1) over the rows of each ``*_acc`` and ``*_seconds``."""
    out = {}
    for name in names:
        for key in (f"{name}_acc", f"{name}_seconds", f"{name}_objective"):
            values = [r[key] for r in rows if key in r]
            if len(values) > 1:
                out[key] = {"mean": statistics.mean(values), "std": statistics.stdev(values)}
    return out


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the sweep file")
    parser.add_argument("--widths", type=float, nargs="+", default=[4.0], help="cell widths")
    parser.add_argument("--depths", type=int, nargs="+", default=[4], help="cell depths")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="cell seeds")
    parser.add_argument(
        "--restarts", type=int, nargs="*", default=[], help="also the best of k descents"
    )
    parser.add_argument("--train-only", action="store_true", help="train (cache) and stop")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "fedlmc-bench-vit-restarts",
        help="directory caching the trained clients",
    )
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    use_threads(1)  # one thread, as a sweep cell's merge runs
    args.cache.mkdir(parents=True, exist_ok=True)
    configs = cell_configs(args.config, args.widths, args.depths, args.seeds)
    if args.train_only:
        for config in configs:
            trained_clients(config, args.cache)
        return
    rows = [cell_row(config, args.cache, args.restarts) for config in configs]
    names = ["one", "default", *(f"best_of_{k}" for k in args.restarts)]
    result = {
        "benchmark": "vit_restarts",
        "config": str(args.config.relative_to(ROOT)) if args.config.is_relative_to(ROOT) else "",
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "note": "single-machine wall-clock measurements on a shared machine",
        "rows": rows,
        "summary": summary(rows, names),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
