"""What the ServerApp and the ClientApp share: run config, data, model and seeds.

The run configuration reaches a client in two ways: ``context.run_config`` (filled by ``flwr run``
from ``[tool.flwr.app.config]`` and ``--run-config``) and the entries of the ConfigRecord of each
message (the server forwards its whole validated run config, and strategies override ``epochs``
and ``init``). :func:`client_run_config` overlays the message on the context, keeps the
:func:`fedlmc.simulations.config.run_schema` keys and validates them, so both ways give the same
config (and ``flwr.simulation.run_simulation``, whose contexts carry an empty run config,
works too).

Caches and threads. A process keeps at most 2 loaded data sets and 4 partitionings (LRU, keyed by
every value that determines them), so that a warm Ray actor serving cell after cell of a sweep
loads each once. The sweep engine runs several cells' ServerApps in threads of one process:
data loading is single-flight (one thread loads, the others wait for it), and
:func:`build_from_config` seeds the global RNG and draws the initial weights under one lock,
the only use of the global RNG on the server, so that a cell's numbers do not depend on what
runs beside it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedlmc.data.loading import DataSplits, load_dataset
from fedlmc.data.partition_cache import cached_partition_indices
from fedlmc.data.splits import stratified_split
from fedlmc.evaluation import resolve_device
from fedlmc.models.classifiers import build_model
from fedlmc.simulations.config import (
    RunConfig,
    calibration_holdout,
    cell_id,
    client_widths,
    model_options,
    run_schema,
    server_width,
    validate_run_config,
)
from fedlmc.simulations.config.threads import config_slot_threads
from fedlmc.train import seed_everything

Data = tuple[Tensor, Tensor]

HOLDOUT_STREAM = 1_000_000  # the "round" of the holdout split's seed (no run has that many rounds)
_LOAD_LOCK = threading.RLock()  # one thread loads a data set or partitioning, others wait
_BUILD_LOCK = threading.RLock()  # seeding the global RNG + drawing the initial weights


def schema_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that are run-config keys."""
    schema = run_schema()
    return {k: v for k, v in values.items() if k in schema}


def client_run_config(
    context_config: Mapping[str, Any], message_config: Mapping[str, Any] | None = None
) -> RunConfig:
    """The validated run config a client works with: context, overlaid by the message's entries.
    Validated once per distinct config in a process (cached: every
    message of a run carries the same one), read-only so that the cached copy is shared."""
    values = schema_values(context_config)
    values.update(schema_values(message_config or {}))
    return _validated_client_config(tuple(sorted(values.items())))


@functools.lru_cache(maxsize=32)
def _validated_client_config(items: tuple[tuple[str, Any], ...]) -> RunConfig:
    """:func:`validate_run_config` of a client's config (as sorted items), cached: the
    ClientApp validates each distinct config once, not on every message."""
    return validate_run_config(dict(items), check_devices=False, whole_run=False)


@dataclass(frozen=True)
class ClientSetup:
    """What a ClientApp process needs of one client config, resolved once per distinct config
    (:func:`client_setup`) instead of on every message.

    :param config: The validated client config (:func:`client_run_config`; data, model and
        width helpers read it).
    :param seed: The run's ``seed`` (each client's seeds derive from it, :func:`client_seed`).
    :param init: ``init``: ``"shared"`` starts from the received weights.
    :param timeout: The server's ``timeout`` (a test-only hanging client sleeps past it).
    :param failures: The test-only ``inject-failure`` plan (:func:`failure_plan`).
    :param train: :func:`fedlmc.train.train_model`'s options (:func:`train_options`).
    :param slot_threads: The threads a client slot computes with
        (:func:`fedlmc.simulations.config.threads.config_slot_threads`).
    :param fisher_samples: ``fisher-samples`` (Fisher merging's query).
    :param fisher_labels: ``fisher-labels`` (Fisher merging's query).
    :param regmean_samples: ``regmean-samples`` (RegMean's query).
    """

    config: RunConfig
    seed: int
    init: str
    timeout: float
    failures: Mapping[int, str]
    train: Mapping[str, Any]
    slot_threads: int
    fisher_samples: int
    fisher_labels: str
    regmean_samples: int

    @functools.cached_property
    def cell(self) -> str:
        """The cell's id (:func:`fedlmc.simulations.config.cell_id`): the key of the trained
        model a client keeps for later queries (computed when first asked for)."""
        return cell_id(self.config)


def client_setup(
    context_config: Mapping[str, Any], message_config: Mapping[str, Any] | None = None
) -> ClientSetup:
    """The :class:`ClientSetup` of a client's config (:func:`client_run_config`'s overlay of the
    message on the context), cached per distinct config in a process."""
    values = schema_values(context_config)
    values.update(schema_values(message_config or {}))
    return _client_setup(tuple(sorted(values.items())))


@functools.lru_cache(maxsize=32)
def _client_setup(items: tuple[tuple[str, Any], ...]) -> ClientSetup:
    config = _validated_client_config(items)
    return ClientSetup(
        config=config,
        seed=int(config["seed"]),
        init=str(config["init"]),
        timeout=float(config["timeout"]),
        failures=MappingProxyType(failure_plan(config)),
        train=MappingProxyType(train_options(config)),
        slot_threads=config_slot_threads(config),
        fisher_samples=int(config["fisher-samples"]),
        fisher_labels=str(config["fisher-labels"]),
        regmean_samples=int(config["regmean-samples"]),
    )


def device_of(config: Mapping[str, Any]) -> torch.device:
    """``device = auto`` -> CUDA when available, else CPU; ``cuda`` without a GPU is an error."""
    if config["device"] == "auto":
        return resolve_device(None)
    if config["device"] == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device = 'cuda' but no CUDA GPU is visible on this node")
    return torch.device(config["device"])


def client_seed(seed: int, partition_id: int, server_round: int = 0) -> int:
    """A 31-bit seed for one client (and round), derived from ``(seed, partition_id, round)``."""
    entropy = [int(seed), int(partition_id), int(server_round)]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] % (2**31 - 1))


DataKey = tuple[str, str, float, int, str, str]
"""What determines a loaded data set: dataset, data-root, server-fraction, seed, image-key,
label-key."""


def data_key(config: Mapping[str, Any]) -> DataKey:
    """The :data:`DataKey` of ``config``."""
    return (
        config["dataset"],
        config["data-root"],
        float(config["server-fraction"]),
        int(config["seed"]),
        config["image-key"],
        config["label-key"],
    )


@functools.lru_cache(maxsize=2)
def _splits(key: DataKey) -> DataSplits:
    dataset, root, server_fraction, seed, image_key, label_key = key
    return load_dataset(
        dataset,
        root or None,
        server_fraction=server_fraction,
        seed=seed,
        image_key=image_key or None,
        label_key=label_key or None,
    )


def load_splits(config: Mapping[str, Any]) -> DataSplits:
    """The dataset of ``config``, loaded once per process (while it stays in the cache)."""
    with _LOAD_LOCK:
        return _splits(data_key(config))


@functools.lru_cache(maxsize=4)
def _parts(
    key: DataKey,
    num_partitions: int,
    scheme: str,
    alpha: float,
    classes_per_client: int,
) -> tuple[Data, ...]:
    """The clients' parts of the training pool. Their indices come from the partition cache
    (:mod:`fedlmc.data.partition_cache`): a ClientApp process, one per message a SuperNode
    answers, then reads them instead of importing flwr-datasets (about 3 s) to compute them."""
    x, y = _splits(key).train
    indices = cached_partition_indices(
        y.cpu().numpy(),
        num_partitions,
        scheme,
        alpha=alpha,
        classes_per_client=classes_per_client,
        seed=key[3],
    )
    return tuple((x[i], y[i]) for i in map(torch.from_numpy, indices))


def client_data(config: Mapping[str, Any], partition_id: int, num_partitions: int) -> Data:
    """Partition ``partition_id`` of ``num_partitions`` of the training pool (same split on
    every client: it depends only on the config and ``seed``)."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"partition-id = {partition_id}; allowed: 0 .. {num_partitions - 1} "
            f"(num-partitions = {num_partitions})"
        )
    with _LOAD_LOCK:
        parts = _parts(
            data_key(config),
            int(num_partitions),
            config["partition"],
            float(config["alpha"]),
            int(config["classes-per-client"]),
        )
    return parts[partition_id]


def split_for_calibration(
    config: Mapping[str, Any], data: Data, partition_id: int, share: float
) -> tuple[Data, Data]:
    """``(train, calibration)`` of one client's partition ``data``: a stratified ``share``
    (seeded by ``(seed, partition-id)``) is held out from training for federated calibration;
    with ``share = 0`` both are the whole partition (in-sample calibration). ``ValueError`` when
    the share holds out no example or all of them."""
    if share == 0.0:
        return data, data
    x, y = data
    seed = client_seed(config["seed"], partition_id, server_round=HOLDOUT_STREAM)
    keep, held = (torch.from_numpy(i) for i in stratified_split(y.numpy(), share, seed))
    if len(held) == 0 or len(keep) == 0:
        raise ValueError(
            f"holdout share (calibration-holdout) = {share} of partition {partition_id}'s "
            f"{len(y)} examples holds out {len(held)}; allowed: a share leaving at least one "
            "example on each side"
        )
    return (x[keep], y[keep]), (x[held], y[held])


def _share(config: Mapping[str, Any], holdout: float | None) -> float:
    """``holdout``, or, for ``None``, the share the ServerApp's strategies send the clients of
    the run config ``config`` (:func:`fedlmc.simulations.config.calibration_holdout`)."""
    return calibration_holdout(config) if holdout is None else float(holdout)


def client_train_data(
    config: Mapping[str, Any],
    partition_id: int,
    num_partitions: int,
    holdout: float | None = None,
) -> Data:
    """What a client trains on (and measures BatchNorm/REPAIR statistics and activations on): its
    partition minus the ``holdout`` share (:func:`split_for_calibration`; the ClientApp passes
    the message's ``holdout-share``, ``None`` is the share the ServerApp sends for ``config``)."""
    data = client_data(config, partition_id, num_partitions)
    return split_for_calibration(config, data, partition_id, _share(config, holdout))[0]


def client_calibration_data(
    config: Mapping[str, Any],
    partition_id: int,
    num_partitions: int,
    holdout: float | None = None,
) -> Data:
    """What a client answers temperature queries on: its held-out ``holdout`` share, or its whole
    partition when the share is 0 (:func:`split_for_calibration`; ``holdout`` as in
    :func:`client_train_data`)."""
    data = client_data(config, partition_id, num_partitions)
    return split_for_calibration(config, data, partition_id, _share(config, holdout))[1]


def build_from_config(
    config: Mapping[str, Any],
    splits: DataSplits,
    seed: int | None = None,
    width: float | None = None,
) -> nn.Module:
    """The configured model for ``splits`` (``norm = auto`` = the model's default; the model's
    registered options read from their run-config keys) at ``width`` (default: the server's,
    :func:`~fedlmc.simulations.config.server_width`; a client builds its own,
    :func:`~fedlmc.simulations.config.client_width`); its initial weights are drawn after
    seeding every RNG with ``seed`` (default: the config seed)."""
    options = model_options(config)
    with _BUILD_LOCK:
        seed_everything(config["seed"] if seed is None else seed)
        return build_model(
            config["model"],
            width=server_width(config) if width is None else width,
            num_classes=splits.num_classes,
            in_shape=splits.in_shape,
            norm=None if config["norm"] == "auto" else config["norm"],
            **options,
        )


def client_templates(config: Mapping[str, Any], splits: DataSplits) -> dict[int, nn.Module]:
    """Per partition id, a model at that client's width
    (:func:`~fedlmc.simulations.config.client_widths`; its weights are not used): the arrays the
    server expects from the client, and the architecture its trained weights load into."""
    widths = client_widths(config)
    return {p: build_from_config(config, splits, width=w) for p, w in enumerate(widths)}


def train_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of :func:`fedlmc.train.train_model` taken from the config."""
    return {
        "epochs": config["epochs"],
        "lr": config["lr"],
        "weight_decay": config["weight-decay"],
        "batch_size": config["batch-size"],
        "optimizer": config["optimizer"],
        "momentum": config["momentum"],
        "schedule": config["schedule"],
    }


def failure_plan(config: Mapping[str, Any]) -> dict[int, str]:
    """``inject-failure = "raise:1,nan:2"`` -> ``{1: "raise", 2: "nan"}`` (test-only key)."""
    text = config["inject-failure"]
    if text == "none":
        return {}
    plan = {}
    for item in text.split(","):
        mode, _, pid = item.strip().partition(":")
        plan[int(pid)] = mode
    return plan
