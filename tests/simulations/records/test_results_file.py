"""Results are never destroyed: a damaged results.csv is detected on read (bad rows set aside into
a named file, their cells rerun), a run and a sweep never share an out dir, and outputs that
cannot be written are refused before any work (cells run through a plain runner: no Flower)."""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

import pandas as pd
import pytest

from fedlmc.simulations.cli import main
from fedlmc.simulations.config import ConfigError, sweep_from_mapping
from fedlmc.simulations.records.results_file import (
    finished_cells,
    out_dir_kind,
    read_results,
    refuse_mixing,
)
from fedlmc.simulations.runs.sweep import run_sweep

REJECTED = "results.rejected.csv"  # where the bad lines of results.csv go (module docstring)
SWEEP = {
    "name": "three",
    "run": {"epochs": 1, "lambdas": 3, "methods": "average,average_t"},
    "grid": {"seed": [0, 1, 2]},
}
METHODS = ["average", "average_t"]


def runner_counting(calls: list):
    """Two rows per cell (the config's methods), values a function of the seed and method."""

    def runner(config):
        calls.append(config["seed"])
        return pd.DataFrame(
            [
                {"method": m, "accuracy": 0.5 + config["seed"] / 10 + i / 100, "clients_failed": ""}
                for i, m in enumerate(METHODS)
            ]
        )

    return runner


def finished_sweep(out: Path) -> pd.DataFrame:
    return run_sweep(sweep_from_mapping(SWEEP), out, runner=runner_counting([]), progress=False)


@pytest.fixture(scope="module")
def undamaged(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    """One finished sweep (3 cells x 2 rows) copied by each damage test."""
    out = tmp_path_factory.mktemp("undamaged") / "sweep"
    finished_sweep(out)
    return out, by_cell(read_results(out))


def resumed_running_nothing(out: Path) -> pd.DataFrame:
    """The sweep rerun in ``out`` where every cell is complete: it must run none."""
    runner = lambda _config: pytest.fail("a complete cell was rerun")  # noqa: E731
    return run_sweep(sweep_from_mapping(SWEEP), out, runner=runner, progress=False)


def by_cell(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["cell_id", "method"]).reset_index(drop=True)


def copy_of(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")


def cut_last_row_mid_line(lines: list[str]) -> str:
    return "\n".join(lines[:-1])[:-6]  # the last row loses its end and its line end


def garbage_with_an_unclosed_quote(lines: list[str]) -> str:
    return "\n".join([*lines[:2], 'junk,"open quote', *lines[2:]])


def fields_of(line: str) -> list[str]:
    return next(csv.reader([line]))


def with_text_in_accuracy(header: str, line: str) -> str:
    fields = fields_of(line)
    fields[fields_of(header).index("accuracy")] = "oops"
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="").writerow(fields)
    return buffer.getvalue()


def text_in_a_numeric_column(lines: list[str]) -> str:
    return "\n".join([*lines[:3], with_text_in_accuracy(lines[0], lines[3]), *lines[4:]])


def nul_in_a_string_column(lines: list[str]) -> str:
    return "\n".join([*lines[:5], lines[5].replace("average", "aver\x00age", 1), *lines[6:]])


def a_row_deleted(lines: list[str]) -> str:
    return "\n".join([*lines[:4], *lines[5:]])


def a_row_twice(lines: list[str]) -> str:
    return "\n".join([*lines[:4], lines[3], *lines[4:]])


# damage -> (index in lines_of() of the row whose cell must run again (None: none), lines set
# aside); rows 1-2 are seed 0's, 3-4 seed 1's, 5-6 seed 2's
DAMAGES = {
    cut_last_row_mid_line: (6, 1),
    garbage_with_an_unclosed_quote: (None, 1),  # the next real row is kept: nothing reruns
    text_in_a_numeric_column: (3, 1),
    nul_in_a_string_column: (5, 1),
    a_row_deleted: (4, 0),
    a_row_twice: (3, 0),
}


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda f: f.__name__)
def test_a_damaged_results_file_ends_with_the_rows_of_an_undamaged_one(
    tmp_path, capsys, undamaged, damage
):
    """Each damage of issue 31: the bad line alone is set aside (byte for byte), the cell that
    lost a row (and that one only) runs again, its other row replaced, never duplicated; the
    folder ends with exactly the undamaged rows (the runner is deterministic)."""
    source, expected = undamaged
    out = copy_of(source, tmp_path / "sweep")
    results = out / "results.csv"
    lines = lines_of(results)
    rerun_index, set_aside = DAMAGES[damage]
    damaged = damage(lines)
    results.write_text(damaged, encoding="utf-8")
    calls: list = []
    table = run_sweep(sweep_from_mapping(SWEEP), out, runner=runner_counting(calls), progress=False)
    seed_at = lines[0].split(",").index("seed")
    rerun = [] if rerun_index is None else [int(fields_of(lines[rerun_index])[seed_at])]
    assert calls == rerun
    pd.testing.assert_frame_equal(by_cell(table), expected)
    pd.testing.assert_frame_equal(by_cell(read_results(out)), expected)
    err = capsys.readouterr().err
    if set_aside:
        rejected = (out / REJECTED).read_bytes().decode("utf-8").split("\n")
        assert rejected[0] == lines[0] and len(rejected) == 2 + set_aside  # header, line, end
        assert rejected[1] in damaged.split("\n")
        assert f"{set_aside} bad row(s)" in err and REJECTED in err
    else:
        assert not (out / REJECTED).exists()
        said = "hold a duplicated row" if damage is a_row_twice else "lack rows"
        assert said in err and "they run again" in err
    # a second rerun has nothing left to do
    again = resumed_running_nothing(out)
    pd.testing.assert_frame_equal(by_cell(again), expected)


def test_each_bad_line_is_named_and_a_report_sees_every_good_row(tmp_path, capsys, undamaged):
    """Read for a report (nothing set aside): an unclosed quote keeps its neighbour, each bad
    line is named with its reason, and the cells that lack rows are named too."""
    source, expected = undamaged
    out = copy_of(source, tmp_path / "sweep")
    results = out / "results.csv"
    lines = lines_of(results)
    oops = with_text_in_accuracy(lines[0], lines[3])
    nul = lines[5].replace(",", ",\x00", 1)  # in the status field
    damaged = [*lines[:2], 'junk,"open quote', lines[2], oops, lines[4], nul, *lines[6:]]
    results.write_text("\n".join(damaged), encoding="utf-8")
    table = read_results(out)
    assert len(table) == len(expected) - 2  # the row after the unclosed quote is kept
    assert lines[2].split(",")[0] in set(table["cell_id"])
    err = capsys.readouterr().err
    assert str(results) in err and "3 bad row(s)" in err and "left out" in err
    assert "line 3: an unclosed quote" in err
    assert "line 5: accuracy = 'oops' is not a number" in err
    assert "line 7: status holds a control character ('\\x00')" in err
    assert "2 cell(s)" in err and "lack rows" in err and "rerun the sweep" in err
    assert not (out / REJECTED).exists()  # reading for a report sets nothing aside


def test_a_duplicated_row_is_named_as_duplicated_not_as_lacking_rows(tmp_path, capsys, undamaged):
    """Issue 52: a cell holding one of its rows twice is reported as holding a duplicated row,
    with the cell and the method named; a cell that also lost a row lacks rows too."""
    source, _expected = undamaged
    out = copy_of(source, tmp_path / "sweep")
    results = out / "results.csv"
    lines = lines_of(results)
    header = fields_of(lines[0])
    cell, method = (fields_of(lines[3])[header.index(k)] for k in ("cell_id", "method"))
    results.write_text(a_row_twice(lines), encoding="utf-8")
    read_results(out)
    err = capsys.readouterr().err
    assert f"1 cell(s) in {str(results)!r} hold a duplicated row ({cell}: {method!r})" in err
    assert "rerun the sweep to replace their rows" in err and "lack rows" not in err
    other = fields_of(lines[5])[header.index("cell_id")]
    twice_and_lost = [*lines[:5], lines[3], lines[5], *lines[7:]]  # seed 2 lost its second row
    results.write_text("\n".join(twice_and_lost), encoding="utf-8")
    read_results(out)
    err = capsys.readouterr().err
    assert f"({cell}: {method!r})" in err and f"lack rows ({other})" in err
    results.write_text("\n".join([*lines[:4], lines[3], *lines[5:]]), encoding="utf-8")
    read_results(out)  # seed 1's first row twice, its second row lost: named in both lines
    err = capsys.readouterr().err
    assert f"({cell}: {method!r})" in err and f"lack rows ({cell})" in err


def test_a_cell_is_done_only_with_exactly_its_methods(undamaged):
    _source, rows = undamaged
    expected = {cid: METHODS for cid in rows["cell_id"]}
    assert finished_cells(rows, expected) == set(rows["cell_id"])
    first = rows["cell_id"].iloc[0]
    assert first not in finished_cells(rows.iloc[1:], expected)  # one row missing
    assert first not in finished_cells(pd.concat([rows, rows.iloc[:1]]), expected)  # twice
    assert finished_cells(rows, {**expected, first: ["average"]}) == set(rows["cell_id"]) - {first}


def test_a_runner_reporting_other_methods_records_a_failed_cell(tmp_path):
    def runner(config):
        return pd.DataFrame([{"method": "average", "accuracy": 0.5}])

    table = run_sweep(sweep_from_mapping(SWEEP), tmp_path / "out", runner=runner, progress=False)
    assert (table["status"] == "failed").all() and len(table) == 3
    assert "reported methods ['average']; expected ['average', 'average_t']" in table["error"][0]


def test_control_characters_are_written_as_spaces_so_a_row_stays_one_line(tmp_path):
    def runner(config):
        rows = runner_counting([])(config)
        return rows.assign(clients_failed="node 1:\nline two\x1b[31m\x00")

    out = tmp_path / "out"
    run_sweep(sweep_from_mapping(SWEEP), out, runner=runner, progress=False)
    table = read_results(out)
    assert len(table) == 6 and (table["status"] == "ok").all()
    assert table["clients_failed"].iloc[0] == "node 1: line two [31m "
    assert len((out / "results.csv").read_text().splitlines()) == 7


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


@pytest.mark.parametrize(
    "prefix, junk",
    [
        ("\ufeff", None),
        ("# exported by a spreadsheet\n", "# exported by a spreadsheet"),
        ("\ufeffjunk\n\n", "junk"),
    ],
    ids=["byte order mark", "junk before the header", "both"],
)
def test_a_byte_order_mark_or_junk_before_the_header_and_the_sweep_resumes(
    tmp_path, capsys, undamaged, prefix, junk
):
    """A BOM is read as one (not as part of ``cell_id``), a line above the header is set
    aside like any bad line; the sweep resumes with nothing to run and the rows unchanged."""
    source, expected = undamaged
    out = copy_of(source, tmp_path / "sweep")
    results = out / "results.csv"
    results.write_bytes(prefix.encode("utf-8") + results.read_bytes())
    assert out_dir_kind(out) == "sweep"
    table = resumed_running_nothing(out)
    pd.testing.assert_frame_equal(by_cell(table), expected)
    err = capsys.readouterr().err
    if junk is not None:
        assert "1 bad row(s)" in err and "line 1: before the header" in err
        assert (out / REJECTED).read_text(encoding="utf-8").splitlines()[1:] == [junk]
    else:
        assert "bad row" not in err and not (out / REJECTED).exists()
    start = b"cell_id" if junk is not None else b"\xef\xbb\xbfcell_id"  # rewritten, or kept
    assert results.read_bytes().startswith(start)


def test_another_sweeps_rows_are_set_aside_and_counted(tmp_path, capsys, undamaged):
    """Rows of cells the folder's config.json does not hold (another sweep's results.csv pasted
    in) are left out of a report's reading and set aside by the sweep, with their count."""
    source, expected = undamaged
    other = tmp_path / "other"
    run_sweep(
        sweep_from_mapping({**SWEEP, "grid": {"seed": [5, 6, 7, 8]}}),
        other,
        runner=runner_counting([]),
        progress=False,
    )
    out = copy_of(source, tmp_path / "sweep")
    results = out / "results.csv"
    foreign = lines_of(other / "results.csv")[1:]
    results.write_text(results.read_text() + "\n".join(foreign), encoding="utf-8")
    report_view = read_results(out)
    pd.testing.assert_frame_equal(by_cell(report_view), expected)
    err = capsys.readouterr().err
    assert "8 row(s) of 4 cell(s) not in this sweep's config.json" in err and "left out" in err
    table = resumed_running_nothing(out)
    pd.testing.assert_frame_equal(by_cell(table), expected)
    err = capsys.readouterr().err
    assert "8 row(s) of 4 cell(s)" in err and REJECTED in err
    rejected = (out / REJECTED).read_text(encoding="utf-8").splitlines()
    assert len(rejected) == 1 + 8 and sorted(rejected[1:]) == sorted(x for x in foreign if x)
    pd.testing.assert_frame_equal(by_cell(read_results(out)), expected)


def test_a_renamed_column_is_read_under_its_new_name(tmp_path):
    """Results written before the rename hold ``logit_norm_ratio`` (the merge over the clients'
    mean logit norm): read back it is ``logit_norm_ratio_client_norms``, never a column that
    could be taken for the ratio LEWC predicts; a file holding both (a sweep resumed after the
    rename) keeps the new values and takes the old ones where the new are missing."""
    header = "cell_id,status,error,method,logit_norm_ratio"
    (tmp_path / "results.csv").write_text(f"{header}\n{'a' * 12},ok,,average,0.11\n")
    frame = read_results(tmp_path, check_cells=False)
    assert "logit_norm_ratio" not in frame
    assert frame["logit_norm_ratio_client_norms"].tolist() == [0.11]
    header += ",logit_norm_ratio_client_norms,logit_norm_ratio_logit_ensemble"
    rows = [f"{'a' * 12},ok,,average,0.11,,", f"{'b' * 12},ok,,average,,0.2,0.21"]
    (tmp_path / "results.csv").write_text("\n".join([header, *rows]) + "\n")
    frame = read_results(tmp_path, check_cells=False)
    assert frame["logit_norm_ratio_client_norms"].tolist() == [0.11, 0.2]
    assert "logit_norm_ratio" not in frame
