"""Results are never destroyed: a damaged results.csv is detected on read (bad rows set aside into
a named file, their cells rerun), a run and a sweep never share an out dir, and outputs that
cannot be written are refused before any work (cells run through a plain runner: no Flower)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from fedlmc.simulations.cli import main
from fedlmc.simulations.config import ConfigError, sweep_from_mapping
from fedlmc.simulations.results_file import REJECTED, out_dir_kind, read_results, refuse_mixing
from fedlmc.simulations.sweep import run_sweep

SWEEP = {"name": "two", "run": {"epochs": 1, "lambdas": 3}, "grid": {"seed": [0, 1]}}


def runner_counting(calls: list):
    def runner(config):
        calls.append(config["seed"])
        return pd.DataFrame([{"method": "average", "accuracy": 0.5 + config["seed"] / 10}])

    return runner


def finished_sweep(out: Path) -> None:
    run_sweep(sweep_from_mapping(SWEEP), out, runner=runner_counting([]), progress=False)


def test_a_row_cut_off_mid_line_is_set_aside_and_its_cell_rerun(tmp_path, capsys):
    out = tmp_path / "sweep"
    finished_sweep(out)
    results = out / "results.csv"
    text = results.read_text()
    results.write_text(text[: len(text) - 6])  # the last row loses its end
    calls: list = []
    table = run_sweep(sweep_from_mapping(SWEEP), out, runner=runner_counting(calls), progress=False)
    assert calls == [1]  # only the damaged cell ran again
    assert sorted(table["seed"]) == [0, 1] and (table["status"] == "ok").all()
    assert table.loc[table.seed == 1, "accuracy"].item() == pytest.approx(0.6)
    rejected = (out / REJECTED).read_text()
    assert rejected.splitlines()[0].startswith("cell_id") and len(rejected.splitlines()) == 2
    warning = capsys.readouterr().err
    assert str(results) in warning and "row 3" in warning and REJECTED in warning


def test_a_last_row_without_its_line_end_is_cut_off_even_with_every_field(tmp_path, capsys):
    out = tmp_path / "sweep"
    finished_sweep(out)
    results = out / "results.csv"
    results.write_text(results.read_text().rstrip("\n"))  # fields intact, the line end gone
    assert len(read_results(out)) == 1
    assert "cut off (the file does not end with a line end)" in capsys.readouterr().err


def test_junk_rows_are_left_out_with_the_file_named_never_a_tokenizer_error(tmp_path, capsys):
    out = tmp_path / "sweep"
    finished_sweep(out)
    results = out / "results.csv"
    good = read_results(out)
    header = results.read_text().splitlines()[0].split(",")
    text_in_number = ",".join(
        {"cell_id": "0123456789ab", "status": "ok", "accuracy": "oops"}.get(c, "") for c in header
    )
    with results.open("a") as handle:
        handle.write(text_in_number + "\n" + 'junk,"open quote\n')
    table = read_results(out)
    pd.testing.assert_frame_equal(table, good)  # the report sees no NaN row
    warning = capsys.readouterr().err
    assert str(results) in warning and "2 bad row(s)" in warning
    assert "accuracy = 'oops' is not a number" in warning and "fields where the header" in warning
    assert not (out / REJECTED).exists()  # reading for a report sets nothing aside


def test_a_run_and_a_sweep_never_share_an_out_dir(tmp_path, capsys):
    sweep_dir, run_dir = tmp_path / "sweep", tmp_path / "run"
    finished_sweep(sweep_dir)
    run_dir.mkdir()
    pd.DataFrame([{"method": "average", "accuracy": 0.9}]).to_csv(run_dir / "results.csv")
    assert (out_dir_kind(sweep_dir), out_dir_kind(run_dir)) == ("sweep", "run")
    before = (sweep_dir / "results.csv").read_bytes()
    assert main(["run", f"out-dir={sweep_dir}", "epochs=1"]) == 2
    assert "holds a sweep's results" in capsys.readouterr().err
    assert (sweep_dir / "results.csv").read_bytes() == before
    with pytest.raises(ConfigError, match="holds the results of a fedlmc run"):
        run_sweep(sweep_from_mapping(SWEEP), run_dir, runner=runner_counting([]), progress=False)
    assert main(["report", str(run_dir)]) == 2
    assert "holds the rows of one fedlmc run" in capsys.readouterr().err
    refuse_mixing(tmp_path / "new", "run")  # an empty or missing folder takes either


def test_unwritable_outputs_are_refused_before_any_work(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["run", f"out-dir={a_file}", "epochs=1"]) == 2
    assert "is a file; allowed: a folder" in capsys.readouterr().err
    missing = tmp_path / "no" / "rows.csv"
    assert main(["run", "--csv", str(missing), "epochs=1"]) == 2
    assert f"folder {str(missing.parent)!r} does not exist" in capsys.readouterr().err
    config = tmp_path / "two.toml"
    config.write_text('name = "two"\n[run]\nepochs = 1\nlambdas = 3\n[grid]\nseed = [0, 1]\n')
    assert main(["validate", str(config), "--out", str(a_file)]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["validate", str(config), "--out", str(tmp_path / "fine")]) == 0
