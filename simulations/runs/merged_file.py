"""A saved merged model loaded back: :func:`load_merged`.

A run's out dir (``fedlmc run out-dir=...``, the ServerApp under ``flwr run``, a sweep's
``cells/<cell_id>/``) holds ``merged-<method>.safetensors``: the merged, finished weights
(BatchNorm statistics re-estimated, REPAIR applied where the method does) as a plain state dict,
one file per merge, shared by a method and its ``_t`` row (none for a merge that is a model of
another architecture, ``preserve_first``: :func:`load_merged` refuses it); the file has no
metadata. The model they belong to is in ``results.csv`` beside it (a sweep's: one folder up,
the cell's rows): the row's run-config columns rebuild the architecture (model, width or
``server-width``, depth, norm, bias, ... and the data set's input shape and classes), and the
``<method>_t`` row's ``temperature`` is the temperature fitted for that merge (``T = 1``
without a ``_t`` row).

A results folder is untrusted (someone may send it): :func:`load_merged` runs no code it names
and allocates nothing it has not checked.

- Results: ``results.csv`` is read only if it is a regular file of at most
  :data:`MAX_RESULTS_BYTES` (:func:`~fedlmc.simulations.config.config_file.read_bounded`: a
  device such as ``/dev/zero`` or a FIFO in its place would be read without end or block).

- Imports: a row whose ``model`` (or ``align``, or a ``methods`` entry) is an import path
  (``path/file.py:make_net``, ``package.module:make_net``: importing it runs its code) is
  refused before anything is imported, unless the caller names it in ``allow`` or the
  allow-list ``FEDLMC_MODEL_ALLOW`` (:data:`fedlmc.models.registry.MODEL_ALLOW_VARIABLE`,
  when set) lists it; registered models need neither.
- Memory: the model's parameter count (declared, or from the data's shape for an ``hf:`` data
  set) is checked against this machine's memory before it is built
  (:func:`~fedlmc.simulations.config.feasibility.check_load_memory`, the check that guards runs).
- Weights: the safetensors header is checked against the built model's state dict (names,
  dtypes, shapes, offsets) before any tensor is read
  (:func:`~fedlmc.simulations.runs.safetensors_header.check_header`).
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedlmc.models.registry import (
    MODEL_ALLOW_VARIABLE,
    factory_allowed,
    is_factory_path,
    model_names,
    parameter_count,
)
from fedlmc.simulations.config import (
    model_options,
    resolved_norm,
    run_schema,
    server_width,
    validate_run_config,
)
from fedlmc.simulations.config.config_file import read_bounded
from fedlmc.simulations.config.feasibility import check_load_memory, model_parameters
from fedlmc.simulations.config.schema import ConfigError
from fedlmc.simulations.runs.safetensors_header import check_header

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from torch import nn

__all__ = ["MergedModel", "load_merged"]

PREFIX = "merged-"
SUFFIX = ".safetensors"
CALIBRATED = "_t"
MAX_RESULTS_BYTES = 256 << 20
"""The largest ``results.csv`` :func:`load_merged` reads: 256 MiB (a row takes about 4 KiB: some
65,000 rows, e.g. 6,500 cells of 10 methods)."""


@dataclass(frozen=True)
class MergedModel:
    """A merged model read back from an out dir."""

    model: nn.Module  # the architecture of the run, the merged weights loaded, in eval mode
    temperature: float  # fitted for this merge (its ``_t`` row); 1.0 when none was fitted
    method: str  # the merge, e.g. ``average`` (the file ``merged-average.safetensors``)
    config: dict[str, Any]  # the run config the model was built from

    def calibrated_logits(self, x: torch.Tensor) -> torch.Tensor:
        """``model(x) / temperature`` (what the ``_t`` row evaluated)."""
        return self.model(x) / self.temperature


def saved_methods(folder: Path) -> list[str]:
    """The merges saved in ``folder`` (from its ``merged-<method>.safetensors`` files)."""
    return sorted(p.name[len(PREFIX) : -len(SUFFIX)] for p in folder.glob(f"{PREFIX}*{SUFFIX}"))


def results_rows(folder: Path) -> pd.DataFrame:
    """The rows of the run whose out dir is ``folder``: its ``results.csv``, or for a sweep's
    ``cells/<cell_id>/`` the sweep's rows of that cell."""
    import pandas as pd

    own = folder / "results.csv"
    sweep = folder.parent.parent / "results.csv"
    path = own if os.path.lexists(own) else sweep
    if not os.path.lexists(path):
        raise ConfigError(
            f"{str(folder)!r}: no results.csv beside the merged weights (nor a sweep's)"
        )
    data = read_bounded(path, "results file", MAX_RESULTS_BYTES)
    try:
        rows = pd.read_csv(io.BytesIO(data), keep_default_na=False, na_values=["", "nan", "NaN"])
    except (ValueError, UnicodeDecodeError) as err:  # pandas' ParserError is a ValueError
        reason = " ".join(str(err).split())
        raise ConfigError(f"results file {str(path)!r}: not a results table ({reason})") from None
    if path == sweep:
        rows = rows[rows["cell_id"].astype(str) == folder.name]
    return rows


def scalar(value: Any, kind: type) -> Any:
    """A CSV cell as a run-config value of type ``kind``: numpy scalars as Python ones, NaN
    (empty) as ``""``, a text key's number (``client-widths = "4"`` read as 4.0) as text."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return ""
    if kind is str and not isinstance(value, str | bool):  # bool: a named key's true/false
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    return value


def row_config(row: pd.Series, allow: Collection[str] = ()) -> dict[str, Any]:
    """The validated run config recorded in a results row (``out-dir`` aside), its import
    paths checked first (:func:`check_row_imports`)."""
    schema = run_schema()
    values = {k: scalar(row[k], spec.type) for k, spec in schema.items() if k in row.index}
    values.pop("out-dir", None)
    check_row_imports(values, allow)
    return validate_run_config(values, check_devices=False)


def row_imports(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(key, path)`` of every import path a row names (the keys whose value validation or the
    build imports): its ``model`` when it is no registered model, its ``align`` and each
    ``methods`` entry."""
    model = values.get("model")
    found = [("model", model)] if model not in model_names() and is_factory_path(model) else []
    found += [("align", values["align"])] if is_factory_path(values.get("align")) else []
    methods = values.get("methods")
    entries = (m.strip() for m in methods.split(",")) if isinstance(methods, str) else ()
    return found + [("methods", m) for m in entries if is_factory_path(m)]


def check_row_imports(values: Mapping[str, Any], allow: Collection[str] = ()) -> None:
    """:class:`ConfigError` for the first import path of the row (:func:`row_imports`) that
    neither ``allow`` (paths, or one path) nor a set ``FEDLMC_MODEL_ALLOW`` lists: importing it
    would run its code."""
    allowed = {allow} if isinstance(allow, str) else set(allow)
    listed = os.environ.get(MODEL_ALLOW_VARIABLE)
    for key, path in row_imports(values):
        if path in allowed or (listed is not None and factory_allowed(path, listed)):
            continue
        raise ConfigError(
            f"{key} = {path!r} in the results is an import path (importing it runs its code); "
            f"allowed: a registered model ({', '.join(model_names())}), or a path the caller "
            f"trusts: load_merged(..., allow=[{path!r}]) or {MODEL_ALLOW_VARIABLE}"
        )


def fitted_temperature(rows: pd.DataFrame, method: str) -> float:
    """The ``temperature`` of the ``<method>_t`` row; 1.0 without one."""
    calibrated = rows[rows["method"] == method + CALIBRATED]
    return float(calibrated["temperature"].iloc[0]) if len(calibrated) else 1.0


def _check_saved_kind(base: str) -> None:
    """A :class:`ConfigError` for a registered merge that is no state dict of the model
    (``builds_model``: ``preserve_first``): none is saved, its rows are all there is."""
    from fedlmc.merging.method_registry import METHODS, check_template_merge

    if base in METHODS:
        try:
            check_template_merge(base, "load_merged")
        except ValueError as error:
            raise ConfigError(f"{error} (no merged-{base}{SUFFIX} is saved)") from None


def check_model_memory(config: Mapping[str, Any], splits: Any = None) -> bool:
    """:func:`~fedlmc.simulations.config.feasibility.check_load_memory` of the configured model:
    its count without the data where the config tells it (``splits`` ``None``), else from the
    loaded ``splits``' shape (built on torch's meta device where it declares no count);
    whether the check ran."""
    if splits is None:
        elements = model_parameters(config)
    else:
        elements = parameter_count(
            config["model"],
            server_width(config),
            splits.num_classes,
            splits.in_shape,
            resolved_norm(config),
            build=True,
            **model_options(config),
        )
    if elements is not None:
        check_load_memory(config, elements)
    return elements is not None


def load_merged(out_dir: str | Path, method: str, *, allow: Collection[str] = ()) -> MergedModel:
    """The merge ``method`` saved in ``out_dir`` (module docstring): its model with the merged
    weights (eval mode, on the CPU) and its fitted temperature. ``method`` may name the ``_t``
    row (``average_t`` reads ``merged-average.safetensors``). ``allow``: the import paths
    (``path/file.py:make_net``, ``package.module:name``) the results may name and that may be
    imported, besides those ``FEDLMC_MODEL_ALLOW`` lists (when it is set, nothing it leaves out
    is imported: :func:`fedlmc.models.registry.import_factory`). A clear
    :class:`~fedlmc.simulations.config.schema.ConfigError` names a missing file and the merges
    saved, an import path not allowed, a model too large for this machine, or a header that
    is not the model's."""
    from safetensors.torch import load_file

    from fedlmc.simulations.task import build_from_config, load_splits

    folder = Path(out_dir)
    base = method.removesuffix(CALIBRATED)
    _check_saved_kind(base)
    path = folder / f"{PREFIX}{base}{SUFFIX}"
    if not path.is_file():
        saved = ", ".join(saved_methods(folder)) or "none"
        raise ConfigError(f"merge {method!r}: no {path.name} in {str(folder)!r}; saved: {saved}")
    rows = results_rows(folder)
    own = rows[rows["method"].isin([base, base + CALIBRATED])]
    if own.empty:
        raise ConfigError(f"merge {method!r}: no row of it in the results beside {path.name}")
    config = row_config(own.iloc[0], allow)
    checked = check_model_memory(config)
    splits = load_splits(config)
    if not checked:
        check_model_memory(config, splits)
    model = build_from_config(config, splits)
    check_header(path, model.state_dict())
    model.load_state_dict(load_file(str(path)))
    return MergedModel(model.eval(), fitted_temperature(rows, base), base, config)
