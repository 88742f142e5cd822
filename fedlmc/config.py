"""The one place where experiment configuration is defined and validated.

A *run config* is a flat mapping of hyphenated keys (the same keys as Flower's ``--run-config``
and ``[tool.flwr.app.config]``) to scalars. :data:`RUN_SCHEMA` lists every key with its type,
default and allowed values; :func:`validate_run_config` fills in defaults and rejects anything
else with a :class:`ConfigError` whose one-line message names the key, the value and what is
allowed. Nothing here imports Flower.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fedlmc.data import DATASETS, PARTITION_SCHEMES
from fedlmc.models import MODELS

METHODS = (
    "average",
    "average_t",
    "weight_matching",
    "weight_matching_t",
    "activation_matching",
    "activation_matching_t",
    "merge_many",
    "merge_many_t",
    "ensemble",
    "fedavg",
)
STRATEGIES = ("compare", "average", "aligned", "fedavg")
CALIBRATIONS = ("server", "federated", "none")
FAILURE_MODES = ("raise", "nan", "hang")


class ConfigError(ValueError):
    """A configuration value is invalid; the message is one line naming key, value and what is allowed."""


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
            return f"allowed: none, or MODE:PARTITION-ID[,...] with MODE in {', '.join(FAILURE_MODES)}"
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
    "schedule": Key(str, "onecycle", "learning-rate schedule", _choice("onecycle", "cosine", "constant")),
    "strategy": Key(str, "compare", "server strategy", _choice(*STRATEGIES)),
    "methods": Key(str, "average,average_t,weight_matching,weight_matching_t,ensemble",
                   "merge methods evaluated by the compare strategy", _methods),
    "align": Key(str, "weight", "alignment of the aligned strategy", _choice("weight", "activation")),
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


def validate_run_config(values: Mapping[str, Any], *, check_devices: bool = True) -> dict[str, Any]:
    """Defaults filled in, every value type- and range-checked; raises :class:`ConfigError`."""
    unknown = [k for k in values if k not in RUN_SCHEMA]
    if unknown:
        key = unknown[0]
        raise ConfigError(f"unknown key {key!r}{did_you_mean(key, list(RUN_SCHEMA))}")
    config = {k: spec.default for k, spec in RUN_SCHEMA.items()}
    for key, value in values.items():
        spec = RUN_SCHEMA[key]
        value = coerce(key, value, spec.type)
        problem = spec.check(value) if spec.check else None
        if problem:
            raise ConfigError(f"{key} = {value!r}: {problem}")
        config[key] = value
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
