"""Validation of one run config in one call (:func:`validate_run_config`): defaults, value
checks, then the lists of checks on several keys, on the whole run and on this machine."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fedlmc.simulations.config.checks import (
    check_cuda,
    check_data_source,
    check_dp_cell,
    check_fedavg_rounds,
    check_local_sources,
    check_merge_methods,
    check_min_clients,
    check_model_bias,
    check_model_layout,
    check_partition,
    check_secure_cell,
    check_warmup_rounds,
    check_widths,
)
from fedlmc.simulations.config.data_files import check_data_folder, check_data_root_given
from fedlmc.simulations.config.derived import (
    client_widths,
    method_list,
    mixed_widths,
    server_width,
    widths_text,
)
from fedlmc.simulations.config.feasibility import check_memory
from fedlmc.simulations.config.keys import RUN_KEYS, run_schema
from fedlmc.simulations.config.lewc_calibration import check_lewc_calibration
from fedlmc.simulations.config.run_config import RunConfig
from fedlmc.simulations.config.schema import (
    ConfigError,
    check_value,
    did_you_mean,
)
from fedlmc.simulations.config.values import Mode
from fedlmc.study.method_policy import mixed_width_row


def validate_run_config(
    values: Mapping[str, Any], *, check_devices: bool = True, whole_run: bool = True
) -> RunConfig:
    """Defaults filled in, every value type- and range-checked; raises :class:`ConfigError`.
    ``whole_run = False`` (a client's config for one round, whose ``epochs`` may be one FedAvg
    round's share) skips the checks about the whole run (``fedavg-rounds`` and ``warmup-rounds``
    against ``epochs``). A :class:`RunConfig` validated with at least these checks is returned
    as it is (:meth:`RunConfig.covers`): a run config is validated once, where it enters."""
    if isinstance(values, RunConfig) and values.covers(
        check_devices=check_devices, whole_run=whole_run
    ):
        return values
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
    return RunConfig(config, devices_checked=check_devices, whole_run=whole_run)


def default_methods() -> str:
    """The declared default of ``methods``."""
    return RUN_KEYS["methods"].default


def mixed_width_counterparts(methods: str) -> str:
    """``methods`` with each row's mixed-width counterpart
    (:func:`fedlmc.study.method_policy.mixed_width_row`), rows without one left out:
    ``"average,average_t,ensemble"`` -> ``"embed_average,embed_average_t,ensemble"``."""
    rows = (mixed_width_row(m) for m in method_list({"methods": methods}))
    return ",".join(m for m in rows if m is not None)


def with_cell_default_methods(config: dict[str, Any]) -> dict[str, Any]:
    """Defaults that follow the cell: a ``compare`` run whose clients differ in width
    (:func:`mixed_widths`) and whose ``methods`` is the default gets the mixed-width
    counterparts of the default methods (:func:`mixed_width_counterparts`); an explicit list is
    checked as given (:func:`check_widths`)."""
    if config["strategy"] != Mode.COMPARE or config["methods"] != default_methods():
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
    if config["strategy"] != Mode.COMPARE or config["methods"] != mixed_default:
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


Check = Callable[[Mapping[str, Any]], None]
CONSISTENCY_CHECKS: list[Check] = [
    check_min_clients,
    check_data_source,
    check_data_root_given,
    check_partition,
    check_model_layout,
    check_model_bias,
    check_merge_methods,
    check_widths,
    check_secure_cell,
    check_dp_cell,
    check_lewc_calibration,
]
"""The checks that involve several keys, in order; each raises :class:`ConfigError`. A check
about a new key joins this list (run by :func:`validate_run_config`)."""
WHOLE_RUN_CHECKS: list[Check] = [check_fedavg_rounds, check_warmup_rounds]
"""Checks about the whole run, skipped for a client's one-round config (``whole_run=False``)."""
DEVICE_CHECKS: list[Check] = [check_local_sources, check_data_folder, check_memory, check_cuda]
"""Checks about this machine, skipped with ``check_devices=False``."""
