"""``load_merged``: a saved ``merged-<method>.safetensors`` read back as the run's model with its
fitted temperature, from a run's out dir and from a sweep's cell folder; a merge that was not
saved is refused with the merges that were. The folders are written here in the shapes the
ServerApp writes (``results.csv`` through a CSV round trip, every run-config column); the page's
own block runs on a real deployment's output in ``tests/project/test_deployment.py``."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from fedlmc.simulations import load_merged, validate_run_config
from fedlmc.simulations.config import run_schema
from fedlmc.simulations.config.schema import ConfigError
from fedlmc.simulations.task import build_from_config, load_splits

CONFIG = {
    "dataset": "mnist5k",
    "model": "mlp",
    "width": 0.25,
    "depth": 2,
    "base-hidden": 64,
    "bias": False,
    "client-widths": "",
    "seed": 3,
}


def write_run(folder, temperature: float = 0.25) -> dict[str, torch.Tensor]:
    """``results.csv`` (``average``, ``average_t``) and ``merged-average.safetensors`` of a
    model of ``CONFIG``; the saved weights."""
    config = validate_run_config(CONFIG, check_devices=False)
    state = build_from_config(config, load_splits(config), seed=7).state_dict()
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, folder / "merged-average.safetensors")
    keys = {k: config[k] for k in run_schema() if k != "out-dir"}
    rows = [
        {"method": "average", **keys, "temperature": 1.0, "accuracy": 0.5},
        {"method": "average_t", **keys, "temperature": temperature, "accuracy": 0.5},
    ]
    pd.DataFrame(rows).to_csv(folder / "results.csv", index=False)
    return state


def test_a_runs_merge_loads_as_its_model_with_the_fitted_temperature(tmp_path):
    saved = write_run(tmp_path / "run")
    merged = load_merged(tmp_path / "run", "average_t")
    assert (merged.method, merged.temperature) == ("average", 0.25)
    assert merged.config["width"] == 0.25 and merged.config["bias"] == "false"
    assert not merged.model.training
    loaded = merged.model.state_dict()
    assert loaded.keys() == saved.keys()
    assert all(torch.equal(loaded[k], saved[k]) for k in saved)  # the saved weights, exactly
    x = torch.randn(5, 784)
    with torch.no_grad():
        assert torch.equal(merged.calibrated_logits(x), merged.model(x) / 0.25)
    assert load_merged(tmp_path / "run", "average").temperature == 0.25  # same file, same T


def test_a_sweep_cells_merge_reads_the_cells_rows_one_folder_up(tmp_path):
    sweep = tmp_path / "sweep"
    write_run(sweep / "cells" / "0123456789ab", temperature=0.5)
    rows = pd.read_csv(sweep / "cells" / "0123456789ab" / "results.csv")
    (sweep / "cells" / "0123456789ab" / "results.csv").unlink()
    other = rows.assign(temperature=2.0)
    pd.concat([other.assign(cell_id="ffffffffffff"), rows.assign(cell_id="0123456789ab")]).to_csv(
        sweep / "results.csv", index=False
    )
    merged = load_merged(sweep / "cells" / "0123456789ab", "average")
    assert merged.temperature == 0.5  # this cell's _t row, not the other cell's


def test_a_merge_that_was_not_saved_is_refused_naming_the_saved_ones(tmp_path):
    write_run(tmp_path / "run")
    with pytest.raises(ConfigError) as error:
        load_merged(tmp_path / "run", "weight_matching_t")
    assert str(error.value) == (
        f"merge 'weight_matching_t': no merged-weight_matching.safetensors in "
        f"{str(tmp_path / 'run')!r}; saved: average"
    )
