"""The one place where run and sweep configuration is defined and validated.

A *run config* is a flat mapping of hyphenated keys (the same keys as Flower's ``--run-config``
and ``[tool.flwr.app.config]``) to scalars. :func:`run_schema` lists every key with its type,
default and allowed values; the named values (data sets, models and their options, merge
methods) are read from the registries of :mod:`fedlmc.data.catalog`,
:mod:`fedlmc.models.registry` and :mod:`fedlmc.merging.method_registry`, so a registered model or
merge
method is a valid value with no edit here. :func:`validate_run_config` fills in defaults and rejects
anything else with a :class:`ConfigError` whose one-line message names the key, the value and
what is allowed. Nothing here imports Flower, torch, scipy or pandas.
"""

from __future__ import annotations

from fedlmc.simulations.config.cell_identity import (  # noqa: F401
    canonical_cell_id,
    canonical_run_config,
    cell_id,
    experiment_values,
)
from fedlmc.simulations.config.checks import (  # noqa: F401
    HUB_NAME,
    check_cuda,
    check_data_source,
    check_fedavg_rounds,
    check_local_cpus,
    check_local_sources,
    check_merge_methods,
    check_min_clients,
    check_model_bias,
    check_partition,
    check_warmup_rounds,
    check_widths,
    merge_request,
)
from fedlmc.simulations.config.derived import (  # noqa: F401
    absolute_paths,
    align_method,
    calibration_holdout,
    client_pool_size,
    client_width,
    client_widths,
    explicit_server_width,
    federated_calibration,
    method_list,
    mixed_width_methods,
    mixed_widths,
    model_options,
    resolved_bias,
    resolved_norm,
    row_methods,
    selected_methods,
    server_width,
    uses_fedavg,
    widths_text,
)
from fedlmc.simulations.config.feasibility import (  # noqa: F401
    IN_SHAPES,
    MEMORY_FACTOR_CLIENT,
    check_memory,
    machine_memory,
    memory_check_note,
    memory_estimate,
    model_parameters,
    width_key,
)
from fedlmc.simulations.config.keys import (  # noqa: F401
    MODEL_OPTIONS_AFTER,
    RUN_KEYS,
    declared_keys,
    run_schema,
    runtime_keys,
)
from fedlmc.simulations.config.run_config import RunConfig  # noqa: F401
from fedlmc.simulations.config.schema import ConfigError  # noqa: F401
from fedlmc.simulations.config.sweep_file import (  # noqa: F401
    HUGE_INTEGER,
    LINK,
    MAX_CELLS,
    MAX_NAME,
    NAME_PATTERN,
    NOT_SWEEPABLE,
    SWEEP_KEYS,
    SWEEP_TABLES,
    TOML_KEY,
    SweepConfig,
    apply_override,
    axis_keys,
    client_epochs,
    expand_grid,
    grid_points,
    huge_integer,
    load_sweep_config,
    parse_override,
    product_points,
    read_toml,
    sweep_from_mapping,
    unique_cells,
)
from fedlmc.simulations.config.validate import (  # noqa: F401
    CONSISTENCY_CHECKS,
    DEVICE_CHECKS,
    WHOLE_RUN_CHECKS,
    Check,
    cell_default_methods_note,
    check_consistency,
    default_methods,
    mixed_width_counterparts,
    validate_run_config,
    with_cell_default_methods,
)
from fedlmc.simulations.config.values import (  # noqa: F401
    BIAS_VALUES,
    DEFAULT_MAX_SHARE,
    DEFAULT_OUTLIER_FACTOR,
    FAILURE_MODES,
    FEDAVG,
    INITS,
    MAX_LAMBDAS,
    ONE_SHOT_MODES,
    STRATEGIES,
    Mode,
    aligning_methods,
    cell_methods,
    dataset_names,
    option_key,
    parse_widths,
    server_split_share,
)

__all__ = [
    "ConfigError",
    "RunConfig",
    "SweepConfig",
    "canonical_cell_id",
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
