"""A cell's identity (:mod:`fedlmc.simulations.config.cell_identity`): the hash is stable across
key order and filled-in defaults, differs for configs that compute different things, and ignores
runtime keys and keys without effect."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.config.cell_identity import (
    canonical_cell_id,
    canonical_run_config,
    cell_id,
    experiment_values,
)
from fedlmc.simulations.config.keys import runtime_keys


def test_a_cell_id_is_12_hex_digits_stable_across_key_order_and_defaults():
    config = {"seed": 3, "epochs": 2, "model": "mlp"}
    reordered = dict(reversed(list(config.items())))
    full = validate_run_config(config, check_devices=False)
    assert re.fullmatch(r"[0-9a-f]{12}", cell_id(config))
    assert cell_id(config) == cell_id(reordered) == cell_id(full)


@pytest.mark.slow
def test_the_same_config_has_the_same_id_in_another_process():
    code = (
        "from fedlmc.simulations.config.cell_identity import cell_id;"
        "print(cell_id({'seed': 3, 'epochs': 2}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == cell_id({"seed": 3, "epochs": 2}), out.stderr


def test_configs_that_compute_different_things_have_different_ids():
    ids = {
        cell_id(c)
        for c in ({}, {"seed": 1}, {"epochs": 2}, {"partition": "dirichlet", "alpha": 0.3})
    }
    assert len(ids) == 4


def test_runtime_keys_and_keys_without_effect_do_not_change_the_id():
    base = cell_id({})
    assert "device" in runtime_keys()
    assert cell_id({"device": "cpu"}) == base  # where it runs, not what it computes
    assert cell_id({"alpha": 0.3}) == base  # alpha only counts under partition = dirichlet
    dirichlet = {"partition": "dirichlet"}
    assert cell_id({**dirichlet, "alpha": 0.3}) != cell_id({**dirichlet, "alpha": 0.9})


def test_canonical_config_resets_keys_without_effect_and_resolves_auto():
    config = validate_run_config({"alpha": 0.3, "bias": "auto"}, check_devices=False)
    default_alpha = validate_run_config({}, check_devices=False)["alpha"]
    canonical = canonical_run_config(config)
    assert canonical["alpha"] == default_alpha != 0.3
    assert canonical["bias"] in ("true", "false")  # auto stands for the model's default
    assert cell_id({"bias": "auto"}) == cell_id({"bias": canonical["bias"]})


def test_a_canonical_cell_is_named_without_validating_it_again():
    """canonical_cell_id is cell_id on a config already canonical (canonicalising is
    idempotent; every shipped config's cells: test_sweep_file.py); on one that is not, not."""
    raw = validate_run_config({"alpha": 0.3, "bias": "auto"}, check_devices=False)
    assert canonical_cell_id(canonical_run_config(raw)) == cell_id(raw)
    assert canonical_cell_id(raw) != cell_id(raw)  # alpha without effect, bias unresolved


def test_experiment_values_leave_out_the_runtime_keys_in_sorted_order():
    config = validate_run_config({}, check_devices=False)
    values = experiment_values(config)
    assert list(values) == sorted(values)
    assert not set(values) & set(runtime_keys())
    assert set(values) | set(runtime_keys()) == set(config)
