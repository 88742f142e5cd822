"""Sweep configuration: every bad input is one ConfigError naming key and value; grid expansion
order and size; stable cell ids; the CLI turns config errors into exit 2 and one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedlmc.simulations.config import (
    ConfigError,
    canonical_cell_id,
    cell_id,
    expand_grid,
    grid_points,
    load_sweep_config,
    parse_override,
    run_schema,
    sweep_from_mapping,
    validate_run_config,
)

REPO = Path(__file__).resolve().parents[3]

GOOD = """
name = "good"
description = "a valid sweep"
[run]
epochs = 1
lambdas = 3
diagnostics = false
[grid]
width = [0.25, 0.5]
seed = [0, 1, 2]
[report]
dpi = 80
"""


def write(tmp_path: Path, text: str, name: str = "sweep.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def edited(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


# (case id, TOML text or None for GOOD, overrides, substrings the message must contain)
BAD_INPUTS = [
    ("unknown run key", edited("epochs = 1", "epoch = 1"), [], ["run.epoch", "'epochs'"]),
    (
        "unknown grid key",
        edited("seed = [0, 1, 2]", "seeds = [0, 1]"),
        [],
        ["grid.seeds", "'seed'"],
    ),
    ("unknown report key", edited("dpi = 80", "dpii = 80"), [], ["report.dpii", "'dpi'"]),
    ("unknown top-level key", GOOD + "\n[gird]\nwidth = [1]\n", [], ["'gird'", "'grid'"]),
    ("unknown override key", None, ["widht=2"], ["'widht'", "'width'"]),
    ("unknown override table", None, ["gridd.width=[1]"], ["'gridd'", "'grid'"]),
    ("override without =", None, ["width"], ["'width'", "key=value"]),
    ("override with empty key", None, ["=3"], ["'=3'", "key=value"]),
    (
        "wrong type str for float",
        edited("epochs = 1", 'epochs = 1\nwidth = "wide"'),
        [],
        ["run.width", "'wide'", "float"],
    ),
    (
        "wrong type float for int",
        edited("epochs = 1", "epochs = 1.5"),
        [],
        ["run.epochs", "1.5", "int"],
    ),
    ("wrong type bool for int", None, ["epochs=true"], ["run.epochs", "True", "int"]),
    ("wrong type in grid list", edited("[0.25, 0.5]", '[0.25, "x"]'), [], ["grid.width", "'x'"]),
    ("wrong type str for bool", None, ["diagnostics=yes"], ["run.diagnostics", "'yes'", "bool"]),
    ("width zero", None, ["width=0"], ["run.width", "0.0", "(0, 1024]"]),
    ("width negative in grid", None, ["grid.width=[1, -2]"], ["grid.width", "-2.0", "(0, 1024]"]),
    ("width infinite", None, ["width=inf"], ["run.width", "inf", "finite"]),
    ("alpha zero", None, ["alpha=0"], ["run.alpha", "0.0", "(0, 10000]"]),
    ("one client", None, ["num-clients=1"], ["run.num-clients", "1", "2 .. 100000"]),
    ("unknown model", None, ["model=vgg16"], ["run.model", "'vgg16'", "mlp"]),
    ("unknown dataset", None, ["dataset=svhn"], ["run.dataset", "'svhn'", "mnist5k"]),
    ("unknown norm", None, ["norm=gn"], ["run.norm", "'gn'", "ln"]),
    (
        "unknown method",
        None,
        ["methods=average,magic"],
        ["run.methods", "magic", "weight_matching"],
    ),
    ("unknown partition", None, ["partition=random"], ["run.partition", "'random'", "dirichlet"]),
    (
        "empty grid list",
        edited("seed = [0, 1, 2]", "seed = []"),
        [],
        ["grid.seed", "[]", "non-empty"],
    ),
    (
        "grid axis not a list",
        edited("seed = [0, 1, 2]", "seed = 3"),
        [],
        ["grid.seed", "3", "list"],
    ),
    ("repeated grid value", None, ["grid.seed=[0, 1, 0]"], ["grid.seed", "0", "repeated"]),
    (
        "key in run and grid",
        edited("epochs = 1", "epochs = 1\nwidth = 2"),
        [],
        ["grid.width", "[0.25, 0.5]", "[run]"],
    ),
    ("out-dir swept", None, ["grid.out-dir=['a', 'b']"], ["grid.out-dir", "not sweepable"]),
    (
        "pathological too many classes",
        None,
        ["partition=pathological", "classes-per-client=11"],
        ["classes-per-client", "11", "at most 10"],
    ),
    (
        "more clients than examples",
        None,
        ["num-clients=3601"],
        ["num-clients", "3601", "at most 3600"],
    ),
    (
        "shard too many shards",
        None,
        ["partition=shard", "num-clients=1000", "classes-per-client=4"],
        ["classes-per-client", "4", "at most 3"],
    ),
    (
        "min-clients above clients in a cell",
        None,
        ["min-clients=3", "grid.num-clients=[2, 4]"],
        ["grid cell", "num-clients=2", "min-clients", "3"],
    ),
    (
        "server calibration without server split",
        None,
        ["server-fraction=0"],
        ["server-fraction", "0.0", "calibration"],
    ),
    (
        "no server split without calibration (the calibrated columns need it)",
        None,
        ["server-fraction=0", "strategy=average", "calibration=none"],
        ["server-fraction", "0.0", "allowed", "(0, 1)"],
    ),
    (
        "no server split with federated calibration",
        None,
        ["server-fraction=0", "strategy=aligned", "calibration=federated"],
        ["server-fraction", "0.0", "allowed", "(0, 1)"],
    ),
    ("report dpi too low", None, ["report.dpi=10"], ["report.dpi", "10", "50 .. 1200"]),
    ("report error bars", None, ["report.error-bars=iqr"], ["report.error-bars", "'iqr'", "sem"]),
    ("missing name", GOOD.replace('name = "good"\n', ""), [], ["name", "missing"]),
    ("bad name", GOOD.replace('name = "good"', 'name = "a/b"'), [], ["name", "'a/b'"]),
    ("run not a table", 'name = "x"\nrun = 3\n', [], ["run", "3", "table"]),
    (
        "malformed toml",
        GOOD.replace("epochs = 1", "epochs = = 1"),
        [],
        ["malformed TOML", "line 5"],
    ),
    ("bad failure injection", None, ["inject-failure=crash:0"], ["inject-failure", "crash:0"]),
    # issue 39: input that escaped the checks
    ("name ..", GOOD.replace('name = "good"', 'name = ".."'), [], ["name = '..'", "dots alone"]),
    ("name .", None, ["name=."], ["name = '.'", "dots alone"]),
    ("name with a newline", None, ["name=a\nb"], ["name = 'a\\nb'"]),
    ("out-dir with a newline", None, ["run.out-dir='a\nb'"], ["out-dir", "control character"]),
    ("TOML nested 5000 deep", GOOD + "x = " + "[" * 5000 + "]" * 5000, [], ["nested too deep"]),
    ("override nested 5000 deep", None, ["seed=" + "[" * 5000 + "]" * 5000], ["nested too deep"]),
    (
        "a grid of a million cells",
        None,
        ["width=0.5", f"grid.seed={list(range(1000))}", f"grid.epochs={list(range(1, 1001))}"],
        ["grid of 1,000,000 cells", "1000 (seed) x 1000 (epochs)", "--max-cells 1000000"],
    ),
    ("methods os:system", None, ["methods=os:system"], ["'os:system'", "takes (command)"]),
    (
        "align os:system",
        None,
        ["strategy=aligned", "align=os:system"],
        ["align = 'os:system'", "takes (command)"],
    ),
    ("model os:system", None, ["model=os:system"], ["model = 'os:system'", "takes (command)"]),
    ("merge function of another signature", None, ["methods=json:dumps"], ["it takes (obj"]),
    (
        "model factory that needs more arguments",
        None,
        ["model=fedlmc.models:MLP"],
        ["'fedlmc.models:MLP'", "depth has no default"],
    ),
]

if not torch.cuda.is_available():
    BAD_INPUTS += [
        ("gpu requested without gpu", None, ["num-gpus=0.5"], ["num-gpus", "0.5", "no CUDA GPU"]),
        ("cuda device without gpu", None, ["device=cuda"], ["device", "'cuda'", "no CUDA GPU"]),
    ]


@pytest.mark.parametrize(
    ("text", "overrides", "needles"),
    [pytest.param(t, o, n, id=i) for i, t, o, n in BAD_INPUTS],
)
def test_bad_input_gives_one_line_config_error(tmp_path, text, overrides, needles):
    path = write(tmp_path, GOOD if text is None else text)
    with pytest.raises(ConfigError) as caught:
        load_sweep_config(path, overrides)
    message = str(caught.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def test_enough_bad_inputs_are_covered():
    assert len(BAD_INPUTS) >= 25


def test_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_sweep_config(tmp_path / "missing.toml")


def test_good_sweep_expands_in_order(tmp_path):
    sweep = load_sweep_config(write(tmp_path, GOOD))
    cells = expand_grid(sweep)
    assert len(cells) == 6
    # last axis fastest: (0.25, 0), (0.25, 1), (0.25, 2), (0.5, 0), ...
    assert [(c["width"], c["seed"]) for c in cells] == [
        (w, s) for w in (0.25, 0.5) for s in (0, 1, 2)
    ]
    assert all(c["epochs"] == 1 and c["lambdas"] == 3 for c in cells)
    assert set(cells[0]) == set(run_schema())  # defaults filled in
    assert sweep.report["dpi"] == 80 and sweep.report["error-bars"] == "std"
    assert grid_points(sweep)[4] == {"width": 0.5, "seed": 1}


def test_override_rules(tmp_path):
    path = write(tmp_path, GOOD)
    # a plain list makes (or replaces) an axis; a plain scalar fixes the value and drops the axis
    sweep = load_sweep_config(path, ["num-clients=[2, 3]", "seed=7", "width=[1, 2, 4]"])
    assert list(sweep.grid) == ["width", "num-clients"]
    assert sweep.grid["width"] == [1.0, 2.0, 4.0]
    assert sweep.run["seed"] == 7
    assert len(expand_grid(sweep)) == 6
    # grid.KEY with a scalar is a one-value axis; run.KEY drops the axis
    sweep = load_sweep_config(path, ["grid.epochs=2", "run.width=8", "name=other"])
    assert sweep.grid == {"seed": [0, 1, 2], "epochs": [2]}
    assert sweep.run["width"] == 8.0 and sweep.name == "other"
    # values are read as TOML, else kept as strings
    assert parse_override("methods=average,ensemble") == ("methods", "average,ensemble")
    assert parse_override("grid.alpha=[0.1, 1.0]") == ("grid.alpha", [0.1, 1.0])


def test_every_cell_is_validated_before_any_work(tmp_path):
    # only the num-clients=3601 cells are infeasible (more clients than training examples)
    path = write(tmp_path, GOOD)
    with pytest.raises(ConfigError, match="num-clients=3601"):
        load_sweep_config(path, ["grid.num-clients=[2, 3601]"])


def test_cell_id_is_stable_and_ignores_runtime_keys():
    base = validate_run_config({"width": 0.5, "seed": 1}, check_devices=False)
    same = dict(reversed(list(base.items())))
    assert cell_id(base) == cell_id(same) == cell_id({"width": 0.5, "seed": 1})
    assert cell_id({"width": 1, "seed": 1}) == cell_id({"width": 1.0, "seed": 1})
    runtime = {**base, "out-dir": "/elsewhere", "num-cpus": 2.0, "timeout": 5.0}
    assert cell_id(runtime) == cell_id(base)
    assert cell_id({**base, "seed": 2}) != cell_id(base)
    assert cell_id({**base, "epochs": 11}) != cell_id(base)
    assert len(cell_id(base)) == 12 and int(cell_id(base), 16) >= 0


@pytest.mark.slow
def test_cell_id_is_the_same_in_another_process():
    code = (
        "from fedlmc.simulations.config import cell_id; print(cell_id({'width': 0.5, 'seed': 1}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == cell_id({"width": 0.5, "seed": 1})


def test_sweep_from_mapping_matches_file(tmp_path):
    import tomllib

    from_file = load_sweep_config(write(tmp_path, GOOD))
    from_data = sweep_from_mapping(tomllib.loads(GOOD))
    assert [cell_id(c) for c in expand_grid(from_file)] == [
        cell_id(c) for c in expand_grid(from_data)
    ]


def test_shipped_configs_validate():
    configs = sorted((REPO / "configs").glob("*.toml"))
    assert {p.stem for p in configs} >= {
        "quick",
        "mnist_mlp",
        "fashion_mnist_mlp",
        "cifar10_vgg11",
        "cifar10_resnet20",
        "clients",
        "heterogeneity",
        "weight_decay",
    }
    for path in configs:  # paper-scale widths need more memory than this machine has
        sweep = load_sweep_config(path, check_devices=False)
        cells = expand_grid(sweep)
        assert len(cells) >= 2, path.name
        for cell in cells:  # a sweep names its cells without validating them again
            assert canonical_cell_id(cell) == cell_id(cell), (path.name, cell)


def test_checks_that_can_only_fail_at_run_time_fail_at_validation():
    from fedlmc.simulations.config import MAX_LAMBDAS, machine_memory

    with pytest.raises(ConfigError, match=r"width = 1000: .* about [\d,]+ bytes"):
        validate_run_config({"width": 1000.0})
    validate_run_config({"width": 1000.0}, check_devices=False)  # not a machine check then
    assert machine_memory() > 2**30
    for lambdas in (2, 24, MAX_LAMBDAS + 2, 100000):
        with pytest.raises(ConfigError, match=f"lambdas = {lambdas}: allowed: an integer 3 "):
            validate_run_config({"lambdas": lambdas})
    validate_run_config({"lambdas": 3})
    with pytest.raises(ConfigError, match=r"fedavg-rounds = 6: allowed: 1 .. epochs \(5\)"):
        validate_run_config({"strategy": "fedavg", "fedavg-rounds": 6, "epochs": 5})
    with pytest.raises(ConfigError, match="fedavg-rounds = 6"):
        validate_run_config({"methods": "average,fedavg", "fedavg-rounds": 6, "epochs": 5})
    validate_run_config({"strategy": "average", "fedavg-rounds": 6, "epochs": 5})  # no FedAvg
    from fedlmc.simulations.task import client_run_config

    # one FedAvg round's client config carries that round's epochs: not a whole-run check there
    client_run_config({}, {"strategy": "fedavg", "fedavg-rounds": 6, "epochs": 1})


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "fedlmc.simulations.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**env, "PYTHONPATH": str(REPO)},
        timeout=120,
    )


@pytest.mark.parametrize(
    ("command", "text", "overrides", "needle"),
    [
        ("sweep", GOOD, ["widht=2"], "did you mean 'width'"),
        ("validate", GOOD.replace("epochs = 1", "epochs = = 1"), [], "malformed TOML"),
        ("sweep", GOOD, ["partition=pathological", "classes-per-client=12"], "= 12"),
    ],
)
@pytest.mark.slow
def test_cli_config_error_exits_2_with_one_line(tmp_path, command, text, overrides, needle):
    path = write(tmp_path, text)
    argv = [command, str(path), *overrides]
    if command == "sweep":
        argv += ["--out", str(tmp_path / "out")]
    done = run_cli(*argv, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("fedlmc: error: ") and needle in lines[0]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()  # nothing started


def test_keys_a_cell_ignores_do_not_make_new_cells():
    """A compare sweep over align/calibration, or depth of a conv net, is one experiment."""
    from fedlmc.simulations.config import sweep_from_mapping

    compare = sweep_from_mapping(
        {
            "name": "s",
            "grid": {
                "align": ["weight_matching", "merge_many"],
                "calibration": ["server", "federated"],
            },
        }
    )
    assert len(expand_grid(compare)) == 1
    aligned = sweep_from_mapping(
        {
            "name": "s",
            "run": {"strategy": "aligned"},
            "grid": {"align": ["weight_matching", "merge_many"]},
        }
    )
    assert [c["align"] for c in expand_grid(aligned)] == ["weight_matching", "merge_many"]
    vgg = sweep_from_mapping(
        {"name": "s", "run": {"model": "vgg11", "dataset": "mnist5k"}, "grid": {"depth": [2, 3]}}
    )
    assert len(expand_grid(vgg)) == 1
    assert cell_id({"strategy": "average", "lambdas": 5}) == cell_id({"strategy": "average"})
    assert cell_id({"strategy": "compare", "lambdas": 5}) != cell_id({"strategy": "compare"})


def test_align_takes_registered_aligning_methods_only():
    unknown = "align = 'weight': unknown aligning method 'weight'.*allowed: weight_matching, "
    with pytest.raises(ConfigError, match=unknown):
        validate_run_config({"align": "weight"})
    with pytest.raises(ConfigError, match="align = 'average'"):
        validate_run_config({"align": "average"})
    with pytest.raises(ConfigError, match="unknown key 'multi'"):
        validate_run_config({"multi": "merge_many"})


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"download": True, "data-root": "d"},
            "download = true: dataset 'mnist5k' is not fetched; allowed with mnist",
        ),
        ({"download": True, "dataset": "mnist"}, "download = true: allowed only with a data-root"),
        ({"image-key": "img"}, "image-key = 'img': allowed only with an hf:NAME dataset"),
        ({"dataset": "hf:"}, "dataset = 'hf:': allowed: mnist5k"),
        (
            {"model": "no such model"},
            "model = 'no such model': allowed: mlp, vgg11, resnet20, vit, or a",
        ),
        ({"model": "vit", "norm": "bn"}, "norm = 'bn': allowed for model 'vit': ln, none"),
        (
            {"model": "vit", "dataset": "cifar10", "data-root": "d"},
            "model = 'vit' on dataset 'cifar10': patch = 7 does not divide the 32x32 image",
        ),
    ],
)
def test_data_and_model_keys_are_checked(values, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_run_config(values)
    assert (
        validate_run_config({"dataset": "hf:some/data", "image-key": "img"})["image-key"] == "img"
    )
    unchecked = validate_run_config({"model": "pkg.nets:make_net"}, check_devices=False)
    assert unchecked["model"] == "pkg.nets:make_net"  # for another machine: not imported here
    with pytest.raises(ConfigError, match="model factory 'pkg.nets:make_net' cannot be imported"):
        validate_run_config({"model": "pkg.nets:make_net"})
