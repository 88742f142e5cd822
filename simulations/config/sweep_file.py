"""Sweep files: the TOML with ``[run]``, ``[grid]`` and ``[report]``, ``key=value`` overrides and
the expansion of the grid into validated cells."""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

from fedlmc.simulations.config.cell_identity import canonical_cell_id, canonical_run_config
from fedlmc.simulations.config.config_file import read_config_text
from fedlmc.simulations.config.derived import row_methods
from fedlmc.simulations.config.keys import run_schema
from fedlmc.simulations.config.report_keys import REPORT_SCHEMA
from fedlmc.simulations.config.schema import (
    ConfigError,
    Key,
    check_value,
    collected,
    did_you_mean,
    out_of_range,
    shown,
)
from fedlmc.simulations.config.validate import validate_run_config
from fedlmc.simulations.config.values import FEDAVG, Mode


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
    except ValueError:  # an integer of more digits than Python converts (4300)
        raise ConfigError(out_of_range(key, raw, run_schema().get(key))) from None
    except RecursionError:
        raise ConfigError(f"override {key}=...: {TOO_DEEP}") from None
    return key, value


# ----------------------------------------------------------------------------- sweeps
#
# A sweep file is TOML with four parts:
#
#   name = "quick"               # required; [A-Za-z0-9._-]+, names the default out dir
#   description = "..."          # optional
#   [run]                        # base values for any run_schema() key (defaults fill the rest)
#   [grid]                       # axis = [values, ...] for any run_schema() key but out-dir
#   [report]                     # optional REPORT_SCHEMA settings
#
# A linked axis moves several keys together: its name joins them with "+" and each of its
# values is a list of one value per key, e.g. "num-clients+client-widths" = [[2, "0.5,4"],
# [4, "0.5,1,2,4"]] (width mixes of different client counts, which a product would pair wrongly).
#
# A key may be in [run] or in [grid] (on one axis), not both. The cells are the Cartesian
# product of the grid axes in the order they are written, the last axis varying fastest; every
# cell (base values + one value per axis, defaults filled in) is validated before any work
# starts. Keys that cannot affect a cell are reset to their defaults (alpha unless partition =
# "dirichlet", ...; see canonical_run_config), and cells that then coincide are run once (so
# partition = ["iid", "dirichlet"] x alpha = [0.1, 1.0] is 3 cells).
#
# Overrides ``key=value`` (value read as TOML, else as a string) are applied in order:
#   name=..., description=...   set those strings;
#   grid.KEY=[v1, v2]           make KEY a grid axis (a scalar is a one-value axis), drop run.KEY;
#   run.KEY=v                   set the base value, drop the KEY axis;
#   KEY=[v1, v2]                same as grid.KEY=[v1, v2];
#   KEY=v                       same as run.KEY=v (so a plain value replaces an axis);
#   report.KEY=v                set a report setting.

LINK = "+"
"""Joins the keys of a linked grid axis (``"num-clients+client-widths"``)."""
SWEEP_KEYS = ("name", "description", "run", "grid", "report")
SWEEP_TABLES = ("run", "grid", "report")
NOT_SWEEPABLE = ("out-dir",)
NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]+")
MAX_CELLS = 1000  # grid points a sweep may have unless asked for more (max_cells, --max-cells)
MAX_NAME = 100  # characters of a sweep name: it names the default out dir, results/<name>
TOO_DEEP = (
    "arrays or tables nested too deep for the TOML reader (Python's recursion limit); allowed: "
    "values nested a few levels at most (a linked grid axis is a list of lists)"
)
HUGE_INTEGER = re.compile(r"[+-]?\d[\d_]{999,}")
TOML_KEY = re.compile(r"\s*([A-Za-z0-9_.\"-]+)\s*=")


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
    """The TOML file at ``path``; unreadable or malformed files, and anything but a regular
    file of at most 1 MiB (:func:`~fedlmc.simulations.config.config_file.read_config_text`),
    raise :class:`ConfigError`."""
    text = read_config_text(path)  # a regular file of at most 1 MiB, read bounded
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {str(path)!r}: malformed TOML: {err}") from None
    except RecursionError:
        raise ConfigError(f"config file {str(path)!r}: {TOO_DEEP}") from None
    except ValueError:  # an integer of more digits than Python converts (4300)
        key, raw = huge_integer(text)
        message = out_of_range(key, raw, run_schema().get(key.rpartition(".")[2]))
        raise ConfigError(f"config file {str(path)!r}: {message}") from None


def huge_integer(text: str) -> tuple[str, str]:
    """``(key, digits)`` of the first integer of TOML ``text`` too long for Python to read
    (``("a key", "an integer")`` when none is found)."""
    found = HUGE_INTEGER.search(text)
    if found is None:
        return "a key", "an integer"
    line = text[text.rfind("\n", 0, found.start()) + 1 : found.start()]
    key = TOML_KEY.match(line)
    return (key.group(1) if key else "a key"), found.group()


def load_sweep_config(
    path: str | os.PathLike,
    overrides: Sequence[str] = (),
    *,
    check_devices: bool = True,
    max_cells: int = MAX_CELLS,
) -> SweepConfig:
    """Read, override (rules above) and validate the sweep at ``path``, every cell included
    (a grid of more than ``max_cells`` points is refused first: :func:`check_grid_size`)."""
    data = read_toml(path)
    return sweep_from_mapping(
        data, overrides, source=str(path), check_devices=check_devices, max_cells=max_cells
    )


def sweep_from_mapping(
    data: Mapping[str, Any],
    overrides: Sequence[str] = (),
    *,
    source: str = "",
    check_devices: bool = True,
    max_cells: int = MAX_CELLS,
) -> SweepConfig:
    """A :class:`SweepConfig` from TOML-shaped data plus overrides; raises :class:`ConfigError`
    (for a grid of more than ``max_cells`` points before any cell is validated)."""
    raw = _copy_tables(data)
    for text in overrides:
        apply_override(raw, text)
    name, description, run, grid, report = collected(  # every table's mistakes, each named
        [
            lambda: _check_name(raw.get("name")),
            lambda: _check_string("description", raw.get("description", "")),
            lambda: _check_run_table(raw["run"]),
            lambda: _check_grid_table(raw["grid"], raw["run"]),
            lambda: _check_report_table(raw["report"]),
        ]
    )
    sweep = SweepConfig(
        name=name,
        description=description,
        run=run,
        grid=grid,
        report=report,
        source=source,
        check_devices=check_devices,
    )
    check_grid_size(sweep, max_cells)
    expand_grid(sweep)
    return sweep


def grid_size(sweep: SweepConfig) -> int:
    """How many points the grid has: the product of its axes' lengths (cells that coincide
    once canonical are counted once each later, by :func:`unique_cells`)."""
    return math.prod(len(values) for values in sweep.grid.values())


def check_grid_size(sweep: SweepConfig, max_cells: int) -> None:
    """:class:`ConfigError` naming the count when the grid has more than ``max_cells`` points:
    counted from the axes' lengths, before any cell is built or validated."""
    size = grid_size(sweep)
    if size <= max_cells:
        return
    axes = " x ".join(f"{len(v)} ({axis})" for axis, v in sweep.grid.items())
    raise ConfigError(
        f"grid of {size:,} cells ({axes}), each a federation of its own; allowed: at most "
        f"{max_cells:,} cells unless asked (--max-cells {size}, or max_cells= in Python)"
    )


def client_epochs(cells: Sequence[Mapping[str, Any]]) -> int:
    """The training a sweep's ``cells`` ask for, in client-epochs (one client training one
    epoch on its partition): ``num-clients x epochs`` per cell, twice for a ``compare`` cell
    that also reports FedAvg (its rounds train as long again)."""
    total = 0
    for cell in cells:
        again = cell["strategy"] == Mode.COMPARE and FEDAVG in row_methods(cell)
        total += int(cell["num-clients"]) * int(cell["epochs"]) * (2 if again else 1)
    return total


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
    schema = REPORT_SCHEMA if table == "report" else run_schema()
    linked = table == "grid" and LINK in name
    for part in axis_keys(name) if linked else [name]:
        if part not in schema:
            raise ConfigError(
                f"override {text!r}: unknown key {part!r}{did_you_mean(part, list(schema))}"
            )
    if table == "grid":
        for key in axis_keys(name):
            _drop_key(raw, key, keep=name)
        raw["grid"][name] = value if isinstance(value, list) else [value]
    elif table == "run":
        _drop_key(raw, name)
        raw["run"][name] = value
    else:
        raw["report"][name] = value


def axis_keys(axis: str) -> list[str]:
    """The run-config keys a grid axis sets: ``"a+b"`` -> ``["a", "b"]``, ``"a"`` -> ``["a"]``."""
    return [key.strip() for key in axis.split(LINK)]


def _drop_key(raw: dict[str, Any], key: str, keep: str = "") -> None:
    """Remove ``key`` from ``[run]`` and every grid axis that sets it but ``keep`` (the axis an
    override replaces in place)."""
    raw["run"].pop(key, None)
    for axis in [a for a in raw["grid"] if key in axis_keys(a) and a != keep]:
        del raw["grid"][axis]


def _check_name(name: Any) -> str:
    """The sweep's name: it names the default out dir ``results/<name>``, so it is one plain
    folder name (no path separator, no control character, not ``.`` or ``..``)."""
    if name is None:
        raise ConfigError("name is missing: allowed: a string of letters, digits, '.', '_', '-'")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or len(name) > MAX_NAME:
        raise ConfigError(
            f"name = {shown(name)}: allowed: a non-empty string of at most {MAX_NAME} letters, "
            "digits, '.', '_', '-'"
        )
    if not name.strip("."):
        raise ConfigError(
            f"name = {shown(name)}: dots alone name no folder of their own (results/{name} is "
            "not a folder inside results/); allowed: a name with a letter, digit, '_' or '-'"
        )
    return name


def _check_string(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key} = {value!r}: expected str")
    return value


def _check_known(table: str, keys: Sequence[str], schema: Mapping[str, Key]) -> None:
    collected([lambda key=key: _check_key_known(table, key, schema) for key in keys])


def _check_key_known(table: str, key: str, schema: Mapping[str, Key]) -> None:
    if key not in schema:
        raise ConfigError(
            f"unknown key {table}.{key}{did_you_mean(key, list(schema))}; "
            f"see the keys of [{table}] in the documentation"
        )


def _check_run_table(run: Mapping[str, Any]) -> dict[str, Any]:
    """Every key of ``[run]`` known and its value valid; each mistake named."""
    schema = run_schema()
    checks = [
        lambda key=key, value=value: (
            _check_key_known("run", key, schema),
            check_value(key, value, schema, where="run."),
        )[1]
        for key, value in run.items()
    ]
    return dict(zip(run, collected(checks), strict=True))


def _check_grid_table(grid: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, list[Any]]:
    schema = run_schema()
    _check_known("grid", [k for axis in grid for k in axis_keys(axis)], schema)
    axes: dict[str, list[Any]] = {}
    seen: set[str] = set()
    for axis, values in grid.items():
        for key in axis_keys(axis):
            if key in NOT_SWEEPABLE:
                raise ConfigError(f"grid.{key}: not sweepable; set it in [run] or with --out")
            if key in run:
                raise ConfigError(
                    f"grid.{axis} = {values!r}: {key} is also set in [run]; allowed: one of the two"
                )
            if key in seen:
                raise ConfigError(f"grid.{axis}: {key} is on two grid axes; allowed: one")
            seen.add(key)
        if not isinstance(values, list) or not values:
            kind = " or ".join(schema[k].type.__name__ for k in axis_keys(axis))
            raise ConfigError(f"grid.{axis} = {values!r}: expected a non-empty list of {kind}")
        checked = [_axis_value(axis, v, schema) for v in values]
        repeated = [v for i, v in enumerate(checked) if v in checked[:i]]
        if repeated:
            raise ConfigError(
                f"grid.{axis} = {values!r}: {repeated[0]!r} is repeated; allowed: distinct values"
            )
        axes[axis] = checked
    return axes


def _axis_value(axis: str, value: Any, schema: Mapping[str, Key]) -> Any:
    """One value of a grid axis, checked: a scalar, or for a linked axis a list of one value
    per key (kept as a list, the shape of the TOML)."""
    keys = axis_keys(axis)
    if len(keys) == 1:
        return check_value(axis, value, schema, where="grid.")
    if not isinstance(value, list) or len(value) != len(keys):
        raise ConfigError(
            f"grid.{axis}: value {value!r}: allowed: a list of {len(keys)} values, one per key "
            f"({', '.join(keys)})"
        )
    return [check_value(k, v, schema, where="grid.") for k, v in zip(keys, value, strict=True)]


def _check_report_table(report: Mapping[str, Any]) -> dict[str, Any]:
    _check_known("report", list(report), REPORT_SCHEMA)
    settings = {k: spec.default for k, spec in REPORT_SCHEMA.items()}
    checks = [
        lambda key=key, value=value: check_value(key, value, REPORT_SCHEMA, where="report.")
        for key, value in report.items()
    ]
    return settings | dict(zip(report, collected(checks), strict=True))


def grid_points(sweep: SweepConfig) -> list[dict[str, Any]]:
    """One ``{axis: value}`` per distinct cell, in the order of :func:`expand_grid`."""
    return [point for point, _cell in unique_cells(sweep)]


def product_points(sweep: SweepConfig) -> list[dict[str, Any]]:
    """The product of the axes, the last varying fastest (before duplicates are dropped)."""
    axes = list(sweep.grid)
    points = []
    for values in product(*sweep.grid.values()):
        point: dict[str, Any] = {}
        for axis, value in zip(axes, values, strict=True):
            keys = axis_keys(axis)
            point.update(zip(keys, value, strict=True) if len(keys) > 1 else {axis: value})
        points.append(point)
    return points


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
        cells.setdefault(canonical_cell_id(config), (point, config))
    return list(cells.values())
