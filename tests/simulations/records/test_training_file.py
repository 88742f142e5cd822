"""``training.csv`` is read line by line like ``results.csv``: a damaged line costs that line
only (set aside in ``training.rejected.csv`` when a sweep rewrites the file, named in a
warning), never another cell's history; a file cut off mid-line warns; another sweep's rows
are counted and left out. The files are written by the real writer (``replace_cell_rows``) in
a sweep folder made by ``run_sweep`` with a plain runner (no Flower)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from fedlmc.simulations.config import sweep_from_mapping
from fedlmc.simulations.records.training_file import read_training, replace_cell_rows
from fedlmc.simulations.runs.sweep import run_sweep
from fedlmc.training_columns import CLIENT_EPOCH, METRIC_COLUMNS, TRAINING_FILE

SWEEP = {"name": "curves", "run": {"epochs": 3, "methods": "average"}, "grid": {"seed": [0, 1]}}
CLIENTS, EPOCHS = 2, 3
REJECTED = "training.rejected.csv"


def curves(seed: int) -> pd.DataFrame:
    """One cell's rows as the ServerApp makes them: per client and epoch, the config columns
    first (values a function of the seed, client and epoch)."""
    rows = []
    for client in range(CLIENTS):
        for step in range(1, EPOCHS + 1):
            metrics = dict.fromkeys(METRIC_COLUMNS, math.nan)
            metrics.update(
                train_loss=1.0 / step + seed / 10 + client, train_accuracy=0.5 + step / 10
            )
            rows.append({"seed": seed, "epochs": EPOCHS, "phase": CLIENT_EPOCH, "client": client,
                         "step": step, **metrics})  # fmt: skip
    return pd.DataFrame(rows)


@pytest.fixture
def folder(tmp_path) -> tuple[Path, list[str]]:
    """A sweep folder (config.json, results.csv) with both cells' curves; its cell ids."""
    out = tmp_path / "sweep"
    frame = pd.DataFrame([{"method": "average", "accuracy": 0.5}])
    run_sweep(sweep_from_mapping(SWEEP), out, runner=lambda _config: frame, progress=False)
    cells = [c["cell_id"] for c in json.loads((out / "config.json").read_text())["cells"]]
    for seed, cid in enumerate(cells):
        replace_cell_rows(out, cid, curves(seed))
    return out, cells


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_an_extra_field_costs_its_line_only_when_another_cell_reruns(folder, capsys):
    """The damaged line (the first cell's client 1, epoch 2) is set aside byte for byte; that
    cell's other rows survive the other cell's rerun, which replaces that cell's rows."""
    out, cells = folder
    cells = sorted(cells)  # the file's order: lines 1-6 are the first cell's
    path = out / TRAINING_FILE
    lines = lines_of(path)
    damaged = lines[5] + ",surplus"
    path.write_text("\n".join([*lines[:5], damaged, *lines[6:]]) + "\n", encoding="utf-8")
    table = replace_cell_rows(out, cells[1], curves(7))
    err = capsys.readouterr().err
    assert "1 bad row(s)" in err and "line 6" in err and "fields where the header has" in err
    assert REJECTED in err and str(path) in err
    assert lines_of(out / REJECTED) == [lines[0], damaged]
    kept = read_training(out)
    first = kept[kept["cell_id"] == cells[0]]
    assert len(first) == CLIENTS * EPOCHS - 1  # all but the damaged line
    assert len(kept[kept["cell_id"] == cells[1]]) == CLIENTS * EPOCHS
    assert (kept.loc[kept["cell_id"] == cells[1], "seed"] == 7).all()
    assert len(table) == len(kept)
    assert lines_of(path)[1:6] == [*lines[1:5], lines[6]]  # as they were written


def test_an_unclosed_quote_does_not_swallow_the_next_row(folder, capsys):
    out, _cells = folder
    path = out / TRAINING_FILE
    lines = lines_of(path)
    path.write_text("\n".join([*lines[:3], 'junk,"open quote', *lines[3:]]) + "\n")
    kept = read_training(out)
    assert len(kept) == 2 * CLIENTS * EPOCHS  # every real row
    err = capsys.readouterr().err
    assert "line 4: an unclosed quote" in err and "left out" in err
    assert not (out / REJECTED).exists()  # reading for a report sets nothing aside


def test_a_file_cut_in_half_warns_and_keeps_the_whole_lines(folder, capsys):
    out, _cells = folder
    path = out / TRAINING_FILE
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    whole = data[: len(data) // 2].count(b"\n") - 1  # whole rows before the cut (less the header)
    kept = read_training(out)
    assert len(kept) == whole
    assert "cut off (the file does not end with a line end)" in capsys.readouterr().err


def test_a_byte_order_mark_junk_above_the_header_and_another_sweeps_rows(folder, capsys):
    out, cells = folder
    path = out / TRAINING_FILE
    lines = lines_of(path)
    first = sorted(cells)[0]  # the file's order: lines 1-6 are its rows
    stranger = [line.replace(first, "0123456789ab") for line in lines[1:3]]
    assert all("0123456789ab" in line for line in stranger)
    text = "\n".join(["\ufeffexported by hand", *lines, *stranger]) + "\n"
    path.write_text(text, encoding="utf-8")
    kept = read_training(out)
    assert sorted(kept["cell_id"].unique()) == sorted(cells)
    assert len(kept) == 2 * CLIENTS * EPOCHS
    err = capsys.readouterr().err
    assert "line 1: before the header" in err
    assert "2 row(s) of 1 cell(s) not in this sweep's config.json" in err
    replace_cell_rows(out, cells[1], curves(1))  # a rerun sets both aside
    assert lines_of(out / REJECTED) == [lines[0], "exported by hand", *stranger]
    assert lines_of(path) == lines
