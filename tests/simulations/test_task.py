"""What the ServerApp and the ClientApp share (:mod:`fedlmc.simulations.task`): seeds, the
clients' partitions, the configured model and the test-only failure plan."""

from __future__ import annotations

import pytest
import torch

from fedlmc.simulations.config import ConfigError, cell_id, validate_run_config
from fedlmc.simulations.task import (
    build_from_config,
    client_data,
    client_seed,
    client_setup,
    data_key,
    failure_plan,
    load_splits,
    train_options,
)


@pytest.fixture(scope="module")
def config():
    return validate_run_config({"num-clients": 3, "width": 0.25}, check_devices=False)


def test_client_seeds_differ_per_client_and_round_and_repeat():
    seeds = {client_seed(0, p, r) for p in range(4) for r in range(3)}
    assert len(seeds) == 12 and all(0 <= s < 2**31 - 1 for s in seeds)
    assert client_seed(0, 1, 2) == client_seed(0, 1, 2) != client_seed(1, 1, 2)


def test_partitions_are_disjoint_cover_the_pool_and_repeat(config):
    splits = load_splits(config)
    parts = [client_data(config, p, 3) for p in range(3)]
    assert sum(len(y) for _, y in parts) == len(splits.train[1])

    def rows(x):  # each example's bytes: equal images are one entry
        return [row.tobytes() for row in x.flatten(1).numpy()]

    seen = [set(rows(x)) for x, _ in parts]
    assert set().union(*seen) == set(rows(splits.train[0]))  # every pool example is some client's
    assert sum(len(s) for s in seen) == len(set().union(*seen))  # and only one client's
    again = client_data(config, 1, 3)
    assert torch.equal(again[0], parts[1][0]) and torch.equal(again[1], parts[1][1])
    with pytest.raises(ValueError, match="partition-id = 3; allowed: 0 .. 2"):
        client_data(config, 3, 3)


def test_the_data_key_names_what_determines_the_loaded_data(config):
    other = validate_run_config({"seed": 1}, check_devices=False)
    assert data_key(config) != data_key(other)
    assert data_key(config)[0] == "mnist5k"


def test_the_model_is_built_at_a_width_and_seeded(config):
    splits = load_splits(config)
    one = build_from_config(config, splits, seed=3)
    two = build_from_config(config, splits, seed=3)
    wider = build_from_config(config, splits, seed=3, width=0.5)
    assert all(
        torch.equal(a, b)
        for a, b in zip(one.state_dict().values(), two.state_dict().values(), strict=True)
    )
    first_one, first_wide = (
        next(iter(one.state_dict().values())),
        next(iter(wider.state_dict().values())),
    )
    assert first_wide.shape[0] == 2 * first_one.shape[0]


def test_training_options_come_from_the_config(config):
    assert train_options(config) == {
        "epochs": config["epochs"],
        "lr": config["lr"],
        "weight_decay": config["weight-decay"],
        "batch_size": config["batch-size"],
        "optimizer": config["optimizer"],
        "momentum": config["momentum"],
        "schedule": config["schedule"],
    }


def test_the_failure_plan_reads_modes_per_partition():
    assert failure_plan({"inject-failure": "none"}) == {}
    assert failure_plan({"inject-failure": "raise:1, nan:2"}) == {1: "raise", 2: "nan"}


def test_a_client_setup_is_resolved_once_per_config_with_typed_fields():
    context = {"seed": 4, "fisher-samples": 32, "inject-failure": "nan:1", "not-a-key": 1}
    setup = client_setup(context, {"epochs": 3, "init": "shared", "timeout": 9})
    assert client_setup(context, {"epochs": 3, "init": "shared", "timeout": 9}) is setup
    assert (setup.seed, setup.init, setup.timeout) == (4, "shared", 9.0)
    assert setup.train["epochs"] == 3 and setup.train == train_options(setup.config)
    assert dict(setup.failures) == {1: "nan"} and setup.fisher_samples == 32
    assert setup.cell == cell_id(setup.config)
    with pytest.raises(TypeError):
        setup.train["epochs"] = 4  # type: ignore[index]
    assert client_setup(context, {"epochs": 4}).train["epochs"] == 4
    with pytest.raises(ConfigError, match="epochs"):
        client_setup({}, {"epochs": -1})
