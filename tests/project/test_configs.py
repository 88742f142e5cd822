"""Every shipped config validates, names its download command, and starts its first cell.

Where a config needs torchvision files that are absent here, the test writes tiny stand-in files
in torchvision's formats and points ``data-root`` at them; the first cell then runs what a cell
runs (the clients' data and model from the run config, a short local training per client, the
merges of the cell's methods), with one epoch instead of the config's.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlmc.merging.clients import LocalClients
from fedlmc.simulations.config import expand_grid, load_sweep_config, method_list
from fedlmc.simulations.task import (
    build_from_config,
    client_data,
    client_seed,
    load_splits,
    train_options,
)
from fedlmc.study.compare import compare_methods
from fedlmc.train import train_model

try:  # rootdir on sys.path, or tests/ itself (pytest's default import mode)
    from tests.fedlmc.data.test_loading import write_cifar10, write_cifar100, write_mnist_like
except ImportError:
    from tests.fedlmc.data.test_loading import write_cifar10, write_cifar100, write_mnist_like

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))
FOLDERS = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}


def write_stand_in(name: str, root: Path) -> None:
    """Tiny files in torchvision's formats: 200 training and 60 test images."""
    rng = np.random.default_rng(0)
    classes = 100 if name == "cifar100" else 10

    def images(n: int, shape: tuple[int, ...]):
        labels = rng.permutation(np.arange(n) % classes).astype(np.int64)
        return rng.integers(0, 256, size=(n, *shape), dtype=np.uint8), labels

    if name in FOLDERS:
        write_mnist_like(root, FOLDERS[name], images(200, (28, 28)), images(60, (28, 28)))
    elif name == "cifar10":
        write_cifar10(root, images(200, (32, 32, 3)), images(60, (32, 32, 3)))
    elif name == "cifar100":
        write_cifar100(root, images(300, (32, 32, 3)), images(100, (32, 32, 3)))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_validates_and_names_its_command(path: Path):
    sweep = load_sweep_config(path, check_devices=False)
    cells = expand_grid(sweep)
    assert cells and sweep.name == path.stem
    header = path.read_text().split("\nname = ")[0]
    assert f"fedlmc sweep configs/{path.name}" in header
    datasets = {cell["dataset"] for cell in cells}
    for dataset in datasets - {"mnist5k"}:
        assert f"fedlmc data fetch {dataset} --root" in header, dataset


@pytest.mark.slow  # trains and merges one cell per shipped config: minutes on 2 cores
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_first_cell_starts(path: Path, tmp_path: Path):
    first = expand_grid(load_sweep_config(path, check_devices=False))[0]
    config = {**first, "data-root": str(tmp_path), "epochs": 1, "device": "cpu"}
    write_stand_in(config["dataset"], tmp_path)
    splits = load_splits(config)
    assert len(splits.test[1]) > 0 and len(splits.server[1]) > 0
    if config["dataset"] != "mnist5k":  # small models: the point is that the cell starts
        splits = replace(splits, test=(splits.test[0][:40], splits.test[1][:40]))
    template = build_from_config(config, splits)
    shared = config["init"] == "shared"  # the clients start from the server's model
    states, weights, inputs, labels = [], [], [], []
    for pid in range(2):
        data = client_data(config, pid, config["num-clients"])
        model = build_from_config(config, splits, seed=client_seed(config["seed"], pid))
        if shared:
            model.load_state_dict(template.state_dict())
        options = {**train_options(config), "epochs": 1}
        model, history = train_model(
            model,
            data,
            **options,
            seed=client_seed(config["seed"], pid, 1),
            device="cpu",
            augment=splits.augment,
        )
        assert np.isfinite(history.loss[-1])
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        weights.append(len(data[1]))
        inputs.append(data[0])
        labels.append(data[1])
    methods = [m for m in method_list(config) if m != "fedavg"]
    clients = LocalClients(  # the methods that query the clients (fisher, regmean) ask these
        template, states, inputs, [splits.server] * 2, device="cpu", train_labels=labels
    )
    base = template.state_dict() if shared else None
    rows = compare_methods(
        template,
        states,
        weights,
        splits,
        methods,
        diagnostics=False,
        device="cpu",
        clients=clients,
        base=base,
    ).rows
    assert [row["method"] for row in rows] == methods
    assert all(0.0 <= row["accuracy"] <= 1.0 for row in rows)
    if config["partition"] == "full":  # the paper's setting: every client sees every example
        assert len(client_data(config, 0, 2)[1]) == len(splits.train[1])
    assert torch.isfinite(torch.tensor([row["nll"] for row in rows])).all()


def test_the_paper_scale_configs_use_the_papers_setting():
    for name in ("mnist_mlp", "fashion_mnist_mlp", "cifar10_vgg11", "cifar10_resnet20"):
        text = (ROOT / "configs" / f"{name}.toml").read_text()
        assert re.search(r'^partition = "full"', text, flags=re.M), name
