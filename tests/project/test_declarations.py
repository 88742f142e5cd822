"""One declaration per results column and per run-config key: a column a merge method declares
reaches the results schema, the docs' columns table and the report; a key declared once reaches
the run-config schema, the keys table, validation, the cell identity and the generated
``pyproject.toml`` block (which a test holds equal to the file)."""

from __future__ import annotations

import ast
import math
import re
import shutil
from pathlib import Path

import pytest

from fedlmc.columns import COMMON_COLUMNS, REPORT_SECTIONS, Column
from fedlmc.merging.merge_job import Alignment
from fedlmc.merging.method_registry import METHODS, register_method
from fedlmc.merging.methods import merge_states
from fedlmc.simulations import config as run_config
from fedlmc.simulations.cli import main
from fedlmc.simulations.config import (
    CONSISTENCY_CHECKS,
    RUN_KEYS,
    ConfigError,
    canonical_run_config,
    cell_id,
    run_schema,
    runtime_keys,
    validate_run_config,
)
from fedlmc.simulations.config.schema import Key, Rule, at_least
from fedlmc.simulations.config.tables import (
    _pyproject_config_of,
    columns_table,
    keys_table,
    pyproject_config,
    with_pyproject_config,
)
from fedlmc.simulations.records.results_file import numeric_columns
from fedlmc.study.compare import compare_methods
from fedlmc.study.method_policy import EVALUATIONS, evaluation_of, register_evaluation
from fedlmc.study.rows import (
    COLUMNS,
    ROUND_COLUMNS,
    column_table,
    columns_markdown,
    empty_row,
    report_tables,
    row_columns,
    string_columns,
)

try:  # rootdir on sys.path, or tests/ itself (pytest's default import mode)
    from tests.fedlmc.test_registry import tiny_splits, tiny_states
except ImportError:
    from tests.fedlmc.test_registry import tiny_splits, tiny_states

ROOT = Path(__file__).resolve().parents[2]

SHIFT = Column(
    "halfway_shift",
    "Mean shift of the clients towards client 0 (test column)",
    "`halfway`, `halfway_t` rows",
    "the mean absolute change of the weights the `halfway` method made",
    report_table="mechanism",
)


@pytest.fixture
def halfway_with_column():
    """A temporary merge method that fills its own column, declared by its evaluation policy."""

    @register_method("halfway", description="test: clients moved halfway")
    def halfway(job) -> Alignment:
        first = job.states[0]
        moved = [{k: (v + first[k]) / 2 for k, v in sd.items()} for sd in job.states]
        shift = sum(
            float((m[k] - sd[k]).abs().mean())
            for m, sd in zip(moved, job.states, strict=True)
            for k in sd
        )
        return Alignment(moved, info={"halfway_shift": shift})

    register_evaluation("halfway", columns=(SHIFT,))
    yield halfway
    METHODS.remove("halfway")
    EVALUATIONS.remove("halfway")


def test_a_method_column_is_one_declaration_that_reaches_every_list(halfway_with_column):
    assert "halfway_shift" not in COLUMNS  # not in the common table: the method declares it
    assert "halfway_shift" in row_columns() and "halfway_shift" in numeric_columns()
    assert "halfway_shift" in empty_row("average", 2)
    assert "| `halfway_shift` | number |" in columns_markdown()
    assert "declared by the `halfway` method" in columns_table()
    assert ("halfway_shift", SHIFT.measures) in report_tables()  # report_table = mechanism
    mechanism = [c for c, _ in report_tables() if c in ("recip_orth_mean", "halfway_shift")]
    assert mechanism == ["recip_orth_mean", "halfway_shift"]  # its section, in table order
    template, states = tiny_states()
    rows = compare_methods(
        template, states, [1, 1], tiny_splits(), ["average", "halfway"], diagnostics=False
    ).rows
    assert tuple(rows[1]) == row_columns() and rows[1]["halfway_shift"] > 0
    assert math.isnan(rows[0]["halfway_shift"])  # another method's row: NaN
    METHODS.remove("halfway")
    try:
        assert "halfway_shift" not in row_columns() and "halfway_shift" not in columns_markdown()
        assert all(column != "halfway_shift" for column, _ in report_tables())
    finally:
        register_method("halfway", description="again")(halfway_with_column)


def test_the_auto_columns_are_declared_by_the_auto_method():
    auto = {c.name for c in evaluation_of("auto").columns}
    # its own two, and what the alignment did when it kept weight matching
    assert auto == {"auto_choice", "auto_nll_gap", "aligned_groups", "aligned_units_moved"}
    assert not auto & set(COLUMNS) and auto <= set(row_columns())
    assert "auto_choice" in string_columns() and "auto_nll_gap" in numeric_columns()
    assert "declared by the `auto` method" in columns_markdown()


def test_a_method_must_declare_the_columns_it_reports():
    """The library's merge returns what the method reports; the study, which makes it a
    results column, refuses a key the method's evaluation policy does not declare."""

    @register_method("undeclared", description="test: reports an undeclared column")
    def undeclared(job) -> Alignment:
        return Alignment(list(job.states), info={"surprise": 1.0})

    try:
        template, states = tiny_states()
        assert merge_states("undeclared", template, states, with_info=True)[2] == {"surprise": 1.0}
        with pytest.raises(ValueError, match="reports column 'surprise' it does not declare"):
            compare_methods(template, states, [1, 1], tiny_splits(), ["undeclared"])
    finally:
        METHODS.remove("undeclared")


@pytest.mark.parametrize(
    ("column", "message"),
    [
        (Column("accuracy", "x", "x", "x"), "column 'accuracy' is already declared"),
        (Column("auto_choice", "x", "x", "x"), "column 'auto_choice' is already declared"),
        (Column("rounds_x", "x", "x", "x", source="round"), "allowed: a fedlmc.columns.Column"),
        ("a_name", "allowed: a fedlmc.columns.Column"),
    ],
)
def test_a_method_column_must_be_new(column, message):
    with pytest.raises(ValueError, match=message):
        register_evaluation("collides", columns=(column,))
    assert "collides" not in EVALUATIONS


def test_a_column_declaration_is_checked():
    with pytest.raises(ValueError, match="kind = 'float'; allowed: 'number', 'text', 'JSON'"):
        Column("x", "x", "x", "x", kind="float")
    with pytest.raises(ValueError, match="report_table = 'gaps'; allowed: '', 'merge gap'"):
        Column("x", "x", "x", "x", report_table="gaps")
    with pytest.raises(ValueError, match="column name 'a b'"):
        Column("a b", "x", "x", "x")


def test_the_docs_table_has_one_row_per_column_and_escapes_pipes():
    lines = columns_markdown().splitlines()
    assert len(lines) == 2 + len(column_table())
    for line, column in zip(lines[2:], column_table(), strict=True):
        assert line.startswith(f"| `{column.name}` | {column.kind} |")
        assert len(re.findall(r"(?<!\\)\|", line)) == 6, line  # five cells, no stray pipe


def test_the_report_tables_are_the_declared_numeric_columns():
    reported = [c for c in COMMON_COLUMNS if c.report_table]
    tables = report_tables()
    assert len(tables) == len(reported)
    assert {name for name, _ in tables} == {c.name for c in reported}
    assert all(not c.is_string for c in reported)
    section = {c.name: REPORT_SECTIONS.index(c.report_table) for c in reported}
    order = [section[name] for name, _ in tables]
    assert order == sorted(order) and tables[0][0] == "merge_gap_accuracy"


def _literal_keys(tree: ast.AST, names: set[str]) -> set[str]:
    """String keys written as ``name["key"] = ...`` or in a dict literal assigned to ``name``."""
    found = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if (
                isinstance(target, ast.Subscript)
                and isinstance(target.value, ast.Name)
                and target.value.id in names
                and isinstance(target.slice, ast.Constant)
            ):
                found.add(target.slice.value)
            if (
                isinstance(target, ast.Name)
                and target.id in names
                and isinstance(node.value, ast.Dict)
            ):
                found.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return found


def test_every_column_the_server_adds_is_declared():
    """The Flower server's round and server columns bypass ``empty_row``: each one it writes is
    in the column table (and the round columns are exactly the declared ones)."""
    written = set()
    modules = ("simulations/server_app.py", "simulations/records/server_outcome.py")
    for module in (*modules, "fedlmc/study/model_rows.py"):  # the ServerApp and its rows
        tree = ast.parse((ROOT / module).read_text())
        written |= _literal_keys(tree, {"row", "columns"})
    declared = {c.name for c in column_table()}
    assert {"clients_survived", "temperature_server_split", "merge_seconds"} <= written
    assert written <= declared, written - declared
    from fedlmc.simulations.records.provenance import version_columns

    assert set(version_columns("cpu")) <= declared
    assert ROUND_COLUMNS == tuple(c.name for c in column_table() if c.source == "round")


# ----------------------------------------------------------------------------- run-config keys

KNOB = Key(
    int,
    3,
    "test knob of the average strategy",
    at_least(1),
    applies=Rule('`strategy = "average"`', lambda c: c["strategy"] == "average"),
)


@pytest.fixture
def knob(monkeypatch):
    """A run-config key declared once, for the length of a test."""
    monkeypatch.setitem(RUN_KEYS, "test-knob", KNOB)
    yield "test-knob"


def test_a_key_declared_once_reaches_the_schema_table_validation_and_identity(knob):
    assert run_schema()["test-knob"] is KNOB and validate_run_config({})["test-knob"] == 3
    assert (
        "| `test-knob` | int | `3` | test knob of the average strategy | only when "
        '`strategy = "average"` |' in keys_table()
    )
    with pytest.raises(ConfigError, match="test-knob = 0: allowed: a number >= 1"):
        validate_run_config({"test-knob": 0})
    with pytest.raises(ConfigError, match="unknown key 'test-knop' \\(did you mean 'test-knob'"):
        validate_run_config({"test-knop": 2})
    average = {"strategy": "average", "calibration": "none"}
    assert cell_id({**average, "test-knob": 2}) != cell_id({**average, "test-knob": 5})
    compare = validate_run_config({"test-knob": 5})
    assert canonical_run_config(compare)["test-knob"] == 3  # reset: compare ignores it
    assert cell_id({"test-knob": 2}) == cell_id({"test-knob": 5})
    assert "test-knob = 3" in pyproject_config()
    current = _pyproject_config_of((ROOT / "pyproject.toml").read_text())
    assert current != pyproject_config()  # the pyproject test below now fails until regenerated


def test_a_runtime_key_is_left_out_of_the_cell_identity(monkeypatch):
    monkeypatch.setitem(RUN_KEYS, "test-threads", Key(int, 1, "test", runtime=True))
    assert "test-threads" in runtime_keys()
    assert cell_id({"test-threads": 1}) == cell_id({"test-threads": 8})
    assert "| `test-threads` | int | `1` | test | no: runtime |" in keys_table()


def test_runtime_keys_are_the_declared_ones():
    assert set(runtime_keys()) == {
        "out-dir",
        "max-client-share",
        "outlier-factor",
        "client-check",
        "data-root",
        "download",
        "data-mirror",
        "timeout",
        "num-cpus",
        "num-gpus",
        "server-cpus",
        "device",
    }
    assert cell_id({"timeout": 5.0, "num-cpus": 2.0}) == cell_id({})


def test_a_consistency_check_registered_in_the_list_runs_at_validation(knob, monkeypatch):
    def knob_below_epochs(config):
        if config["test-knob"] > config["epochs"]:
            raise ConfigError(f"test-knob = {config['test-knob']}: allowed: at most epochs")

    checks = [*CONSISTENCY_CHECKS, knob_below_epochs]  # the list validation reads
    monkeypatch.setattr(run_config.validate, "CONSISTENCY_CHECKS", checks)
    with pytest.raises(ConfigError, match="test-knob = 20: allowed: at most epochs"):
        validate_run_config({"test-knob": 20})
    assert validate_run_config({"test-knob": 4})["test-knob"] == 4


def test_pyproject_config_is_the_generated_block():
    current = _pyproject_config_of((ROOT / "pyproject.toml").read_text())
    assert current == pyproject_config(), (
        "pyproject.toml's [tool.flwr.app.config] is not the declared keys: run "
        "`fedlmc keys --write-pyproject pyproject.toml`"
    )


def test_the_generator_rewrites_a_stale_block(tmp_path, capsys):
    path = tmp_path / "pyproject.toml"
    shutil.copy(ROOT / "pyproject.toml", path)
    stale = path.read_text().replace('dataset = "mnist5k"\n', "")
    path.write_text(stale + "\n[tool.other]\nx = 1\n")
    assert main(["keys", "--write-pyproject", str(path)]) == 0
    assert "updated" in capsys.readouterr().out
    text = path.read_text()
    assert _pyproject_config_of(text) == pyproject_config()
    assert text.endswith("[tool.other]\nx = 1\n")
    assert with_pyproject_config(text) == text
    assert main(["keys", "--pyproject"]) == 0
    assert capsys.readouterr().out == pyproject_config()
    (tmp_path / "bad.toml").write_text("[project]\n")
    assert main(["keys", "--write-pyproject", str(tmp_path / "bad.toml")]) == 2
    assert "no [tool.flwr.app.config] table" in capsys.readouterr().err
    assert main(["columns"]) == 0
    assert "| `merge_gap_accuracy` | number |" in capsys.readouterr().out


def test_the_canonical_resets_are_the_declared_rules():
    """Every key with an ``applies`` rule is reset where it does not apply, and no other key."""
    config = validate_run_config(
        {"strategy": "fedavg", "alpha": 0.3, "lambdas": 5, "calibration": "none", "depth": 2}
    )
    canonical = canonical_run_config(config)
    changed = {k for k in config if canonical[k] != config[k]}
    assert changed == {"alpha", "lambdas", "calibration", "bias"}  # bias: auto -> "true"
    resnet = canonical_run_config(validate_run_config({"model": "resnet20", "depth": 2}))
    assert resnet["depth"] == run_schema()["depth"].default and resnet["bias"] == "false"


# ----------------------------------------------------------------------------- models
