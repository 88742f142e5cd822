"""The key table: every run-config key declared once (:data:`RUN_KEYS`), with the model options'
keys from the model registry (:func:`run_schema`)."""

from __future__ import annotations

from fedlmc.data.catalog import (
    PARTITION_SCHEMES,
)
from fedlmc.merging.baselines.baselines import CCA_RIDGE
from fedlmc.merging.builtin_methods import AUTO_TOLERANCE
from fedlmc.merging.post_merge import CALIBRATIONS
from fedlmc.merging.robust.rules import KRUM_BYZANTINE, KRUM_SELECT, TRIM_FRACTION
from fedlmc.models.registry import (
    NORMS,
    model_names,
)
from fedlmc.simulations.config.defences import CLIENT_CHECK_VALUES, trim_fraction_check, uses_krum
from fedlmc.simulations.config.derived import (
    explicit_server_width,
    federated_calibration,
    resolved_bias,
    selected_methods,
    uses_fedavg,
)
from fedlmc.simulations.config.dp import DP_MODES, DP_OFF, is_dp
from fedlmc.simulations.config.field_keys import field_method_keys
from fedlmc.simulations.config.schema import (
    MAX_INT,
    Key,
    Rule,
    choice,
    fraction,
    integers,
    named,
    numbers,
)
from fedlmc.simulations.config.secure import SECURE_MODES, SECURE_OFF, is_secure
from fedlmc.simulations.config.values import (
    AT_MOST_CLIENTS,
    BIAS_VALUES,
    CLIENTS_WHY,
    CPUS_WHY,
    DEFAULT_MAX_SHARE,
    DEFAULT_OUTLIER_FACTOR,
    EPOCHS_WHY,
    EXAMPLES_WHY,
    INITS,
    MAX_CLIENTS,
    MAX_CPUS,
    MAX_EPOCHS,
    MAX_EXAMPLES,
    MAX_WIDTH,
    ONE_SHOT_MODES,
    RAY_RESOURCE_UNIT,
    SECAGG_MAX_RANGE,
    SECAGG_WHY,
    STRATEGIES,
    WIDTH_RANGE,
    Mode,
    _align,
    _dataset,
    _failures,
    _lambdas,
    _methods,
    _model,
    _model_option_keys,
    _plain_path,
    _share,
    _strategy_is,
    _widths_list,
    aligning_methods,
    cell_methods,
    dataset_names,
    ray_precision,
    server_split_share,
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
            WIDTH_RANGE,
            applies=Rule("`client-widths` is empty", lambda c: not c["client-widths"]),
        ),
        "client-widths": Key(
            str,
            "",
            "one width multiplier per client, in partition order, e.g. '0.5,1,2,4' (empty: "
            "every client uses width); as many as num-clients",
            _widths_list,
            comma_list=True,
        ),
        "server-width": Key(
            float,
            0.0,
            "width of the merged model: at least the widest client's (0: the widest client's)",
            numbers(0.0, MAX_WIDTH, WIDTH_RANGE.why),
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
        "num-clients": Key(int, 2, "number of clients", integers(2, MAX_CLIENTS, CLIENTS_WHY)),
        "partition": named(
            str, "iid", "partition scheme (full: every client the whole pool)", PARTITION_SCHEMES
        ),
        "alpha": Key(
            float,
            0.5,
            "Dirichlet concentration",
            numbers(0.0, 10_000, "beyond 100 a Dirichlet split is already iid", low_open=True),
            applies=Rule('`partition = "dirichlet"`', lambda c: c["partition"] == "dirichlet"),
        ),
        "classes-per-client": Key(
            int,
            2,
            "classes per client (pathological, shard)",
            integers(1, MAX_CLIENTS, "a client's classes or shards: at most its examples"),
            applies=Rule(
                '`partition` is `"pathological"` or `"shard"`',
                lambda c: c["partition"] in ("pathological", "shard"),
            ),
        ),
        "epochs": Key(int, 10, "local epochs per client", integers(1, MAX_EPOCHS, EPOCHS_WHY)),
        "lr": Key(
            float,
            0.05,
            "peak learning rate",
            numbers(0.0, 10.0, "a larger step diverges with every optimizer", low_open=True),
        ),
        "weight-decay": Key(
            float, 3e-3, "weight decay", numbers(0.0, 1.0, "ten times AdamW's usual 0.1")
        ),
        "batch-size": Key(int, 128, "batch size", integers(1, MAX_EXAMPLES, EXAMPLES_WHY)),
        "optimizer": named(str, "sgd", "optimizer", ("sgd", "adam", "adamw")),
        "momentum": Key(float, 0.9, "SGD momentum", fraction),
        "schedule": named(
            str, "onecycle", "learning-rate schedule", ("onecycle", "cosine", "constant")
        ),
        "strategy": named(
            str,
            Mode.COMPARE.value,
            "server strategy (not a merge method: `average` / `fedavg` here run the "
            "OneShotAverage / FedAvgBaseline strategies; as `methods` entries they are rows "
            "of `compare`)",
            STRATEGIES,
        ),
        "methods": Key(
            str,
            "average,average_t,weight_matching,weight_matching_t,ensemble,ensemble_equal,"
            "ensemble_calibrated",
            "rows evaluated by the compare strategy (comma-separated); left at the default, "
            "clients of different widths get its mixed-width counterparts (embed_average, ...)",
            _methods,
            cell_methods,
            comma_list=True,
            applies=_strategy_is(Mode.COMPARE),
        ),
        "align": Key(
            str,
            "weight_matching",
            "merge method of the aligned strategy",
            _align,
            aligning_methods,
            applies=_strategy_is(Mode.ALIGNED),
        ),
        "auto-tolerance": Key(
            float,
            AUTO_TOLERANCE,
            "nats: the auto method keeps the plain average within this calibrated-NLL gap",
            numbers(0.0, 100.0, "an NLL gap is at most ln(classes), 4.6 for 100 classes"),
            applies=Rule("the `auto` method runs", lambda c: "auto" in selected_methods(c)),
        ),
        "cca-ridge": Key(
            float,
            CCA_RIDGE,
            "CCA Merge's ridge on the activation covariances, relative to their mean variance",
            numbers(0.0, 1000.0, "1000 x the mean variance already drowns the covariances"),
            applies=Rule(
                "the `cca_merge` method runs", lambda c: "cca_merge" in selected_methods(c)
            ),
        ),
        "trim-fraction": Key(
            float,
            TRIM_FRACTION,
            "trimmed_mean: share of the clients dropped at each end of every coordinate "
            "(floor(trim-fraction x clients); Flower's FedTrimmedAvg beta)",
            trim_fraction_check,
            applies=Rule(
                "the `trimmed_mean` method runs", lambda c: "trimmed_mean" in selected_methods(c)
            ),
        ),
        "krum-byzantine": Key(
            int,
            KRUM_BYZANTINE,
            "krum, multi_krum: the Byzantine clients f assumed (each score sums the clients - f "
            "- 2 nearest; needs min-clients >= 2f + 3; Flower's num_malicious_nodes)",
            integers(0, (MAX_CLIENTS - 3) // 2, f"2f + 3 clients, at most {MAX_CLIENTS}"),
            applies=Rule("`krum` or `multi_krum` runs", lambda c: uses_krum(c)),
        ),
        "krum-select": Key(
            int,
            KRUM_SELECT,
            "multi_krum: the clients m of the lowest Krum scores averaged (1: Krum; Flower's "
            "num_nodes_to_select)",
            integers(1, MAX_CLIENTS, AT_MOST_CLIENTS),
            applies=Rule(
                "the `multi_krum` method runs", lambda c: "multi_krum" in selected_methods(c)
            ),
        ),
        **field_method_keys(),
        "calibration": named(
            str,
            "server",
            "temperature calibration of the average/aligned strategies (lewc: no data, T "
            "= sum_i w_i^L predicted from the depth and the clients' weights)",
            CALIBRATIONS,
            applies=_strategy_is(*ONE_SHOT_MODES),
        ),
        "calibration-holdout": Key(
            float,
            0.1,
            "share of each client's partition held out from training for calibration = federated "
            "(0: calibrate in-sample on the training data)",
            fraction,
            applies=Rule(
                f'`calibration = "federated"` with `strategy` `"{Mode.AVERAGE}"` or '
                f'`"{Mode.ALIGNED}"`',
                lambda c: federated_calibration(c),
            ),
        ),
        "secure-aggregation": named(
            str,
            SECURE_OFF,
            "secure aggregation of the one-shot merge: off (every client's weights reach the "
            "server), or secagg+ (Flower's SecAgg+: the server sees only their weighted sum; "
            "strategy = average, or aligned with align = average_lewc_bias (the clients "
            "pre-scale their biases), embed_average (they embed their widths first) or heterofl "
            "(they also send their holder masks: about twice the bytes))",
            SECURE_MODES,
        ),
        "secagg-clipping-range": Key(
            float,
            0.0,
            "SecAgg+ clipping range c: every trained weight must lie in [-c, c] (0: the "
            "smallest power of two >= 4x the initial model's largest |weight|, at least 8)",
            numbers(0.0, SECAGG_MAX_RANGE, SECAGG_WHY),
            applies=Rule('`secure-aggregation = "secagg+"`', lambda c: is_secure(c)),
        ),
        "dp": named(
            str,
            DP_OFF,
            "differential privacy of the one-shot average: off, server-fixed (Flower's "
            "server-side fixed clipping of each update to dp-clipping-norm, then Gaussian noise "
            "of std dp-noise-multiplier * dp-clipping-norm / num-clients on the average), or "
            "client-fixed (each client clips its own update: Flower's fixedclipping_mod)",
            DP_MODES,
        ),
        "dp-noise-multiplier": Key(
            float,
            1.0,
            "DP noise multiplier z: the noise's std is z * dp-clipping-norm / num-clients",
            numbers(0.0, 1000.0, "published multipliers are at most about 10"),
            applies=Rule('`dp` is not `"off"`', lambda c: is_dp(c)),
        ),
        "dp-clipping-norm": Key(
            float,
            10.0,
            "DP clipping norm C: each client's update from the server's arrays is scaled to "
            "L2 norm at most C",
            numbers(0.0, 1e6, "an update of norm 10^6 is a diverged model", low_open=True),
            applies=Rule('`dp` is not `"off"`', lambda c: is_dp(c)),
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
            integers(1, MAX_EPOCHS, "each round trains at least one of the epochs"),
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
            integers(0, MAX_EPOCHS - 1, "fewer than the epochs"),
            applies=_strategy_is(Mode.COMPARE, *ONE_SHOT_MODES),
        ),
        "lambdas": Key(
            int,
            25,
            "points on the interpolation grid (compare); every point costs a full evaluation",
            _lambdas,
            applies=_strategy_is(Mode.COMPARE),
        ),
        "diagnostics": Key(
            bool,
            True,
            "compute LEWC and orthogonality diagnostics (compare)",
            applies=_strategy_is(Mode.COMPARE),
        ),
        "seed": Key(int, 0, "seed", integers(0, MAX_INT, "a 64-bit TOML integer")),
        "device": named(str, "auto", "training device", ("auto", "cpu", "cuda"), runtime=True),
        "num-cpus": Key(
            float,
            1.0,
            "CPUs per simulated client; its threads: max(1, floor(num-cpus))",
            numbers(RAY_RESOURCE_UNIT, MAX_CPUS, CPUS_WHY),
            runtime=True,
        ),
        "num-gpus": Key(
            float,
            0.0,
            "GPUs per simulated client",
            numbers(0.0, 64.0, "more GPUs than one machine holds", also=ray_precision),
            runtime=True,
        ),
        "server-cpus": Key(
            float,
            0.0,
            "threads of the server's merges and evaluations (0: the cores the client slots "
            "leave, at least 1)",
            numbers(0.0, MAX_CPUS, CPUS_WHY),
            runtime=True,
        ),
        "min-clients": Key(
            int,
            2,
            "fewest surviving clients a merge accepts",
            integers(1, MAX_CLIENTS, AT_MOST_CLIENTS),
        ),
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
            numbers(1.0, 1e300, "1e300 turns the screen off", low_open=True),
            runtime=True,
        ),
        "client-check": named(
            str,
            "auto",
            "each client's model checked before the merge: server-split (a copy of another "
            "client's model, and, where the server holds data and 3+ clients survive, an "
            "accuracy on the server split below chance and far below the others'), copies "
            "(only copies), off; auto: server-split for iid and full partitions, copies for "
            "the others",
            CLIENT_CHECK_VALUES,
            runtime=True,
        ),
        "timeout": Key(
            float,
            600.0,
            "seconds to wait for clients",
            numbers(0.0, 604_800.0, "one week", low_open=True),
            runtime=True,
        ),
        "inject-failure": Key(str, "none", "test-only failure injection", _failures),
        "out-dir": Key(
            str, "", "folder for results.csv and merged weights", _plain_path, runtime=True
        ),
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
