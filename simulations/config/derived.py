"""Values derived from a validated run config: the methods a cell runs and writes rows for, the
clients' and the server's widths, the resolved normalisation and bias, paths made absolute."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from fedlmc.data.catalog import (
    TRAIN_SIZES,
    absolute_hf_name,
)
from fedlmc.merging.method_registry import (
    CALIBRATED_SUFFIX,
    base_method,
    merge_method_names,
    resolve_method_entry,
)
from fedlmc.merging.method_registry import merge_method as merge_method_entry
from fedlmc.models.registry import (
    is_factory_path,
    model_entry,
)
from fedlmc.simulations.config.run_config import RunConfig
from fedlmc.simulations.config.values import FEDAVG, ONE_SHOT_MODES, Mode, option_key, parse_widths


def absolute_paths(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """``config`` with its local paths made absolute (Ray workers and the ServerApp need not
    share the driver's working directory): ``data-root``, an ``hf:`` path and a model factory
    file ``path/file.py:make_net``; a validated :class:`RunConfig` stays one (the same
    locations, written otherwise)."""
    paths: dict[str, str] = {}
    if config.get("data-root"):
        paths["data-root"] = str(Path(config["data-root"]).expanduser().resolve())
    if config.get("dataset"):
        paths["dataset"] = absolute_hf_name(config["dataset"])
    model = config.get("model", "")
    location, _, attribute = model.rpartition(":")
    if location.endswith(".py") and is_factory_path(model):
        paths["model"] = f"{Path(location).expanduser().resolve()}:{attribute}"
    if isinstance(config, RunConfig):
        return config.with_paths(paths)
    return {**config, **paths}


def method_list(config: Mapping[str, Any]) -> list[str]:
    """The ``methods`` key as a list of row names, in the given order, without duplicates; an
    entry ``package.module:function`` is the method it registers
    (:func:`fedlmc.merging.method_registry.resolve_method_entry`)."""
    entries = _listed(config["methods"])
    if not any(":" in m for m in entries):  # no import path: the names as written
        return list(entries)
    return list(dict.fromkeys(resolve_method_entry(m) for m in entries))


@lru_cache(maxsize=256)
def _listed(text: str) -> tuple[str, ...]:
    """The entries of a ``methods`` text, stripped, each once, in order (parsed once: a sweep's
    start read the same text 16 times per cell); import paths are resolved by the caller."""
    return tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))


def resolved_norm(config: Mapping[str, Any]) -> str:
    """The ``norm`` the model is built with (``auto``: the model's registered default)."""
    norm = config["norm"]
    return model_entry(config["model"]).default_norm if norm == "auto" else norm


def model_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The configured model's public options read from their run-config keys
    (:mod:`fedlmc.models.registry`), e.g. ``{"depth": 3, "base_hidden": 128}`` for the MLP,
    and its ``bias`` when it has that option."""
    entry = model_entry(config["model"])
    options = {
        name: config[option_key(name)] for name, option in entry.options.items() if option.public
    }
    bias = resolved_bias(config)
    if bias != "auto":
        options["bias"] = bias == "true"
    return options


def resolved_bias(config: Mapping[str, Any]) -> str:
    """``"true"``/``"false"``: the ``bias`` the model is built with (``auto``: its registered
    default); ``"auto"`` for models without a ``bias`` option (user factories)."""
    option = model_entry(config["model"]).options.get("bias")
    if config["bias"] != "auto" or option is None:
        return config["bias"]
    return "true" if option.default else "false"


def client_widths(config: Mapping[str, Any]) -> tuple[float, ...]:
    """Every client's width multiplier in partition order: ``client-widths``, or ``width`` for
    each of the ``num-clients`` clients when it is empty."""
    widths = parse_widths(config["client-widths"])
    return widths or (float(config["width"]),) * int(config["num-clients"])


def client_width(config: Mapping[str, Any], partition_id: int) -> float:
    """The width multiplier of partition ``partition_id``'s client (:func:`client_widths`; any
    partition gets ``width`` when ``client-widths`` is empty); ``ValueError`` for a partition
    without a width."""
    if not config["client-widths"]:
        return float(config["width"])
    widths = client_widths(config)
    if not 0 <= partition_id < len(widths):
        raise ValueError(
            f"partition-id = {partition_id}: client-widths = {config['client-widths']!r} gives "
            f"widths to partitions 0 .. {len(widths) - 1} only"
        )
    return widths[partition_id]


def server_width(config: Mapping[str, Any]) -> float:
    """The width of the merged model (and of the server's template): ``server-width``, or the
    widest client's when it is 0."""
    return float(config["server-width"]) or max(client_widths(config))


def explicit_server_width(config: Mapping[str, Any]) -> float:
    """``server-width`` in a cell's identity: 0 when it is the widest client's width (the
    default's meaning), so that both spellings are one cell and a sweep over ``width`` does not
    vary it."""
    wide = server_width(config)
    return 0.0 if wide == max(client_widths(config)) else wide


def mixed_widths(config: Mapping[str, Any]) -> bool:
    """Whether some client's width differs from the server's (the server embeds the narrower
    clients before merging); ``False`` for the classic cell, every client at the merged width."""
    wide = server_width(config)
    return any(w != wide for w in client_widths(config))


def widths_text(widths: Sequence[float]) -> str:
    """``(0.5, 1.0, 2.0)`` -> ``"0.5,1,2"`` (the ``client_widths`` results column)."""
    return ",".join(f"{w:g}" for w in widths)


def mixed_width_methods() -> tuple[str, ...]:
    """The registered merge methods that merge clients of different widths
    (``mixed_widths``, :mod:`fedlmc.merging.widths`)."""
    return tuple(m for m in merge_method_names() if merge_method_entry(m).needs.mixed_widths)


def align_method(config: Mapping[str, Any]) -> str:
    """The merge method of the ``aligned`` strategy: ``align``, or the method an entry
    ``package.module:function`` registers
    (:func:`fedlmc.merging.method_registry.resolve_method_entry`)."""
    return resolve_method_entry(config["align"])


def selected_methods(config: Mapping[str, Any]) -> list[str]:
    """The merge methods the run executes: ``methods`` under ``compare``, ``align`` under
    ``aligned``, ``average`` under ``average``, none for FedAvg."""
    strategy = config["strategy"]
    if strategy == Mode.COMPARE:
        rows = method_list(config)  # first: an entry named by import path registers its method
        names = set(merge_method_names())
        return [base for base in map(base_method, rows) if base in names]
    if strategy == Mode.ALIGNED:
        return [align_method(config)]
    return ["average"] if strategy == Mode.AVERAGE else []


def row_methods(config: Mapping[str, Any]) -> list[str]:
    """The ``method`` of every row a federation of ``config`` reports, in order: each of
    ``methods`` under ``compare`` (``fedavg`` and the references included), the merge
    (``average`` / ``align``) and, unless ``calibration = "none"``, its ``_t`` row under
    ``average`` / ``aligned``, ``fedavg`` under ``fedavg``. A sweep counts a cell done only
    when its rows hold exactly these
    (:func:`fedlmc.simulations.records.results_file.finished_cells`)."""
    strategy = config["strategy"]
    if strategy == Mode.COMPARE:
        return method_list(config)
    if strategy == Mode.FEDAVG:
        return [FEDAVG]
    base = align_method(config) if strategy == Mode.ALIGNED else "average"
    return [base] if config["calibration"] == "none" else [base, base + CALIBRATED_SUFFIX]


# ----------------------------------------------------------------------------- feasibility


def uses_fedavg(config: Mapping[str, Any]) -> bool:
    """Whether the FedAvg baseline runs: ``strategy = "fedavg"``, or ``fedavg`` in the
    ``methods`` of ``compare``."""
    return config["strategy"] == Mode.FEDAVG or (
        config["strategy"] == Mode.COMPARE and FEDAVG in method_list(config)
    )


def client_pool_size(config: Mapping[str, Any]) -> int:
    """Examples left to the clients: the training set minus ``round(server-fraction * N)``."""
    total = TRAIN_SIZES[config["dataset"]]
    return total - int(round(config["server-fraction"] * total))


def federated_calibration(config: Mapping[str, Any]) -> bool:
    """Whether the run calibrates (and runs every data-dependent step after the merge: BatchNorm
    and REPAIR statistics, ``auto``'s decision) on the clients' data: ``calibration =
    "federated"`` with the ``average`` or ``aligned`` strategy."""
    return config["strategy"] in ONE_SHOT_MODES and config["calibration"] == "federated"


def calibration_holdout(config: Mapping[str, Any]) -> float:
    """The share of each client's partition held out from training for calibration:
    ``calibration-holdout`` under :func:`federated_calibration`, else 0. The run plan gives it
    to the strategies (:mod:`fedlmc.simulations.config.run_plan`,
    ``StrategyOptions.holdout_share``), which send it to the clients as
    ``holdout-share`` (:mod:`fedlmc.strategies.protocol`); a client reads only that."""
    return float(config["calibration-holdout"]) if federated_calibration(config) else 0.0
