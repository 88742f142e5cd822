"""The one place where experiment configuration is defined and validated.

A *run config* is a flat mapping of hyphenated keys (the same keys as Flower's ``--run-config``
and ``[tool.flwr.app.config]``) to scalars. :data:`RUN_SCHEMA` lists every key with its type,
default and allowed values; :func:`validate_run_config` fills in defaults and rejects anything
else with a :class:`ConfigError` whose one-line message names the key, the value and what is
allowed. Nothing here imports Flower.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

from fedlmc.data import DATASETS, NUM_CLASSES, PARTITION_SCHEMES
from fedlmc.models import MODELS
from fedlmc.study import METHODS as MERGE_METHODS

METHODS = (*MERGE_METHODS, "fedavg")
"""Every method a cell can report: the one-shot merges of :mod:`fedlmc.study` and the FedAvg run."""
STRATEGIES = ("compare", "average", "aligned", "fedavg")
CALIBRATIONS = ("server", "federated", "none")
FAILURE_MODES = ("raise", "nan", "hang")


class ConfigError(ValueError):
    """An invalid configuration value; the one-line message names key, value and what is allowed."""


@dataclass(frozen=True)
class Key:
    """One run-config key: its type, default, and a check returning an error text or ``None``."""

    type: type
    default: Any
    doc: str
    check: Callable[[Any], str | None] | None = None


def _choice(*allowed: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in allowed else f"allowed: {', '.join(allowed)}"

    return check


def _at_least(low: float, *, strict: bool = False) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = value > low if strict else value >= low
        return None if ok else f"allowed: a number {'>' if strict else '>='} {low}"

    return check


def _fraction(value: Any) -> str | None:
    return None if 0.0 <= value < 1.0 else "allowed: a number in [0, 1)"


def _methods(value: Any) -> str | None:
    names = [m.strip() for m in value.split(",") if m.strip()]
    bad = [m for m in names if m not in METHODS]
    if not names or bad:
        return f"allowed: a comma-separated list of {', '.join(METHODS)}"
    return None


def _failures(value: Any) -> str | None:
    if value == "none":
        return None
    for item in value.split(","):
        mode, _, pid = item.strip().partition(":")
        if mode not in FAILURE_MODES or not pid.isdigit():
            return (
                f"allowed: none, or MODE:PARTITION-ID[,...] with MODE in {', '.join(FAILURE_MODES)}"
            )
    return None


RUN_SCHEMA: dict[str, Key] = {
    "dataset": Key(str, "mnist5k", "data set name", _choice(*DATASETS)),
    "data-root": Key(str, "", "folder holding torchvision data (for mnist, cifar10, ...)"),
    "server-fraction": Key(float, 0.1, "share of the training data kept by the server", _fraction),
    "model": Key(str, "mlp", "architecture", _choice(*MODELS)),
    "width": Key(float, 1.0, "width multiplier", _at_least(0.0, strict=True)),
    "depth": Key(int, 3, "hidden layers of the MLP", _at_least(1)),
    "base-hidden": Key(int, 128, "hidden units of the MLP at width 1", _at_least(1)),
    "norm": Key(str, "auto", "normalisation layers", _choice("auto", "bn", "ln", "none")),
    "num-clients": Key(int, 2, "number of clients", _at_least(2)),
    "partition": Key(str, "iid", "partition scheme", _choice(*PARTITION_SCHEMES)),
    "alpha": Key(float, 0.5, "Dirichlet concentration", _at_least(0.0, strict=True)),
    "classes-per-client": Key(int, 2, "classes per client (pathological)", _at_least(1)),
    "epochs": Key(int, 10, "local epochs per client", _at_least(1)),
    "lr": Key(float, 0.05, "peak learning rate", _at_least(0.0, strict=True)),
    "weight-decay": Key(float, 3e-3, "weight decay", _at_least(0.0)),
    "batch-size": Key(int, 128, "batch size", _at_least(1)),
    "optimizer": Key(str, "sgd", "optimizer", _choice("sgd", "adam", "adamw")),
    "momentum": Key(float, 0.9, "SGD momentum", _fraction),
    "schedule": Key(
        str, "onecycle", "learning-rate schedule", _choice("onecycle", "cosine", "constant")
    ),
    "strategy": Key(str, "compare", "server strategy", _choice(*STRATEGIES)),
    "methods": Key(
        str,
        "average,average_t,weight_matching,weight_matching_t,ensemble",
        "merge methods evaluated by the compare strategy",
        _methods,
    ),
    "align": Key(
        str, "weight", "alignment of the aligned strategy", _choice("weight", "activation")
    ),
    "multi": Key(str, "reference", "N-model alignment", _choice("reference", "merge_many")),
    "calibration": Key(str, "server", "temperature calibration", _choice(*CALIBRATIONS)),
    "init": Key(str, "independent", "client initialisation", _choice("independent", "shared")),
    "fedavg-rounds": Key(int, 5, "rounds of the FedAvg baseline", _at_least(1)),
    "lambdas": Key(int, 25, "points on the interpolation grid", _at_least(2)),
    "diagnostics": Key(bool, True, "compute LEWC and orthogonality diagnostics"),
    "seed": Key(int, 0, "seed", _at_least(0)),
    "device": Key(str, "auto", "training device", _choice("auto", "cpu", "cuda")),
    "num-cpus": Key(float, 1.0, "CPUs per simulated client", _at_least(0.0, strict=True)),
    "num-gpus": Key(float, 0.0, "GPUs per simulated client", _at_least(0.0)),
    "min-clients": Key(int, 2, "fewest surviving clients a merge accepts", _at_least(1)),
    "timeout": Key(float, 600.0, "seconds to wait for clients", _at_least(0.0, strict=True)),
    "inject-failure": Key(str, "none", "test-only failure injection", _failures),
    "out-dir": Key(str, "", "folder for results.csv and merged weights"),
}


def did_you_mean(name: str, choices: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def coerce(key: str, value: Any, expected: type) -> Any:
    """``value`` as ``expected``: ints are accepted for floats; bools never count as numbers."""
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, expected) and not (expected is not bool and isinstance(value, bool)):
        return value
    raise ConfigError(f"{key} = {value!r}: expected {expected.__name__}")


def check_value(
    key: str, value: Any, schema: Mapping[str, Key] = RUN_SCHEMA, where: str = ""
) -> Any:
    """``value`` coerced to the type of ``schema[key]`` and range-checked (``where`` prefixes the
    key in messages, e.g. ``"grid."``); floats must be finite."""
    spec = schema[key]
    value = coerce(f"{where}{key}", value, spec.type)
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}{key} = {value!r}: allowed: a finite number")
    problem = spec.check(value) if spec.check else None
    if problem:
        raise ConfigError(f"{where}{key} = {value!r}: {problem}")
    return value


def validate_run_config(values: Mapping[str, Any], *, check_devices: bool = True) -> dict[str, Any]:
    """Defaults filled in, every value type- and range-checked; raises :class:`ConfigError`."""
    unknown = [k for k in values if k not in RUN_SCHEMA]
    if unknown:
        key = unknown[0]
        raise ConfigError(f"unknown key {key!r}{did_you_mean(key, list(RUN_SCHEMA))}")
    config = {k: spec.default for k, spec in RUN_SCHEMA.items()}
    for key, value in values.items():
        config[key] = check_value(key, value)
    check_consistency(config, check_devices=check_devices)
    return config


def check_consistency(config: Mapping[str, Any], *, check_devices: bool = True) -> None:
    """Checks that involve several keys or the machine."""
    if config["min-clients"] > config["num-clients"]:
        raise ConfigError(
            f"min-clients = {config['min-clients']}: allowed: at most num-clients "
            f"({config['num-clients']})"
        )
    if config["calibration"] == "server" and config["server-fraction"] == 0.0:
        raise ConfigError("server-fraction = 0.0: calibration = 'server' needs a server split > 0")
    check_partition(config)
    if check_devices and (config["num-gpus"] > 0 or config["device"] == "cuda"):
        import torch

        if not torch.cuda.is_available():
            key = "num-gpus" if config["num-gpus"] > 0 else "device"
            raise ConfigError(f"{key} = {config[key]!r}: no CUDA GPU is visible on this machine")


def method_list(config: Mapping[str, Any]) -> list[str]:
    """The ``methods`` key as a list, in the given order, without duplicates."""
    return list(dict.fromkeys(m.strip() for m in config["methods"].split(",") if m.strip()))


def parse_override(text: str) -> tuple[str, Any]:
    """``"key=value"`` -> ``(key, value)``; the value is read as TOML, else kept as a string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {text!r}: expected key=value")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


# ----------------------------------------------------------------------------- feasibility

# Training-set sizes before the server split (mnist5k: the embedded digits; the others: the
# standard torchvision training sets).
TRAIN_SIZES = {
    "mnist5k": 4000,
    "mnist": 60000,
    "fashion_mnist": 60000,
    "cifar10": 50000,
    "cifar100": 50000,
}


def client_pool_size(config: Mapping[str, Any]) -> int:
    """Examples left to the clients: the training set minus ``round(server-fraction * N)``."""
    total = TRAIN_SIZES[config["dataset"]]
    return total - int(round(config["server-fraction"] * total))


def check_partition(config: Mapping[str, Any]) -> None:
    """Rejects partitions that cannot give every client at least one example."""
    clients, scheme = config["num-clients"], config["partition"]
    pool = client_pool_size(config)
    if clients > pool:
        raise ConfigError(
            f"num-clients = {clients}: allowed: at most {pool} (the training examples of "
            f"{config['dataset']} left after the server split)"
        )
    per_client = config["classes-per-client"]
    classes = NUM_CLASSES[config["dataset"]]
    if scheme == "pathological" and per_client > classes:
        raise ConfigError(
            f"classes-per-client = {per_client}: allowed: at most {classes} (the classes of "
            f"{config['dataset']}) for partition = 'pathological'"
        )
    if scheme == "shard" and per_client > pool // clients:
        raise ConfigError(
            f"classes-per-client = {per_client}: allowed: at most {pool // clients} shards per "
            f"client for partition = 'shard' with {clients} clients and {pool} examples"
        )


# ----------------------------------------------------------------------------- sweeps
#
# A sweep file is TOML with four parts:
#
#   name = "quick"               # required; [A-Za-z0-9._-]+, names the default out dir
#   description = "..."          # optional
#   [run]                        # base values for any RUN_SCHEMA key (defaults fill the rest)
#   [grid]                       # axis = [values, ...] for any RUN_SCHEMA key but out-dir
#   [report]                     # optional REPORT_SCHEMA settings
#
# A key may be in [run] or in [grid], not both. The cells are the Cartesian product of the grid
# axes in the order they are written, the last axis varying fastest; every cell (base values +
# one value per axis, defaults filled in) is validated before any work starts. Keys that cannot
# affect a cell are reset to their defaults (alpha unless partition = "dirichlet", ...; see
# canonical_run_config), and cells that then coincide are run once (so partition = ["iid",
# "dirichlet"] x alpha = [0.1, 1.0] is 3 cells).
#
# Overrides ``key=value`` (value read as TOML, else as a string) are applied in order:
#   name=..., description=...   set those strings;
#   grid.KEY=[v1, v2]           make KEY a grid axis (a scalar is a one-value axis), drop run.KEY;
#   run.KEY=v                   set the base value, drop the KEY axis;
#   KEY=[v1, v2]                same as grid.KEY=[v1, v2];
#   KEY=v                       same as run.KEY=v (so a plain value replaces an axis);
#   report.KEY=v                set a report setting.

SWEEP_KEYS = ("name", "description", "run", "grid", "report")
SWEEP_TABLES = ("run", "grid", "report")
RUNTIME_KEYS = ("out-dir", "data-root", "timeout", "num-cpus", "num-gpus", "device")
NOT_SWEEPABLE = ("out-dir",)
NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]+")

REPORT_SCHEMA: dict[str, Key] = {
    "title": Key(str, "", "report title (empty: the sweep name)"),
    "dpi": Key(int, 120, "figure resolution", _at_least(50)),
    "error-bars": Key(str, "std", "spread drawn over seeds", _choice("std", "sem", "none")),
}


@dataclass(frozen=True)
class SweepConfig:
    """A validated sweep: base run values, grid axes (in order), report settings."""

    name: str
    run: dict[str, Any]
    grid: dict[str, list[Any]]
    report: dict[str, Any]
    description: str = ""
    source: str = ""
    check_devices: bool = True

    def to_dict(self) -> dict[str, Any]:
        """The sweep as plain data (the shape of the TOML file)."""
        return {
            "name": self.name,
            "description": self.description,
            "run": dict(self.run),
            "grid": {k: list(v) for k, v in self.grid.items()},
            "report": dict(self.report),
        }


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    """The TOML file at ``path``; unreadable or malformed files raise :class:`ConfigError`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise ConfigError(f"config file {str(path)!r}: cannot read it ({reason})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {str(path)!r}: malformed TOML: {err}") from None


def load_sweep_config(
    path: str | os.PathLike,
    overrides: Sequence[str] = (),
    *,
    check_devices: bool = True,
) -> SweepConfig:
    """Read, override (rules above) and validate the sweep at ``path``, every cell included."""
    data = read_toml(path)
    return sweep_from_mapping(data, overrides, source=str(path), check_devices=check_devices)


load_config = load_sweep_config


def sweep_from_mapping(
    data: Mapping[str, Any],
    overrides: Sequence[str] = (),
    *,
    source: str = "",
    check_devices: bool = True,
) -> SweepConfig:
    """A :class:`SweepConfig` from TOML-shaped data plus overrides; raises :class:`ConfigError`."""
    raw = _copy_tables(data)
    for text in overrides:
        apply_override(raw, text)
    sweep = SweepConfig(
        name=_check_name(raw.get("name")),
        description=_check_string("description", raw.get("description", "")),
        run=_check_run_table(raw["run"]),
        grid=_check_grid_table(raw["grid"], raw["run"]),
        report=_check_report_table(raw["report"]),
        source=source,
        check_devices=check_devices,
    )
    expand_grid(sweep)
    return sweep


def _copy_tables(data: Mapping[str, Any]) -> dict[str, Any]:
    unknown = [k for k in data if k not in SWEEP_KEYS]
    if unknown:
        key = unknown[0]
        raise ConfigError(
            f"unknown top-level key {key!r}{did_you_mean(key, SWEEP_KEYS)}; "
            f"allowed: {', '.join(SWEEP_KEYS)}"
        )
    raw: dict[str, Any] = dict(data)
    for table in SWEEP_TABLES:
        value = raw.get(table, {})
        if not isinstance(value, Mapping):
            raise ConfigError(f"{table} = {value!r}: expected a table [{table}]")
        raw[table] = dict(value)
    return raw


def apply_override(raw: dict[str, Any], text: str) -> None:
    """Apply one ``key=value`` override to TOML-shaped ``raw`` in place (rules above)."""
    key, value = parse_override(text)
    table, dot, name = key.partition(".")
    if not dot:
        table, name = ("grid" if isinstance(value, list) else "run"), key
        if key in ("name", "description"):
            raw[key] = value
            return
    if table not in SWEEP_TABLES or not name:
        raise ConfigError(
            f"override {text!r}: unknown table {table!r}{did_you_mean(table, SWEEP_TABLES)}; "
            f"allowed: KEY=..., run.KEY=..., grid.KEY=..., report.KEY=..."
        )
    schema = REPORT_SCHEMA if table == "report" else RUN_SCHEMA
    if name not in schema:
        raise ConfigError(
            f"override {text!r}: unknown key {name!r}{did_you_mean(name, list(schema))}"
        )
    if table == "grid":
        raw["grid"][name] = value if isinstance(value, list) else [value]
        raw["run"].pop(name, None)
    elif table == "run":
        raw["run"][name] = value
        raw["grid"].pop(name, None)
    else:
        raw["report"][name] = value


def _check_name(name: Any) -> str:
    if name is None:
        raise ConfigError("name is missing: allowed: a string of letters, digits, '.', '_', '-'")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            f"name = {name!r}: allowed: a non-empty string of letters, digits, '.', '_', '-'"
        )
    return name


def _check_string(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key} = {value!r}: expected str")
    return value


def _check_known(table: str, keys: Sequence[str], schema: Mapping[str, Key]) -> None:
    for key in keys:
        if key not in schema:
            raise ConfigError(
                f"unknown key {table}.{key}{did_you_mean(key, list(schema))}; "
                f"see the keys of [{table}] in the documentation"
            )


def _check_run_table(run: Mapping[str, Any]) -> dict[str, Any]:
    _check_known("run", list(run), RUN_SCHEMA)
    return {key: check_value(key, value, where="run.") for key, value in run.items()}


def _check_grid_table(grid: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, list[Any]]:
    _check_known("grid", list(grid), RUN_SCHEMA)
    axes: dict[str, list[Any]] = {}
    for key, values in grid.items():
        type_name = RUN_SCHEMA[key].type.__name__
        if key in NOT_SWEEPABLE:
            raise ConfigError(f"grid.{key}: not sweepable; set it in [run] or with --out")
        if key in run:
            raise ConfigError(
                f"grid.{key} = {values!r}: {key} is also set in [run]; allowed: one of the two"
            )
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid.{key} = {values!r}: expected a non-empty list of {type_name}")
        checked = [check_value(key, v, where="grid.") for v in values]
        repeated = [v for i, v in enumerate(checked) if v in checked[:i]]
        if repeated:
            raise ConfigError(
                f"grid.{key} = {values!r}: {repeated[0]!r} is repeated; allowed: distinct values"
            )
        axes[key] = checked
    return axes


def _check_report_table(report: Mapping[str, Any]) -> dict[str, Any]:
    _check_known("report", list(report), REPORT_SCHEMA)
    settings = {k: spec.default for k, spec in REPORT_SCHEMA.items()}
    for key, value in report.items():
        settings[key] = check_value(key, value, REPORT_SCHEMA, where="report.")
    return settings


def grid_points(sweep: SweepConfig) -> list[dict[str, Any]]:
    """One ``{axis: value}`` per distinct cell, in the order of :func:`expand_grid`."""
    return [point for point, _cell in unique_cells(sweep)]


def product_points(sweep: SweepConfig) -> list[dict[str, Any]]:
    """The product of the axes, the last varying fastest (before duplicates are dropped)."""
    axes = list(sweep.grid)
    return [dict(zip(axes, values, strict=True)) for values in product(*sweep.grid.values())]


def expand_grid(sweep: SweepConfig) -> list[dict[str, Any]]:
    """Every cell's validated, canonical run config, in :func:`grid_points` order.

    Cells that coincide once keys without effect are reset (:func:`canonical_run_config`, e.g.
    ``alpha`` of an ``iid`` cell) are kept once, at their first position.
    """
    return [cell for _point, cell in unique_cells(sweep)]


def unique_cells(sweep: SweepConfig) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(grid point, canonical run config)`` of every distinct cell, in grid order."""
    cells: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for point in product_points(sweep):
        try:
            config = validate_run_config({**sweep.run, **point}, check_devices=sweep.check_devices)
        except ConfigError as err:
            where = ", ".join(f"{k}={v}" for k, v in point.items())
            raise ConfigError(f"grid cell {where}: {err}" if where else str(err)) from None
        config = canonical_run_config(config)
        cells.setdefault(cell_id(config), (point, config))
    return list(cells.values())


def canonical_run_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with keys that cannot affect the run reset to their defaults: ``alpha`` unless
    ``partition = "dirichlet"``, ``classes-per-client`` unless ``pathological``/``shard``,
    ``fedavg-rounds`` unless the FedAvg baseline runs."""
    canonical = dict(config)
    if canonical["partition"] != "dirichlet":
        canonical["alpha"] = RUN_SCHEMA["alpha"].default
    if canonical["partition"] not in ("pathological", "shard"):
        canonical["classes-per-client"] = RUN_SCHEMA["classes-per-client"].default
    if canonical["strategy"] != "fedavg" and "fedavg" not in method_list(canonical):
        canonical["fedavg-rounds"] = RUN_SCHEMA["fedavg-rounds"].default
    return canonical


def experiment_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys that define the experiment: the run config minus :data:`RUNTIME_KEYS`."""
    return {k: config[k] for k in sorted(config) if k not in RUNTIME_KEYS}


def cell_id(config: Mapping[str, Any]) -> str:
    """12 hex digits of SHA-256 over the resolved run config minus :data:`RUNTIME_KEYS`.

    Stable across processes and key order; any default filled in by
    :func:`validate_run_config` is part of the hash, runtime-only keys and keys without effect
    (:func:`canonical_run_config`) are not.
    """
    resolved = canonical_run_config(validate_run_config(config, check_devices=False))
    text = json.dumps(experiment_values(resolved), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
