"""How far honest clients lie from each other under the robust screen's statistics.

Trains every client of a run config in-process, exactly as the ClientApp does (same data split,
seeds and training), and prints, per setting, the largest ratio of any client's per-tensor row
norm to the median over clients (and the smallest), and the smallest cosine with the clients'
coordinate-wise median (:mod:`fedlmc.strategies.robust`). The ``outlier-factor`` default (10)
must stay above every ratio printed here (docs/reliability.md).

    nice -n 10 .venv/bin/python benchmarks/robust_calibration.py
    nice -n 10 .venv/bin/python benchmarks/robust_calibration.py epochs=12 norm=bn \
        partition=dirichlet  # the default grid with overrides; a grid key's value selects
    nice -n 10 .venv/bin/python benchmarks/robust_calibration.py configs/clients_quick.toml \
        num-clients=16      # the cells of a shipped sweep whose grid point has these values
"""

from __future__ import annotations

import itertools
import sys

import torch

from fedlmc.simulations.config import (
    load_sweep_config,
    parse_override,
    unique_cells,
    validate_run_config,
)
from fedlmc.simulations.task import (
    build_from_config,
    client_seed,
    client_train_data,
    load_splits,
    train_options,
)
from fedlmc.strategies.robust import floating_keys, median_cosines, row_norm
from fedlmc.train import train_model

BASE = {"dataset": "mnist5k", "model": "mlp", "width": 0.5, "depth": 2, "epochs": 3}


def train_client(
    config: dict, splits, pid: int, data, shared: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Client ``pid``'s weights trained on ``data`` as the ClientApp trains them (its seeds,
    ``shared`` as its initialisation when given)."""
    model = build_from_config(config, splits, seed=client_seed(config["seed"], pid))
    if shared is not None:
        model.load_state_dict(shared)
    model, _ = train_model(
        model,
        data,
        **train_options(config),
        seed=client_seed(config["seed"], pid, 1),
        augment=splits.augment,
    )
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def client_states(config: dict) -> list[dict[str, torch.Tensor]]:
    """Every client's trained weights, as the ClientApp computes them."""
    splits = load_splits(config)
    n = config["num-clients"]
    shared = None
    if config["init"] == "shared":
        shared = build_from_config(config, splits, seed=config["seed"]).state_dict()
    return [
        train_client(config, splits, pid, client_train_data(config, pid, n), shared)
        for pid in range(n)
    ]


def spread(states: list[dict[str, torch.Tensor]]) -> tuple[float, float, float]:
    """(largest ratio to the median, smallest ratio, smallest cosine with the median)."""
    keys = floating_keys(states)
    high, low = 0.0, float("inf")
    for key in keys:
        norms = torch.tensor([row_norm(s[key]) for s in states], dtype=torch.float64)
        ratios = norms / norms.median()
        high, low = max(high, float(ratios.max())), min(low, float(ratios.min()))
    return high, low, min(median_cosines(states, keys))


def print_row(config: dict) -> None:
    """One table row: the setting and :func:`spread` of its honest clients."""
    high, low, cosine = spread(client_states(config))
    setting = (config["num-clients"], config["partition"], config["init"], config["norm"])
    numbers = f"{high:.2f} | {low:.2f} | {cosine:.2f}"
    print("| " + " | ".join(str(v) for v in setting) + f" | {numbers} |")
    sys.stdout.flush()


def shipped(path: str, selection: list[str]) -> None:
    """The cells of the sweep at ``path`` whose grid point has every ``key=value`` of
    ``selection`` (values compared as text)."""
    wanted = dict(item.split("=", 1) for item in selection)
    for point, config in unique_cells(load_sweep_config(path, check_devices=False)):
        if all(str(point.get(k, config.get(k))) == v for k, v in wanted.items()):
            print(f"<!-- {path}: {point} -->")
            print_row(config)


GRID = {
    "num-clients": (3, 4, 8, 16),
    "partition": ("iid", "dirichlet"),
    "init": ("independent", "shared"),
    "norm": ("none", "bn"),
}
"""The default settings (:data:`BASE` for each); an override of one of these keys selects it."""


def default_grid(overrides: dict) -> None:
    """The rows of :data:`GRID` (a grid key's override keeps its value only) on :data:`BASE`
    with the other ``overrides`` (e.g. ``epochs=12``)."""
    axes = {k: (overrides[k],) if k in overrides else v for k, v in GRID.items()}
    fixed = {k: v for k, v in overrides.items() if k not in GRID}
    for values in itertools.product(*axes.values()):
        setting = dict(zip(axes, values, strict=True))
        print_row(validate_run_config({**BASE, "alpha": 0.1, **fixed, **setting}))


def main() -> None:
    print("| clients | partition | init | norm | max ratio | min ratio | min cosine |")
    print("|---|---|---|---|---|---|---|")
    if len(sys.argv) > 1 and sys.argv[1].endswith(".toml"):
        shipped(sys.argv[1], sys.argv[2:])
        return
    default_grid(dict(parse_override(item) for item in sys.argv[1:]))


if __name__ == "__main__":
    main()
