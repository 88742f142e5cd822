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
from fedlmc.merging.methods import METHODS, Alignment, merge_with_info, register_method
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
    columns_table,
    keys_table,
    pyproject_config,
    pyproject_config_of,
    with_pyproject_config,
)
from fedlmc.simulations.records.results_file import numeric_columns
from fedlmc.study.compare import compare_methods
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
    """A temporary merge method that declares and fills its own column."""

    @register_method("halfway", description="test: clients moved halfway", columns=(SHIFT,))
    def halfway(job) -> Alignment:
        first = job.states[0]
        moved = [{k: (v + first[k]) / 2 for k, v in sd.items()} for sd in job.states]
        shift = sum(
            float((m[k] - sd[k]).abs().mean())
            for m, sd in zip(moved, job.states, strict=True)
            for k in sd
        )
        return Alignment(moved, info={"halfway_shift": shift})

    yield halfway
    METHODS.remove("halfway")


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
        register_method("halfway", description="again", columns=(SHIFT,))(halfway_with_column)


def test_the_auto_columns_are_declared_by_the_auto_method():
    auto = {c.name for c in METHODS.get("auto").columns}
    # its own two, and what the alignment did when it kept weight matching
    assert auto == {"auto_choice", "auto_nll_gap", "aligned_groups", "aligned_units_moved"}
    assert not auto & set(COLUMNS) and auto <= set(row_columns())
    assert "auto_choice" in string_columns() and "auto_nll_gap" in numeric_columns()
    assert "declared by the `auto` method" in columns_markdown()


def test_a_method_must_declare_the_columns_it_reports():
    @register_method("undeclared", description="test: reports an undeclared column")
    def undeclared(job) -> Alignment:
        return Alignment(list(job.states), info={"surprise": 1.0})

    try:
        template, states = tiny_states()
        with pytest.raises(ValueError, match="reports column 'surprise' it does not declare"):
            merge_with_info("undeclared", template, states)
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
        register_method("collides", description="x", columns=(column,))(lambda job: None)
    assert "collides" not in METHODS


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
    for module in ("server_app.py", "records/server_outcome.py"):  # the ServerApp and its rows
        tree = ast.parse((ROOT / "simulations" / module).read_text())
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
    current = pyproject_config_of((ROOT / "pyproject.toml").read_text())
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
    current = pyproject_config_of((ROOT / "pyproject.toml").read_text())
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
    assert pyproject_config_of(text) == pyproject_config()
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


def test_a_model_declares_its_parameter_count_and_the_memory_check_reads_it(monkeypatch):
    """The memory check counts a registered model from its ``parameters`` declaration; a model
    that declares none is built on the meta device (torch is loaded here) and counted."""
    from fedlmc.models.registry import MODELS, register_model
    from fedlmc.simulations.config import memory_check_note, model_parameters

    mlp = validate_run_config({"model": "mlp", "bias": "false", "depth": 2, "base-hidden": 8})
    assert model_parameters(mlp) == 784 * 8 + 8 * 8 + 8 * 10
    calls = []

    def two_per_input(width, num_classes, in_shape, norm, *, bias):
        calls.append((width, num_classes, in_shape, norm, bias))
        return 2 * in_shape[0] * in_shape[1] * in_shape[2] * num_classes

    register_model("counted", "fedlmc.models:MLP", parameters=two_per_input,
                   options={"bias": MODELS.get("mlp").options["bias"]})  # fmt: skip
    try:
        config = validate_run_config({"model": "counted", "width": 3.0, "bias": "false"})
        assert model_parameters(config) == 2 * 784 * 10 and memory_check_note(config) is None
        assert set(calls) == {(3.0, 10, (1, 28, 28), "none", False)}  # called as the builder
        monkeypatch.setattr(run_config.feasibility, "machine_memory", lambda: 2 * 784 * 10)
        with pytest.raises(ConfigError, match=r"width = 3: the counted at width 3 has about"):
            validate_run_config({"model": "counted", "width": 3.0})
    finally:
        MODELS.remove("counted")


def test_a_factory_without_a_count_is_built_on_the_meta_device_where_torch_is_loaded(
    tmp_path, monkeypatch
):
    """Torch is loaded in this process: the memory check builds a user factory on the meta
    device and counts it (``fedlmc validate`` loads no torch: the slow test below)."""
    from fedlmc.simulations.config import memory_check_note, model_parameters

    (tmp_path / "tiny_factory_module.py").write_text(
        "import math\nfrom torch import nn\n\n\ndef make(width, num_classes, in_shape, norm):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), num_classes))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = validate_run_config({"model": "tiny_factory_module:make"})
    assert model_parameters(config) == 784 * 10 + 10 and memory_check_note(config) is None
    broken = validate_run_config({"model": "tiny_factory_module:math"}, check_devices=False)
    assert model_parameters(broken) is None  # not buildable here: the run's build names why
    assert "memory check skipped: model 'tiny_factory_module:math'" in memory_check_note(broken)


# ----------------------------------------------------------------------------- data sets


def tiny_pixels(name, root, download, mirror):
    """A 2-class 2x3x3 data set: 12 train and 4 test images of constant value 0 or 255."""
    import torch

    def images(labels):
        return (labels * 255).to(torch.uint8).view(-1, 1, 1, 1).expand(-1, 2, 3, 3).contiguous()

    y_train, y_test = torch.arange(12) % 2, torch.arange(4) % 2
    return (images(y_train), y_train), (images(y_test), y_test)


def int_pixels(name, root, download, mirror):
    """A broken loader: int64 pixels."""
    (x_train, y_train), (x_test, y_test) = tiny_pixels(name, root, download, mirror)
    return (x_train.long(), y_train), (x_test.long(), y_test)


TINY_SET = dict(
    num_classes=2,
    train_size=12,
    in_shape=(2, 3, 3),
    normalisation=((0.5, 0.5), (0.5, 0.25)),
    loader=tiny_pixels,
    description="test: constant images",
    augment="crop_flip",
)


@pytest.fixture
def tiny_dataset():
    """A data set declared once, for the length of a test."""
    from fedlmc.data.catalog import DATASET_REGISTRY, register_dataset

    register_dataset("tiny_set", **TINY_SET)
    yield "tiny_set"
    DATASET_REGISTRY.remove("tiny_set")


def test_a_data_set_declared_once_reaches_every_list(tiny_dataset, capsys):
    from fedlmc.data.catalog import (
        DATASETS,
        DOWNLOADABLE,
        IN_SHAPES,
        NUM_CLASSES,
        TRAIN_SIZES,
        datasets_markdown,
        register_dataset,
    )
    from fedlmc.data.loading import load_dataset
    from fedlmc.simulations.config import dataset_names, model_parameters

    assert DATASETS[-1] == "tiny_set" and "tiny_set" not in DOWNLOADABLE
    assert (NUM_CLASSES["tiny_set"], TRAIN_SIZES["tiny_set"]) == (2, 12)
    assert "tiny_set" in dataset_names() and "`tiny_set`" in keys_table()
    assert "| `tiny_set` | 2 | 12 | 2x3x3 | no | test: constant images |" in datasets_markdown()
    assert main(["data", "list"]) == 0 and "| `tiny_set` |" in capsys.readouterr().out
    config = validate_run_config(
        {"dataset": "tiny_set", "num-clients": 2, "bias": "false", "depth": 1, "base-hidden": 4}
    )
    assert IN_SHAPES["tiny_set"] == (2, 3, 3)
    assert model_parameters(config) == 18 * 4 + 4 * 2  # the memory check reads its shape
    splits = load_dataset("tiny_set", server_fraction=0.25, seed=0)
    assert splits.num_classes == 2 and splits.in_shape == (2, 3, 3)
    assert splits.augment == "crop_flip" and len(splits.test[0]) == 4
    x, y = splits.test
    # (p / 255 - mean_c) / std_c: class 0 -> -0.5/0.5, -0.5/0.25; class 1 -> 0.5/0.5, 0.5/0.25
    assert x[y == 0][:, 0].unique().tolist() == [-1.0] and x[y == 1][:, 1].unique().tolist() == [
        2.0
    ]
    with pytest.raises(ValueError, match=r"gave torch.int64 pixels of shape \(12, 2, 3, 3\); al"):
        register_dataset("tiny_set", **{**TINY_SET, "loader": int_pixels}, replace=True)
        load_dataset("tiny_set")
    with pytest.raises(ConfigError, match="download = true: dataset 'tiny_set' is not fetched"):
        validate_run_config({"dataset": "tiny_set", "download": True, "data-root": "/tmp"})
    from fedlmc.data.catalog import DATASET_REGISTRY

    DATASET_REGISTRY.remove("tiny_set")
    try:
        assert "tiny_set" not in DATASETS and "tiny_set" not in datasets_markdown()
        with pytest.raises(ConfigError, match="dataset = 'tiny_set': allowed: mnist5k"):
            validate_run_config({"dataset": "tiny_set"})
    finally:
        DATASET_REGISTRY.add("tiny_set", DATASET_REGISTRY.get("mnist5k"))  # the fixture removes


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ({"in_shape": (3, 3)}, r"in_shape = \(3, 3\); allowed: \(C, H, W\)"),
        ({"num_classes": 0}, "num_classes = 0; allowed: an int >= 1"),
        ({"normalisation": ((0.5,), (0.5,))}, "one value per channel \\(2\\)"),
        ({"torchvision": "MNIST"}, "folder = None; allowed: both .a torchvision data set. or"),
    ],
)
def test_a_data_set_declaration_is_checked(field, message):
    from fedlmc.data.catalog import DATASETS, register_dataset

    fields = dict(num_classes=2, train_size=12, in_shape=(2, 3, 3), loader=tiny_pixels)
    fields["normalisation"] = ((0.5, 0.5), (0.5, 0.5))
    with pytest.raises(ValueError, match=message):
        register_dataset("bad_set", **{**fields, **field})
    assert "bad_set" not in DATASETS


# ----------------------------------------------------------------------------- figures


def test_a_figure_declared_once_is_drawn_and_listed(tmp_path):
    import pandas as pd

    from fedlmc.simulations.report.figure_table import (
        FIGURE_TABLE,
        draw_figures,
        figure,
        figures_markdown,
    )

    drawn = []

    @figure("test_metric", lambda d: "test_metric" in d.rows, shows="test: a | b of the rows")
    def test_metric(d, path):
        drawn.append(list(d.rows["test_metric"]))
        path.write_text("png")
        return path

    try:
        assert FIGURE_TABLE.names()[-1] == "test_metric"
        assert figures_markdown().endswith("| `test_metric.png` | test: a \\| b of the rows |")
        rows = pd.DataFrame({"method": ["average"], "width": [1.0], "test_metric": [0.5]})
        assert draw_figures(rows, tmp_path, {}) == [tmp_path / "test_metric.png"]
        assert drawn == [[0.5]]
        assert draw_figures(rows.drop(columns="test_metric"), tmp_path, {}) == []
        assert not (tmp_path / "test_metric.png").exists()  # a stale figure is removed
    finally:
        FIGURE_TABLE.remove("test_metric")
    assert "test_metric" not in figures_markdown()


# ----------------------------------------------------------------------------- merge-method hooks

USER_MERGES = '''
from fedlmc.merging.methods import Alignment, register_method


def keep_first(job):
    """A plain merge function: every client replaced by client 0."""
    return Alignment([job.states[0] for _ in job.states])


def average(job):
    """Named like a built-in method: refused."""
    return Alignment(list(job.states))


@register_method("declared_halfway", description="test: clients moved halfway to client 0")
def halfway(job):
    first = job.states[0]
    return Alignment([{k: (v + first[k]) / 2 for k, v in sd.items()} for sd in job.states])
'''


@pytest.fixture
def user_merges(tmp_path, monkeypatch):
    """A module of merge methods on ``sys.path``, under a name unique to the test."""
    name = f"user_merges_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(USER_MERGES)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for method in ("keep_first", "declared_halfway"):
        if method in METHODS:
            METHODS.remove(method)


def test_a_method_named_by_import_path_runs_from_the_run_config(user_merges):
    from fedlmc.simulations.config import method_list, row_methods, selected_methods

    methods = f"average,{user_merges}:keep_first,{user_merges}:keep_first_t,"
    methods += f"{user_merges}:declared_halfway"
    config = validate_run_config({"methods": methods})
    assert config["methods"] == methods  # the cell's identity keeps the paths
    names = ["average", "keep_first", "keep_first_t", "declared_halfway"]
    assert method_list(config) == row_methods(config) == names
    assert "user merge function" in METHODS.get("keep_first").description
    assert METHODS.get("declared_halfway").description.startswith("test: clients moved halfway")
    template, states = tiny_states()
    rows = compare_methods(template, states, [1, 1], tiny_splits(), names, diagnostics=False).rows
    by_method = {row["method"]: row for row in rows}
    assert set(by_method) == set(names)
    first = compare_methods(template, states[:1], [1], tiny_splits(), ["average"],
                            diagnostics=False).rows[0]  # fmt: skip
    assert by_method["keep_first"]["accuracy"] == first["accuracy"]  # the merge is client 0
    assert validate_run_config({"methods": methods}) == config  # resolving again: same methods
    aligned = validate_run_config({"strategy": "aligned", "align": f"{user_merges}:keep_first"})
    assert row_methods(aligned) == ["keep_first", "keep_first_t"]
    assert selected_methods(aligned) == ["keep_first"]
    with pytest.raises(ConfigError, match="align = .*: module '.*' registers no method 'nothing'"):
        validate_run_config({"strategy": "aligned", "align": f"{user_merges}:nothing"})


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("no_such_module_x:f", "merge method 'no_such_module_x:f' cannot be imported: No module"),
        ("{m}:nothing", "registers no method 'nothing' and has no function 'nothing'; allowed"),
        ("{m}:Alignment", "registers no method 'Alignment' and has no function 'Alignment'"),
        ("dir/file.py:f", "allowed: 'package.module:function', importable where the run"),
        ("{m}:average", "'average' is already another method's name; allowed: a function of"),
    ],
)
def test_a_method_path_that_names_no_method_is_one_clear_error(user_merges, entry, message):
    with pytest.raises(ConfigError, match=f"methods = .*{re.escape(message)}"):
        validate_run_config({"methods": f"average,{entry.format(m=user_merges)}"})


@pytest.mark.slow
def test_fedlmc_validate_resolves_user_methods_and_notes_uncounted_models(tmp_path):
    """In a fresh process, as ``fedlmc validate`` runs: a user merge method and a user model
    factory validate without loading torch; the factory's memory check is noted as skipped;
    a path that names no method exits 2 with one line."""
    import os
    import subprocess
    import sys

    (tmp_path / "my_merges.py").write_text(USER_MERGES)
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(
        'name = "hooks"\n[run]\nmodel = "fedlmc.models:MLP"\nepochs = 1\n'
        'methods = "average,my_merges:keep_first,my_merges:declared_halfway_t"\n'
        "[grid]\nwidth = [1, 2]\n"
    )
    probe = (
        "import sys\nfrom fedlmc.simulations.cli import main\n"
        f"code = main(['validate', {str(sweep)!r}, '--out', {str(tmp_path / 'out')!r}])\n"
        "print('exit', code, 'torch' in sys.modules)\n"
        f"code = main(['validate', {str(sweep)!r}, 'run.methods=\"my_merges:nothing\"'])\n"
        "print('exit', code)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "hooks: 2 cell(s); grid axes: width", done.stderr
    assert lines[3] == (
        "note: memory check skipped: model 'fedlmc.models:MLP' declares no parameter count "
        "(register_model(..., parameters=...))"
    )
    assert lines[4] == "exit 0 False" and lines[5] == "exit 2"
    assert done.stderr.strip().splitlines() == [
        "fedlmc: error: run.methods = 'my_merges:nothing': merge method 'my_merges:nothing': "
        "module 'my_merges' registers no method 'nothing' and has no function 'nothing'; "
        "allowed: a function job -> Alignment, or a method the module registers with "
        "@register_method"
    ]
