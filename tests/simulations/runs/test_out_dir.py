"""A sweep's out dir before its cells run (:mod:`fedlmc.simulations.runs.out_dir`): the record in
``config.json``, the one-line refusal of a different sweep naming how it differs, and
``force`` keeping the previous files with the rows of the cells still in the sweep."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from fedlmc.simulations.config import ConfigError, cell_id, expand_grid, load_sweep_config
from fedlmc.simulations.records.cell_rows import cell_rows
from fedlmc.simulations.runs.out_dir import (
    describe_difference,
    experiment_of,
    prepare_out_dir,
    sweep_record,
)


def record(tmp_path, seeds: list[int]) -> dict:
    path = tmp_path / f"sweep-{len(seeds)}.toml"
    path.write_text(
        f'name = "tiny"\n[run]\nepochs = 1\nmethods = "average"\n[grid]\nseed = {seeds}\n'
    )
    sweep = load_sweep_config(path, check_devices=False)
    return sweep_record(sweep, expand_grid(sweep))


def test_the_record_holds_every_cell_with_its_id_and_the_versions(tmp_path):
    made = record(tmp_path, [0, 1])
    assert made["name"] == "tiny" and "torch" in made["versions"]
    assert [c["cell_id"] for c in made["cells"]] == [cell_id(c["config"]) for c in made["cells"]]
    assert [c["config"]["seed"] for c in made["cells"]] == [0, 1]
    assert list(experiment_of(made)) == [c["cell_id"] for c in made["cells"]]


def test_the_same_sweep_resumes_and_a_different_one_is_refused(tmp_path):
    out = tmp_path / "out"
    first = record(tmp_path, [0, 1])
    prepare_out_dir(out, first, force=False)
    assert json.loads((out / "config.json").read_text())["cells"] == first["cells"]
    prepare_out_dir(out, first, force=False)  # the same sweep: resume
    with pytest.raises(ConfigError) as error:
        prepare_out_dir(out, record(tmp_path, [0, 1, 2]), force=False)
    message = str(error.value)
    assert message.startswith(f"out dir {str(out)!r} holds a different sweep (1 new cell(s)")
    assert message.endswith("allowed: the same sweep (to resume), another --out, or --force")


def test_force_keeps_the_previous_files_and_the_rows_of_kept_cells(tmp_path):
    out = tmp_path / "out"
    first = record(tmp_path, [0, 1])
    prepare_out_dir(out, first, force=False)
    rows = [
        cell_rows(
            c["cell_id"], c["config"], pd.DataFrame({"method": ["average"], "accuracy": [0.5]})
        )
        for c in first["cells"]
    ]
    pd.concat(rows).to_csv(out / "results.csv", index=False)
    second = record(tmp_path, [1, 2])
    prepare_out_dir(out, second, force=True)
    assert (out / "results.previous.csv").is_file() and (out / "config.previous.json").is_file()
    kept = pd.read_csv(out / "results.csv", dtype={"cell_id": str})
    assert kept["cell_id"].tolist() == [first["cells"][1]["cell_id"]]  # seed 1 is in both


def test_the_difference_names_new_and_gone_cells_and_changed_keys():
    old = {"a": {"seed": 0, "epochs": 1}, "b": {"seed": 1, "epochs": 1}}
    new = {"a": {"seed": 0, "epochs": 1}, "c": {"seed": 1, "epochs": 2}}
    assert describe_difference(old, new) == (
        "1 new cell(s); 1 cell(s) no longer in the sweep; changed keys: epochs"
    )
    assert describe_difference(old, old) == "different cells"


def test_preparing_keeps_a_users_dot_tmp_files_and_folders(tmp_path):
    out = tmp_path / "out"
    (out / ".x.tmp").mkdir(parents=True)  # used to raise IsADirectoryError
    (out / ".notes.tmp").write_text("mine\n")  # used to be deleted
    (out / ".results.csv.q1w2e3r4.tmp").write_text("half")  # a killed atomic write's
    prepare_out_dir(out, record(tmp_path, [0]), force=False)
    assert (out / ".notes.tmp").read_text() == "mine\n" and (out / ".x.tmp").is_dir()
    assert not (out / ".results.csv.q1w2e3r4.tmp").exists()
