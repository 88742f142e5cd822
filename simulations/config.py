"""The one place where run and sweep configuration is defined and validated.

A *run config* is a flat mapping of hyphenated keys (the same keys as Flower's ``--run-config``
and ``[tool.flwr.app.config]``) to scalars. :func:`run_schema` lists every key with its type,
default and allowed values; the named values (data sets, models and their options, merge
methods) are read from the registries of :mod:`fedlmc.data.catalog`,
:mod:`fedlmc.models.registry` and :mod:`fedlmc.merging.methods`, so a registered model or merge
method is a valid value with no edit here. :func:`validate_run_config` fills in defaults and rejects
anything else with a :class:`ConfigError` whose one-line message names the key, the value and
what is allowed. Nothing here imports Flower, torch, scipy or pandas.
"""

from __future__ import annotations

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

from fedlmc.data.catalog import (
    DATASETS,
    DOWNLOADABLE,
    NUM_CLASSES,
    PARTITION_SCHEMES,
    TRAIN_SIZES,
    absolute_hf_name,
    is_hf_name,
    is_known_dataset,
)
from fedlmc.merging.methods import (
    AUTO_TOLERANCE,
    CALIBRATED_SUFFIX,
    base_method,
    merge_method_names,
    mixed_width_row,
    study_methods,
)
from fedlmc.merging.methods import merge_method as merge_method_entry
from fedlmc.merging.post_merge import CALIBRATIONS
from fedlmc.models.registry import (
    MODELS,
    NORMS,
    is_factory_path,
    model_entry,
    model_names,
    public_options,
)
from fedlmc.simulations._new_secure_config import (
    SECURE_MODES,
    SECURE_OFF,
    check_secure_aggregation,
    is_secure,
)
from fedlmc.simulations.report_schema import REPORT_SCHEMA
from fedlmc.simulations.schema import (
    ConfigError,
    Key,
    Rule,
    at_least,
    check_value,
    choice,
    did_you_mean,
    fraction,
    named,
    out_of_range,
    shown,
)

__all__ = [
    "ConfigError",
    "SweepConfig",
    "canonical_run_config",
    "cell_id",
    "cell_methods",
    "expand_grid",
    "load_sweep_config",
    "method_list",
    "row_methods",
    "run_schema",
    "runtime_keys",
    "validate_run_config",
]

STRATEGIES = ("compare", "average", "aligned", "fedavg")
BIAS_VALUES = ("auto", "true", "false")
FAILURE_MODES = ("raise", "nan", "hang")
FEDAVG = "fedavg"
INITS = ("independent", "shared")
DEFAULT_MAX_SHARE = 0.5  # = fedlmc.strategies.screening.DEFAULT_MAX_SHARE (no Flower import here)
DEFAULT_OUTLIER_FACTOR = 10.0  # = fedlmc.strategies.robust.DEFAULT_OUTLIER_FACTOR


def cell_methods() -> tuple[str, ...]:
    """Every method a cell can report: the study's rows
    (:func:`fedlmc.merging.methods.study_methods`) and the FedAvg baseline."""
    return (*study_methods(), FEDAVG)


def aligning_methods() -> tuple[str, ...]:
    """The merge methods of the ``aligned`` strategy: every registered one but ``average``."""
    return tuple(m for m in merge_method_names() if m != "average")


def dataset_names() -> tuple[str, ...]:
    """The data set names shown as allowed (``hf:NAME`` is allowed too)."""
    return (*DATASETS, "hf:NAME")


def _dataset(value: Any) -> str | None:
    if is_known_dataset(value):
        return None
    return f"allowed: {', '.join(DATASETS)}, or hf:NAME (a Hugging Face hub name or local path)"


def server_split_share(value: Any) -> str | None:
    """``server-fraction`` in (0, 1): every strategy and calibration needs a server split, since
    the server fits each model's temperature for the calibrated columns on it."""
    if 0.0 < value < 1.0:
        return None
    return (
        "allowed: a number in (0, 1); the server fits each model's temperature for the "
        "calibrated columns on its split, whatever the calibration"
    )


def _model(value: Any) -> str | None:
    if value in model_names() or is_factory_path(value):
        return None
    return (
        f"allowed: {', '.join(model_names())}, or a model factory "
        "'package.module:make_net' / 'path/to/file.py:make_net'"
    )


def _methods(value: Any) -> str | None:
    names = [m.strip() for m in value.split(",") if m.strip()]
    allowed = cell_methods()
    if not names or any(m not in allowed for m in names):
        return f"allowed: a comma-separated list of {', '.join(allowed)}"
    return None


def parse_widths(text: str) -> tuple[float, ...]:
    """``"0.5, 1,2"`` -> ``(0.5, 1.0, 2.0)``; ``ValueError`` naming the first item that is not a
    finite number > 0 (empty text: no widths)."""
    if not text.strip():
        return ()
    widths = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"width {item.strip()!r} is not a number > 0")
        widths.append(value)
    return tuple(widths)


def _widths_list(value: Any) -> str | None:
    try:
        parse_widths(value)
    except ValueError as err:
        return f"{err}; allowed: empty, or comma-separated width multipliers > 0 ('0.5,1,2,4')"
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


MAX_LAMBDAS = 201  # every point costs a full evaluation (and a temperature fit)
MEMORY_FACTOR_CLIENT = 4  # a training client: weights, gradients, momentum, a copy
IN_SHAPES = {
    "mnist5k": (1, 28, 28),
    "mnist": (1, 28, 28),
    "fashion_mnist": (1, 28, 28),
    "cifar10": (3, 32, 32),
    "cifar100": (3, 32, 32),
}


def _lambdas(value: Any) -> str | None:
    if 3 <= value <= MAX_LAMBDAS and value % 2 == 1:
        return None
    return (
        f"allowed: an odd number 3 .. {MAX_LAMBDAS} (the grid must hold lambda = 1/2 for the "
        "*_barrier_half columns)"
    )


def _share(value: Any) -> str | None:
    return None if 0.0 < value <= 1.0 else "allowed: a number in (0, 1]"


def option_key(name: str) -> str:
    """The run-config key of a public model option: ``base_hidden`` -> ``base-hidden``."""
    return name.replace("_", "-")


def _has_option(name: str) -> Rule:
    return Rule(
        f"the model has a `{option_key(name)}` option",
        lambda config: name in model_entry(config["model"]).options,
    )


def _model_option_keys() -> dict[str, Key]:
    """One run-config key per public model option (:mod:`fedlmc.models.registry`); a cell ignores
    it when its model has no such option."""
    keys = {}
    for name, (option, models) in public_options().items():
        check = at_least(option.minimum) if option.minimum is not None else None
        doc = f"{option.doc} ({', '.join(models)})"
        kind = type(option.default)
        keys[option_key(name)] = Key(kind, option.default, doc, check, applies=_has_option(name))
    return keys


def _strategy_is(*names: str) -> Rule:
    text = " or ".join(f'`"{name}"`' for name in names)
    return Rule(
        f"`strategy` {'=' if len(names) == 1 else 'is'} {text}",
        lambda config: config["strategy"] in names,
    )


def declared_keys() -> dict[str, Key]:
    """Every run-config key but the model options, each declared once, in documentation order
    (:data:`RUN_KEYS`)."""
    return {
        "dataset": Key(str, "mnist5k", "data set name", _dataset, dataset_names),
        "data-root": Key(
            str,
            "",
            "folder of the torchvision files (mnist, cifar10, ...) or the hf: cache",
            runtime=True,
        ),
        "download": Key(
            bool,
            False,
            "fetch a torchvision data set into data-root first (once, on the server)",
            runtime=True,
        ),
        "data-mirror": Key(
            str,
            "",
            "base URL of a mirror for download (empty: torchvision's own URLs)",
            runtime=True,
        ),
        "image-key": Key(str, "", "image column of an hf: data set (empty: detected)"),
        "label-key": Key(str, "", "label column of an hf: data set (empty: detected)"),
        "server-fraction": Key(
            float, 0.1, "share of the training data kept by the server", server_split_share
        ),
        "model": Key(
            str,
            "mlp",
            "architecture, or a user factory package.module:make_net or path/file.py:make_net",
            _model,
            model_names,
        ),
        "width": Key(
            float,
            1.0,
            "width multiplier (of every client when client-widths is empty)",
            at_least(0.0, strict=True),
            applies=Rule("`client-widths` is empty", lambda c: not c["client-widths"]),
        ),
        "client-widths": Key(
            str,
            "",
            "one width multiplier per client, in partition order, e.g. '0.5,1,2,4' (empty: "
            "every client uses width); as many as num-clients",
            _widths_list,
        ),
        "server-width": Key(
            float,
            0.0,
            "width of the merged model: at least the widest client's (0: the widest client's)",
            at_least(0.0),
            resolve=Rule(
                "the widest client's width counts as `0`", lambda c: explicit_server_width(c)
            ),
        ),
        "norm": named(
            str, "auto", "normalisation layers (auto: the model's default)", ("auto", *NORMS)
        ),
        "bias": Key(
            str,
            "auto",
            "bias in every linear/conv layer: true, false, or auto (the model's registered "
            "default; LEWC is derived for bias-free nets)",
            choice(BIAS_VALUES),
            lambda: BIAS_VALUES,
            booleans=True,
            resolve=Rule("`auto` counts as the model's default", lambda c: resolved_bias(c)),
        ),
        "num-clients": Key(int, 2, "number of clients", at_least(2)),
        "partition": named(
            str, "iid", "partition scheme (full: every client the whole pool)", PARTITION_SCHEMES
        ),
        "alpha": Key(
            float,
            0.5,
            "Dirichlet concentration",
            at_least(0.0, strict=True),
            applies=Rule('`partition = "dirichlet"`', lambda c: c["partition"] == "dirichlet"),
        ),
        "classes-per-client": Key(
            int,
            2,
            "classes per client (pathological, shard)",
            at_least(1),
            applies=Rule(
                '`partition` is `"pathological"` or `"shard"`',
                lambda c: c["partition"] in ("pathological", "shard"),
            ),
        ),
        "epochs": Key(int, 10, "local epochs per client", at_least(1)),
        "lr": Key(float, 0.05, "peak learning rate", at_least(0.0, strict=True)),
        "weight-decay": Key(float, 3e-3, "weight decay", at_least(0.0)),
        "batch-size": Key(int, 128, "batch size", at_least(1)),
        "optimizer": named(str, "sgd", "optimizer", ("sgd", "adam", "adamw")),
        "momentum": Key(float, 0.9, "SGD momentum", fraction),
        "schedule": named(
            str, "onecycle", "learning-rate schedule", ("onecycle", "cosine", "constant")
        ),
        "strategy": named(str, "compare", "server strategy", STRATEGIES),
        "methods": Key(
            str,
            "average,average_t,weight_matching,weight_matching_t,ensemble",
            "rows evaluated by the compare strategy (comma-separated); left at the default, "
            "clients of different widths get its mixed-width counterparts (embed_average, ...)",
            _methods,
            cell_methods,
            applies=_strategy_is("compare"),
        ),
        "align": named(
            str,
            "weight_matching",
            "merge method of the aligned strategy",
            aligning_methods,
            applies=_strategy_is("aligned"),
        ),
        "auto-tolerance": Key(
            float,
            AUTO_TOLERANCE,
            "nats: the auto method keeps the plain average within this calibrated-NLL gap",
            at_least(0.0),
            applies=Rule("the `auto` method runs", lambda c: "auto" in selected_methods(c)),
        ),
        "calibration": named(
            str,
            "server",
            "temperature calibration of the average/aligned strategies",
            CALIBRATIONS,
            applies=_strategy_is("average", "aligned"),
        ),
        "calibration-holdout": Key(
            float,
            0.1,
            "share of each client's partition held out from training for calibration = federated "
            "(0: calibrate in-sample on the training data)",
            fraction,
            applies=Rule(
                '`calibration = "federated"` with `strategy` `"average"` or `"aligned"`',
                lambda c: federated_calibration(c),
            ),
        ),
        "secure-aggregation": named(
            str,
            SECURE_OFF,
            "secure aggregation of the one-shot average: off (every client's weights reach "
            "the server), or secagg+ (Flower's SecAgg+: the server sees only their weighted sum)",
            SECURE_MODES,
        ),
        "secagg-clipping-range": Key(
            float,
            0.0,
            "SecAgg+ clipping range c: every trained weight must lie in [-c, c] (0: the "
            "smallest power of two >= 4x the initial model's largest |weight|, at least 8)",
            at_least(0.0),
            applies=Rule('`secure-aggregation = "secagg+"`', lambda c: is_secure(c)),
        ),
        "init": named(
            str,
            "independent",
            "client initialisation: independent (seeded per client), or shared (the server's "
            "initialisation at server-width, sliced to each client's width: nested sub-models)",
            INITS,
        ),
        "fedavg-rounds": Key(
            int,
            5,
            "rounds of the FedAvg baseline",
            at_least(1),
            applies=Rule(
                'the FedAvg baseline runs (`strategy = "fedavg"`, or `fedavg` in `methods`)',
                lambda c: uses_fedavg(c),
            ),
        ),
        "warmup-rounds": Key(
            int,
            0,
            "FedAvg rounds of one local epoch each from the shared initialisation before the "
            "one-shot round, which then trains epochs - warmup-rounds epochs (0: pure one-shot; "
            'needs init = "shared")',
            at_least(0),
            applies=_strategy_is("compare", "average", "aligned"),
        ),
        "lambdas": Key(
            int,
            25,
            f"points on the interpolation grid (compare): odd, so that it holds lambda = 1/2; "
            f"at most {MAX_LAMBDAS}",
            _lambdas,
            applies=_strategy_is("compare"),
        ),
        "diagnostics": Key(
            bool,
            True,
            "compute LEWC and orthogonality diagnostics (compare)",
            applies=_strategy_is("compare"),
        ),
        "seed": Key(int, 0, "seed", at_least(0)),
        "device": named(str, "auto", "training device", ("auto", "cpu", "cuda"), runtime=True),
        "num-cpus": Key(
            float,
            1.0,
            "CPUs per simulated client; its threads: max(1, floor(num-cpus))",
            at_least(0.0, strict=True),
            runtime=True,
        ),
        "num-gpus": Key(float, 0.0, "GPUs per simulated client", at_least(0.0), runtime=True),
        "server-cpus": Key(
            float,
            0.0,
            "threads of the server's merges and evaluations (0: the cores the client slots "
            "leave, at least 1)",
            at_least(0.0),
            runtime=True,
        ),
        "min-clients": Key(int, 2, "fewest surviving clients a merge accepts", at_least(1)),
        "max-client-share": Key(
            float,
            DEFAULT_MAX_SHARE,
            "largest share of one client in a deployment's merge (simulations use the "
            "partition sizes)",
            _share,
            runtime=True,
        ),
        "outlier-factor": Key(
            float,
            DEFAULT_OUTLIER_FACTOR,
            "robust screen (3+ clients): a client whose weight norms, BatchNorm/REPAIR "
            "statistics or calibration NLL exceed this factor times the median over the "
            "clients is dropped",
            at_least(1.0, strict=True),
            runtime=True,
        ),
        "timeout": Key(
            float, 600.0, "seconds to wait for clients", at_least(0.0, strict=True), runtime=True
        ),
        "inject-failure": Key(str, "none", "test-only failure injection", _failures),
        "out-dir": Key(str, "", "folder for results.csv and merged weights", runtime=True),
    }


RUN_KEYS: dict[str, Key] = declared_keys()
"""Every run-config key but the model options, each declared once, in documentation order:
type, default, meaning, check, allowed names, and for a sweep whether it is a runtime key (left
out of a cell's identity) and when it can affect a run (``applies``; elsewhere
:func:`canonical_run_config` resets it). ``pyproject.toml``'s ``[tool.flwr.app.config]`` is
generated from it (``fedlmc keys --pyproject``)."""
MODEL_OPTIONS_AFTER = "width"
"""The model options' keys (``_model_option_keys``) follow this key in :func:`run_schema`."""


def run_schema() -> dict[str, Key]:
    """Every run-config key in documentation order: :data:`RUN_KEYS` with the public model
    options' keys after ``width`` (built from the registries when called)."""
    schema: dict[str, Key] = {}
    for name, key in RUN_KEYS.items():
        schema[name] = key
        if name == MODEL_OPTIONS_AFTER:
            schema.update(_model_option_keys())
    return schema


def runtime_keys() -> tuple[str, ...]:
    """The keys declared ``runtime``: left out of a cell's identity (:func:`cell_id`)."""
    return tuple(name for name, key in run_schema().items() if key.runtime)


def validate_run_config(
    values: Mapping[str, Any], *, check_devices: bool = True, whole_run: bool = True
) -> dict[str, Any]:
    """Defaults filled in, every value type- and range-checked; raises :class:`ConfigError`.
    ``whole_run = False`` (a client's config for one round, whose ``epochs`` may be one FedAvg
    round's share) skips the checks about the whole run (``fedavg-rounds`` and ``warmup-rounds``
    against ``epochs``)."""
    schema = run_schema()
    unknown = [k for k in values if k not in schema]
    if unknown:
        key = unknown[0]
        raise ConfigError(f"unknown key {key!r}{did_you_mean(key, list(schema))}")
    config = {k: spec.default for k, spec in schema.items()}
    for key, value in values.items():
        config[key] = check_value(key, value, schema)
    config = with_cell_default_methods(config)
    check_consistency(config, check_devices=check_devices, whole_run=whole_run)
    return config


def default_methods() -> str:
    """The declared default of ``methods``."""
    return RUN_KEYS["methods"].default


def mixed_width_counterparts(methods: str) -> str:
    """``methods`` with each row's mixed-width counterpart
    (:func:`fedlmc.merging.methods.mixed_width_row`), rows without one left out:
    ``"average,average_t,ensemble"`` -> ``"embed_average,embed_average_t,ensemble"``."""
    rows = (mixed_width_row(m) for m in method_list({"methods": methods}))
    return ",".join(m for m in rows if m is not None)


def with_cell_default_methods(config: dict[str, Any]) -> dict[str, Any]:
    """Defaults that follow the cell: a ``compare`` run whose clients differ in width
    (:func:`mixed_widths`) and whose ``methods`` is the default gets the mixed-width
    counterparts of the default methods (:func:`mixed_width_counterparts`); an explicit list is
    checked as given (:func:`check_widths`)."""
    if config["strategy"] != "compare" or config["methods"] != default_methods():
        return config
    try:
        mixed = mixed_widths(config)
    except ValueError:  # a bad client-widths: check_widths names it
        return config
    if mixed:
        config["methods"] = mixed_width_counterparts(config["methods"])
    return config


def cell_default_methods_note(config: Mapping[str, Any]) -> str | None:
    """The line saying that a mixed-width run got the mixed-width counterparts of the default
    methods (:func:`with_cell_default_methods`); ``None`` for any other run."""
    mixed_default = mixed_width_counterparts(default_methods())
    if config["strategy"] != "compare" or config["methods"] != mixed_default:
        return None
    if not mixed_widths(config):
        return None
    return (
        f"methods = {mixed_default} (the mixed-width counterparts of the default "
        f"{default_methods()}: client widths {widths_text(client_widths(config))}, server "
        f"width {server_width(config):g})"
    )


def check_consistency(
    config: Mapping[str, Any], *, check_devices: bool = True, whole_run: bool = True
) -> None:
    """The checks that involve several keys (:data:`CONSISTENCY_CHECKS`), those about this
    machine (:data:`DEVICE_CHECKS`) and those about the whole run (:data:`WHOLE_RUN_CHECKS`)."""
    checks = list(CONSISTENCY_CHECKS)
    checks += DEVICE_CHECKS if check_devices else []
    checks += WHOLE_RUN_CHECKS if whole_run else []
    for check in checks:
        check(config)


def check_min_clients(config: Mapping[str, Any]) -> None:
    """``min-clients`` at most ``num-clients``."""
    if config["min-clients"] > config["num-clients"]:
        raise ConfigError(
            f"min-clients = {config['min-clients']}: allowed: at most num-clients "
            f"({config['num-clients']})"
        )


def check_data_source(config: Mapping[str, Any]) -> None:
    """``download`` needs a ``data-root`` and a downloadable data set; ``image-key`` and
    ``label-key`` need an ``hf:`` data set."""
    if config["download"] and not config["data-root"]:
        raise ConfigError("download = true: allowed only with a data-root to fetch into")
    if config["download"] and config["dataset"] not in DOWNLOADABLE:
        raise ConfigError(
            f"download = true: dataset {config['dataset']!r} is not fetched; allowed with "
            f"{', '.join(DOWNLOADABLE)}"
        )
    for key in ("image-key", "label-key"):
        if config[key] and not is_hf_name(config["dataset"]):
            raise ConfigError(
                f"{key} = {config[key]!r}: allowed only with an hf:NAME dataset, not "
                f"{config['dataset']!r}"
            )


HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # "name" or "owner/name"


def check_local_sources(config: Mapping[str, Any]) -> None:
    """Before Ray starts: a model factory file (``path/file.py:make_net``) must exist, and an
    ``hf:`` data source must be an existing local file or folder or look like a hub name
    (``name`` or ``owner/name``: ``hf:../../x`` is neither). Machine-dependent: skipped with
    ``check_devices=False`` (``--no-device-check``)."""
    location = config["model"].rpartition(":")[0]
    if location.endswith(".py") and not Path(location).expanduser().is_file():
        raise ConfigError(
            f"model = {shown(config['model'])}: no such file {shown(location)}; allowed: a "
            "registered model, 'package.module:make_net' or an existing 'file.py:make_net'"
        )
    if is_hf_name(config["dataset"]):
        name = config["dataset"][len("hf:") :]
        if not os.path.exists(os.path.expanduser(name)) and not HUB_NAME.fullmatch(name):
            raise ConfigError(
                f"dataset = {shown(config['dataset'])}: no such local file or folder, nor a hub "
                "name; allowed: hf: with an existing path or a hub name 'name' / 'owner/name'"
            )


def check_cuda(config: Mapping[str, Any]) -> None:
    """``num-gpus > 0`` or ``device = "cuda"`` needs a visible CUDA GPU."""
    if config["num-gpus"] > 0 or config["device"] == "cuda":
        import torch

        if not torch.cuda.is_available():
            key = "num-gpus" if config["num-gpus"] > 0 else "device"
            raise ConfigError(f"{key} = {config[key]!r}: no CUDA GPU is visible on this machine")


def absolute_paths(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with its local paths made absolute (Ray workers and the ServerApp need not
    share the driver's working directory): ``data-root``, an ``hf:`` path and a model factory
    file ``path/file.py:make_net``."""
    config = dict(config)
    if config.get("data-root"):
        config["data-root"] = str(Path(config["data-root"]).expanduser().resolve())
    if config.get("dataset"):
        config["dataset"] = absolute_hf_name(config["dataset"])
    model = config.get("model", "")
    location, _, attribute = model.rpartition(":")
    if location.endswith(".py") and is_factory_path(model):
        config["model"] = f"{Path(location).expanduser().resolve()}:{attribute}"
    return config


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
    except ValueError:  # an integer of more digits than Python converts (4300)
        raise ConfigError(out_of_range(key, raw, run_schema().get(key))) from None
    return key, value


def resolved_norm(config: Mapping[str, Any]) -> str:
    """The ``norm`` the model is built with (``auto``: the model's registered default)."""
    norm = config["norm"]
    return model_entry(config["model"]).default_norm if norm == "auto" else norm


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


def check_widths(config: Mapping[str, Any]) -> None:
    """``client-widths`` has one width per client; ``server-width`` is 0 or at least the widest
    client's; mixed widths (:func:`mixed_widths`) only with what can merge them: not the FedAvg
    baseline, only the merge methods registered ``mixed_widths`` (:func:`mixed_width_methods`),
    and no norm across units (``ln``: the embedding would change it)."""
    given = parse_widths(config["client-widths"])
    if given and len(given) != config["num-clients"]:
        raise ConfigError(
            f"client-widths = {config['client-widths']!r}: {len(given)} widths; allowed: one "
            f"per client, num-clients = {config['num-clients']}"
        )
    widest = max(client_widths(config))
    if config["server-width"] and config["server-width"] < widest:
        raise ConfigError(
            f"server-width = {config['server-width']:g}: allowed: 0 (the widest client) or at "
            f"least the widest client's width {widest:g}"
        )
    if not mixed_widths(config):
        return
    if uses_fedavg(config):
        raise ConfigError(
            f"client-widths = {config['client-widths']!r} with server-width "
            f"{server_width(config):g}: the FedAvg baseline needs every client at the server "
            "width; allowed: fedavg only with equal client and server widths"
        )
    one_width = [m for m in selected_methods(config) if not merge_method_entry(m).mixed_widths]
    if one_width:
        average = config["strategy"] == "average"
        where = "strategy = 'average'" if average else f"merge method {one_width[0]!r}"
        hint = (
            " (strategy = 'aligned', align = ...)"
            if average
            else ", each also with _t (set methods, e.g. methods = "
            '"embed_average_t,embed_weight_matching_t,heterofl_t,ensemble")'
        )
        raise ConfigError(
            f"{where}: needs clients of one width (client widths "
            f"{widths_text(client_widths(config))}, server width {server_width(config):g}); "
            f"allowed for mixed widths: {', '.join(mixed_width_methods())}{hint}"
        )
    if resolved_norm(config) == "ln":
        raise ConfigError(
            f"norm = 'ln' with client widths {widths_text(client_widths(config))} and server "
            f"width {server_width(config):g}: a norm across units (LayerNorm, GroupNorm) changes "
            "when a narrow model is embedded in a wider one; allowed for mixed widths: bn, none"
        )


def mixed_width_methods() -> tuple[str, ...]:
    """The registered merge methods that merge clients of different widths
    (``mixed_widths``, :mod:`fedlmc.merging.widths`)."""
    return tuple(m for m in merge_method_names() if merge_method_entry(m).mixed_widths)


def check_model_bias(config: Mapping[str, Any]) -> None:
    """``bias = true/false`` needs a model with a ``bias`` option."""
    if config["bias"] != "auto" and "bias" not in model_entry(config["model"]).options:
        raise ConfigError(
            f"bias = {config['bias']!r}: model {config['model']!r} has no bias option; "
            "allowed: auto"
        )


def selected_methods(config: Mapping[str, Any]) -> list[str]:
    """The merge methods the run executes: ``methods`` under ``compare``, ``align`` under
    ``aligned``, ``average`` under ``average``, none for FedAvg."""
    strategy = config["strategy"]
    if strategy == "compare":
        names = merge_method_names()
        return [base_method(m) for m in method_list(config) if base_method(m) in names]
    if strategy == "aligned":
        return [config["align"]]
    return ["average"] if strategy == "average" else []


def row_methods(config: Mapping[str, Any]) -> list[str]:
    """The ``method`` of every row a federation of ``config`` reports, in order: each of
    ``methods`` under ``compare`` (``fedavg`` and the references included), the merge
    (``average`` / ``align``) and, unless ``calibration = "none"``, its ``_t`` row under
    ``average`` / ``aligned``, ``fedavg`` under ``fedavg``. A sweep counts a cell done only
    when its rows hold exactly these (:func:`fedlmc.simulations.results_file.finished_cells`)."""
    strategy = config["strategy"]
    if strategy == "compare":
        return method_list(config)
    if strategy == FEDAVG:
        return [FEDAVG]
    base = config["align"] if strategy == "aligned" else "average"
    return [base] if config["calibration"] == "none" else [base, base + CALIBRATED_SUFFIX]


def check_plain_chain_methods(config: Mapping[str, Any]) -> None:
    """Methods defined only for norm-free plain chains (``average_lewc_bias``) are refused for
    a residual model or a model with norm layers, before any work."""
    chain_only = [m for m in selected_methods(config) if merge_method_entry(m).plain_chain_only]
    if not chain_only:
        return
    entry = model_entry(config["model"])
    if entry.plain_chain is False:
        raise ConfigError(
            f"merge method {chain_only[0]!r}: model {config['model']!r} is residual; allowed "
            f"only for plain chains ({', '.join(e.name for e in MODELS if e.plain_chain)})"
        )
    if resolved_norm(config) != "none":
        raise ConfigError(
            f"merge method {chain_only[0]!r}: norm = {resolved_norm(config)!r}; allowed only "
            "with norm = 'none' (a norm-free chain)"
        )


def check_two_client_methods(config: Mapping[str, Any]) -> None:
    """Methods registered ``many_clients = False`` (``random_direction``) are refused for more
    than two clients, before any work."""
    two_only = [m for m in selected_methods(config) if not merge_method_entry(m).many_clients]
    if two_only and config["num-clients"] > 2:
        raise ConfigError(
            f"merge method {two_only[0]!r} with num-clients = {config['num-clients']}: allowed "
            "only with num-clients = 2"
        )


# ----------------------------------------------------------------------------- feasibility


def uses_fedavg(config: Mapping[str, Any]) -> bool:
    """Whether the FedAvg baseline runs: ``strategy = "fedavg"``, or ``fedavg`` in the
    ``methods`` of ``compare``."""
    return config["strategy"] == FEDAVG or (
        config["strategy"] == "compare" and FEDAVG in method_list(config)
    )


def check_fedavg_rounds(config: Mapping[str, Any]) -> None:
    """The FedAvg baseline trains ``epochs`` local epochs over ``fedavg-rounds`` rounds: every
    round needs at least one."""
    if uses_fedavg(config) and config["fedavg-rounds"] > config["epochs"]:
        raise ConfigError(
            f"fedavg-rounds = {config['fedavg-rounds']}: allowed: 1 .. epochs "
            f"({config['epochs']}) so that every FedAvg round trains at least one epoch"
        )


def check_warmup_rounds(config: Mapping[str, Any]) -> None:
    """``warmup-rounds = k > 0`` needs ``init = "shared"`` (the rounds start from the server's
    initialisation, and the one-shot round from their global model), clients of one width (a
    FedAvg round averages equal shapes) and ``k < epochs`` (the one-shot round trains the
    remaining ``epochs - k``)."""
    k = config["warmup-rounds"]
    if not k or config["strategy"] == FEDAVG:
        return
    if config["init"] != "shared":
        raise ConfigError(
            f"warmup-rounds = {k} with init = {config['init']!r}: allowed only with "
            "init = 'shared' (or warmup-rounds = 0)"
        )
    if mixed_widths(config):
        raise ConfigError(
            f"warmup-rounds = {k} with client widths {widths_text(client_widths(config))}: "
            "allowed only with every client at the server width (or warmup-rounds = 0)"
        )
    if k >= config["epochs"]:
        raise ConfigError(
            f"warmup-rounds = {k}: allowed: 0 .. epochs - 1 ({config['epochs'] - 1}) so that "
            "the one-shot round trains at least one epoch"
        )


def _units(base: int, width: float) -> int:
    return max(1, round(base * width))


VGG11_CHANNELS = (64, 128, 256, 256, 512, 512, 512, 512)  # fedlmc.models.VGG11_LAYOUT's convs
RESNET20_CHANNELS = (16, 32, 64)


def model_parameters(config: Mapping[str, Any]) -> int | None:
    """About how many weights the configured model has (its Linear/Conv weights, which dominate;
    computed from the architecture without building it: validation imports no torch);
    ``None`` for ``hf:`` data sets and user factories."""
    if config["dataset"] not in IN_SHAPES or config["model"] not in ("mlp", "vgg11", "resnet20"):
        return None
    channels, height, width_px = IN_SHAPES[config["dataset"]]
    classes, width = NUM_CLASSES[config["dataset"]], server_width(config)
    if config["model"] == "mlp":
        units = _units(config["base-hidden"], width)
        depth = config["depth"]
        return channels * height * width_px * units + (depth - 1) * units**2 + units * classes
    if config["model"] == "vgg11":
        sizes = [channels, *(_units(c, width) for c in VGG11_CHANNELS)]
        convs = sum(9 * a * b for a, b in zip(sizes, sizes[1:], strict=False))
        return convs + sizes[-1] * classes
    sizes = [_units(c, width) for c in RESNET20_CHANNELS]
    total, previous = 9 * channels * sizes[0], sizes[0]
    for size in sizes:
        total += 9 * previous * size + previous * size * (previous != size) + 5 * 9 * size**2
        previous = size
    return total + sizes[-1] * classes


def memory_estimate(config: Mapping[str, Any], elements: int) -> int:
    r"""Bytes a run needs at least, float32: the server holding every client's weights, the
    template and the merge, and one client training (weights, gradients, momentum and a copy:
    :data:`MEMORY_FACTOR_CLIENT` copies), :math:`4 P (N + 2 + 4)` for :math:`P` weights and
    :math:`N` clients (a lower bound: activations and concurrent clients come on top)."""
    clients = int(config["num-clients"])
    return 4 * int(elements) * (clients + 2 + MEMORY_FACTOR_CLIENT)


def width_key(config: Mapping[str, Any]) -> str:
    """The key that sets the server's width: ``server-width``, ``client-widths`` or ``width``."""
    if config["server-width"]:
        return "server-width"
    return "client-widths" if config["client-widths"] else "width"


def _shown(value: Any) -> str:
    """A number as ``10000`` (``:g``), text as ``'0.5,4'``."""
    return f"{value:g}" if isinstance(value, float) else repr(value)


def machine_memory() -> int:
    """Bytes of physical memory of this machine."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def check_memory(config: Mapping[str, Any]) -> None:
    """:class:`ConfigError` with the bytes needed when :func:`memory_estimate` exceeds this
    machine's memory (the server's width, :func:`server_width`, or ``num-clients`` too large
    for it)."""
    elements = model_parameters(config)
    if elements is None:
        return
    needed, have = memory_estimate(config, elements), machine_memory()
    if needed > have:
        raise ConfigError(
            f"{width_key(config)} = {_shown(config[width_key(config)])}: the {config['model']} at "
            f"width {server_width(config):g} has about {elements:,} weights; "
            f"{config['num-clients']} clients and the server need about {needed:,} bytes "
            f"({needed / 2**30:.1f} GiB), this machine has {have:,} ({have / 2**30:.1f} GiB); "
            "allowed: a smaller width or fewer clients"
        )


def client_pool_size(config: Mapping[str, Any]) -> int:
    """Examples left to the clients: the training set minus ``round(server-fraction * N)``."""
    total = TRAIN_SIZES[config["dataset"]]
    return total - int(round(config["server-fraction"] * total))


def check_partition(config: Mapping[str, Any]) -> None:
    """Rejects partitions that cannot give every client at least one example (``hf:`` data sets
    are checked when they are loaded: their size is unknown before)."""
    if config["dataset"] not in TRAIN_SIZES or config["partition"] == "full":
        return
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


def check_secure_cell(config: Mapping[str, Any]) -> None:
    """``secure-aggregation``: the cell's merge methods checked
    (``check_secure_aggregation`` of ``simulations/_new_secure_config.py``)."""
    methods = [config["align"]] if config["strategy"] == "aligned" else []
    methods += method_list(config) if config["strategy"] == "compare" else []
    check_secure_aggregation(config, methods)


Check = Callable[[Mapping[str, Any]], None]
CONSISTENCY_CHECKS: list[Check] = [
    check_min_clients,
    check_data_source,
    check_partition,
    check_model_bias,
    check_plain_chain_methods,
    check_two_client_methods,
    check_widths,
    check_secure_cell,
]
"""The checks that involve several keys, in order; each raises :class:`ConfigError`. A check
about a new key joins this list (run by :func:`validate_run_config`)."""
WHOLE_RUN_CHECKS: list[Check] = [check_fedavg_rounds, check_warmup_rounds]
"""Checks about the whole run, skipped for a client's one-round config (``whole_run=False``)."""
DEVICE_CHECKS: list[Check] = [check_local_sources, check_memory, check_cuda]
"""Checks about this machine, skipped with ``check_devices=False``."""


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
MAX_NAME = 100  # characters of a sweep name: it names the default out dir, results/<name>
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
) -> SweepConfig:
    """Read, override (rules above) and validate the sweep at ``path``, every cell included."""
    data = read_toml(path)
    return sweep_from_mapping(data, overrides, source=str(path), check_devices=check_devices)


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
    if name is None:
        raise ConfigError("name is missing: allowed: a string of letters, digits, '.', '_', '-'")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or len(name) > MAX_NAME:
        raise ConfigError(
            f"name = {shown(name)}: allowed: a non-empty string of at most {MAX_NAME} letters, "
            "digits, '.', '_', '-'"
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
    schema = run_schema()
    _check_known("run", list(run), schema)
    return {key: check_value(key, value, schema, where="run.") for key, value in run.items()}


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
    for key, value in report.items():
        settings[key] = check_value(key, value, REPORT_SCHEMA, where="report.")
    return settings


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
        cells.setdefault(cell_id(config), (point, config))
    return list(cells.values())


def federated_calibration(config: Mapping[str, Any]) -> bool:
    """Whether the run calibrates (and runs every data-dependent step after the merge: BatchNorm
    and REPAIR statistics, ``auto``'s decision) on the clients' data: ``calibration =
    "federated"`` with the ``average`` or ``aligned`` strategy."""
    return config["strategy"] in ("average", "aligned") and config["calibration"] == "federated"


def calibration_holdout(config: Mapping[str, Any]) -> float:
    """The share of each client's partition held out from training for calibration:
    ``calibration-holdout`` under :func:`federated_calibration`, else 0."""
    return float(config["calibration-holdout"]) if federated_calibration(config) else 0.0


def keeps_trained_model(config: Mapping[str, Any]) -> bool:
    """Whether a client keeps its trained weights in its node's context between rounds (client-side
    activation matching: ``strategy = "aligned"``, ``align = "activation_federated"``)."""
    return config["strategy"] == "aligned" and merge_method_entry(config["align"]).needs_clients


def canonical_run_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (validated) with the keys that cannot affect the run reset to their defaults
    and the keys that stand for another value resolved, as each key declares (:data:`RUN_KEYS`:
    ``applies`` and ``resolve``, every rule read on ``config`` itself): e.g. ``alpha`` unless
    ``partition = "dirichlet"``, model options the chosen model does not have, ``methods``,
    ``lambdas`` and ``diagnostics`` unless ``strategy = "compare"``, and ``bias = auto``
    resolved to the model's default, so ``auto`` and the value it stands for are one cell.
    ``fedlmc keys`` lists every rule."""
    canonical = dict(config)
    for name, key in run_schema().items():
        if key.applies is not None and not key.applies.of(config):
            canonical[name] = key.default
        elif key.resolve is not None:
            canonical[name] = key.resolve.of(config)
    return canonical


def experiment_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys that define the experiment: the run config minus :func:`runtime_keys`."""
    runtime = runtime_keys()
    return {k: config[k] for k in sorted(config) if k not in runtime}


def cell_id(config: Mapping[str, Any]) -> str:
    """12 hex digits of SHA-256 over the resolved run config minus :func:`runtime_keys`.

    Stable across processes and key order; any default filled in by
    :func:`validate_run_config` is part of the hash, runtime-only keys and keys without effect
    (:func:`canonical_run_config`) are not.
    """
    resolved = canonical_run_config(validate_run_config(config, check_devices=False))
    text = json.dumps(experiment_values(resolved), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
