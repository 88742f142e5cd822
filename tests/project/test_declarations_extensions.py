"""One declaration per extension beyond columns and keys: a model's parameter count, a data
set, a figure and a merge method named by import path each reach every list that reads them
(docs/development.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedlmc.merging.method_registry import METHODS
from fedlmc.simulations import config as run_config
from fedlmc.simulations.cli import main
from fedlmc.simulations.config import (
    ConfigError,
    validate_run_config,
)
from fedlmc.simulations.config.tables import (
    keys_table,
)
from fedlmc.study.compare import compare_methods

try:  # rootdir on sys.path, or tests/ itself (pytest's default import mode)
    from tests.fedlmc.test_registry import tiny_splits, tiny_states
except ImportError:
    from tests.fedlmc.test_registry import tiny_splits, tiny_states

ROOT = Path(__file__).resolve().parents[2]


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
from fedlmc.merging.merge_job import Alignment
from fedlmc.merging.method_registry import register_method


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


def test_the_first_look_at_a_method_named_by_import_path_selects_it(user_merges):
    """selected_methods of a plain mapping (not validated: nothing imported the module yet)
    resolves the entry before it filters the merges: the user's method is selected the first
    time too (it was dropped then, and selected from the second call on)."""
    from fedlmc.simulations.config import selected_methods

    plain = {"strategy": "compare", "methods": f"average,{user_merges}:keep_first,ensemble"}
    assert "keep_first" not in METHODS
    assert selected_methods(plain) == ["average", "keep_first"]  # ensemble: no merge
    assert selected_methods(plain) == ["average", "keep_first"]


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
    (tmp_path / "my_nets.py").write_text(  # torch is imported when a model is built, not before
        "def make(width, num_classes, in_shape, norm):\n    from torch import nn\n\n"
        "    return nn.Linear(in_shape[0] * in_shape[1] * in_shape[2], num_classes)\n"
    )
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(
        'name = "hooks"\n[run]\nmodel = "my_nets:make"\nepochs = 1\n'
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
    assert lines[0] == "hooks: 2 cell(s), 4 client-epochs of training; grid axes: width", (
        done.stderr
    )
    assert lines[3] == (
        "note: memory check skipped: model 'my_nets:make' declares no parameter count "
        "(register_model(..., parameters=...))"
    )
    assert lines[4] == "exit 0 False" and lines[5] == "exit 2"
    assert done.stderr.strip().splitlines() == [
        "fedlmc: error: run.methods = 'my_merges:nothing': merge method 'my_merges:nothing': "
        "module 'my_merges' registers no method 'nothing' and has no function 'nothing'; "
        "allowed: a function job -> Alignment, or a method the module registers with "
        "@register_method"
    ]
