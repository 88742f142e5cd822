"""The fedlmc ClientApp (Flower Message API).

Message types it answers:

- ``train``: trains the configured model on this node's partition: ``partition-id`` of
  ``num-partitions`` from the message's ConfigRecords when it carries them (the sweep engine,
  :mod:`fedlmc.simulations.engine.cells`, sends each cell's own), else from ``context.node_config``
  (a deployment's ``--node-config``, a plain simulation); the same split on every node. With ``init
  = "independent"`` (the paper's setting) the initial weights are drawn with a seed derived from
  ``(seed, partition-id)`` and the received arrays are ignored; with ``init = "shared"`` the
  received arrays (the server's initialisation; FedAvg: the global model) are loaded, sliced to
  the client's width when it is narrower than the server's (nested sub-models, HeteroFL). Every
  client builds its own width (``client-widths``: one per partition; else ``width``). The
  protocol keys of the message (:mod:`fedlmc.strategies.protocol`), never the run config, say
  what to hold out and keep: a stratified ``holdout-share`` of the partition is held out and
  never trained on (:func:`fedlmc.simulations.task.split_for_calibration`), and with
  ``keep-model`` the trained weights are kept for the queries about them. Replies with an
  ArrayRecord of the trained weights and a MetricRecord ``num-examples, partition-id,
  train-loss, train-accuracy, train-seconds, load-seconds`` (data loading and model building),
  ``torch-threads, pool-threads`` (the threads it computed with: torch's, and the largest BLAS
  / OpenMP pool's), and the per-epoch history as float lists ``epoch-train-loss,
  epoch-train-accuracy`` plus, when it holds out a calibration share, ``epoch-calibration-loss``
  (the loss on that share after each epoch, :func:`fedlmc.train.train_model`'s ``held_out``;
  :data:`fedlmc.strategies.protocol.HISTORY_KEYS`). Any failure (exception, non-finite loss,
  non-finite weights) gives an error reply, never weights.
- ``query.temperature``: sums of the NLL and its first two derivatives in ``log T`` of the
  received (merged) model, or of each of several received models, at each ``log-t`` the
  server sends (one value or a list), on the held-out share (on the training data when the
  query's ``holdout-share`` is 0 or absent).
- ``query.bn_stats``: per-BatchNorm-layer sums, sums of squares and counts of the layer inputs
  on the training data.
- ``query.unit_stats``: per-unit sums, sums of squares and counts of the outputs of the
  ``layers`` the server names (REPAIR), on the training data.
- ``query.align``: client-side activation matching: the permutations matching this node's own
  trained model (kept in ``context.state`` since its train round) to the received reference
  model by activation correlation on its training data, and the digest of those weights.
- ``query.fisher`` (Fisher merging) / ``query.gram`` (RegMean): the diagonal empirical Fisher
  of this node's own kept model, or the Gram matrices of the named ``layers``' inputs, on at
  most ``fisher-samples`` / ``regmean-samples`` of its training examples (a subset seeded by
  ``(seed, partition-id)``), and the digest of those weights.
- ``evaluate``: loss and accuracy of the received model on this node's data.

Every message is answered with the slot's ``max(1, floor(num-cpus))`` threads, whatever the
environment's ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` say
(:mod:`fedlmc.simulations.config.threads`; on a SuperNode, set ``num-cpus`` to the cores the node
gives its ClientApp).

Nothing is kept between messages but the data and, only for client-side activation matching, the
trained weights: the loaded data sets and partitions stay in bounded caches of
:mod:`fedlmc.simulations.task` (keyed by what determines them), so that a warm actor serving cell
after cell loads each data set once; the trained weights stay in the node's ``context.state``
(Flower keeps it per node and run between messages, in simulation and on a SuperNode) under a key
naming the cell and partition, at most :data:`KEPT_MODELS` of them, each removed by the query that
uses it when the message says ``keep-model = "one-query"`` (one merge; with ``several-queries``, a
``compare`` cell's, it stays for its other methods' queries). The model is rebuilt for every
message and every seed is derived from ``(seed, partition-id, round)``, so a reply does not depend
on what the actor ran before.

Imports: the module loads Flower and fedlmc's configuration and protocol only; each handler
imports what its message needs (torch and the data for training and the queries, numba for
client-side matching, SciPy for the temperature). A SuperNode answers every message in a fresh
``flwr-clientapp`` process that loads this module, so SecAgg+'s setup, key-sharing and
unmasking stages start without torch, and the other messages without what they do not use.

Test-only failure injection (run-config ``inject-failure = "MODE:PARTITION-ID,..."``): ``raise``
raises before training, ``nan`` replies with NaN weights (skipping the finite check), ``hang``
sleeps until ``HANG_MARGIN`` seconds past the server's deadline (the message's ``created_at`` plus
``timeout``; a bounded sleep, so Flower's engine, which waits for running ClientApps before it
stops Ray, ends soon after the round) and then raises instead of training.
"""

from __future__ import annotations

import math
import os
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flwr.app import ArrayRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp

from fedlmc.simulations.config import client_width
from fedlmc.simulations.config.threads import pool_threads, use_threads
from fedlmc.simulations.private.dp_client import dp_clipping_mod
from fedlmc.simulations.private.secure_client import secure_train_mod
from fedlmc.simulations.records.console_logs import quiet_client_actor
from fedlmc.strategies.protocol import (
    ALIGN_QUERY,
    BN_QUERY,
    ERROR_QUERY_FAILED,
    ERROR_TRAIN_FAILED,
    FISHER_QUERY,
    GRAM_QUERY,
    KEEP_ONE_QUERY,
    MODEL_PREFIX,
    NUM_PARTITIONS_KEY,
    PARTITION_KEY,
    SERVER_ROUND_KEY,
    TEMPERATURE_QUERY,
    UNIT_STATS_QUERY,
    bn_stats_to_content,
    history_metrics,
    holdout_share,
    keep_model,
    metric_record,
    permutations_to_content,
    query_models,
    record_to_state,
    state_digest,
    state_to_record,
    statistics_to_content,
    temperature_stats_to_content,
    unit_stats_to_content,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fedlmc.simulations.task import ClientSetup

quiet_client_actor()  # in each client actor: no "Manually terminating", no colour into a file
app = ClientApp()

HANG_MARGIN = 2.0  # seconds a hanging client (test-only) sleeps past the server's deadline
KEPT_MODELS = 8  # trained models a node keeps in context.state at most (oldest dropped first)
KEPT_PREFIX = "fedlmc-trained/"


class InjectedFailure(RuntimeError):
    """Raised by a client told to fail (test-only ``inject-failure``)."""


# ----------------------------------------------------------------------------- helpers


def _message_config(message: Message) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for record in message.content.config_records.values():
        config.update(record)
    return config


def _partition(message: Message, context: Context) -> tuple[int, int]:
    """``(partition-id, num-partitions)``: the message's (sweep engine), else the node's."""
    sent = _message_config(message)
    if PARTITION_KEY in sent and NUM_PARTITIONS_KEY in sent:
        return int(sent[PARTITION_KEY]), int(sent[NUM_PARTITIONS_KEY])
    node = context.node_config
    if PARTITION_KEY not in node or NUM_PARTITIONS_KEY not in node:
        raise ValueError(
            "node config needs partition-id and num-partitions "
            "(flower-supernode --node-config 'partition-id=0 num-partitions=2')"
        )
    return int(node[PARTITION_KEY]), int(node[NUM_PARTITIONS_KEY])


def _partition_label(message: Message, context: Context) -> Any:
    """The partition id named in error replies (``"?"`` when it cannot be read)."""
    try:
        return _partition(message, context)[0]
    except (ValueError, TypeError):
        return context.node_config.get(PARTITION_KEY, "?")


def _model_from(config: dict, record: ArrayRecord) -> nn.Module:
    """The configured model with the weights of ``record``, on the config's device, eval mode."""
    from fedlmc.simulations.task import build_from_config, device_of, load_splits

    model = build_from_config(config, load_splits(config))
    model.load_state_dict(record_to_state(record), strict=True)
    return model.to(device_of(config)).eval()


def use_slot_threads(message: Message, context: Context) -> int:
    """Compute with this client slot's ``max(1, floor(num-cpus))`` threads (torch and the BLAS
    pools, :mod:`fedlmc.simulations.config.threads`), whatever the environment's thread variables
    say."""
    from fedlmc.simulations.task import client_setup

    count = client_setup(context.run_config, _message_config(message)).slot_threads
    use_threads(count)
    return count


def _non_finite_key(state: dict[str, torch.Tensor]) -> str | None:
    import torch

    for key, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return key
    return None


def _guarded(code: int, handler: Callable[[Message, Context], Message]) -> Callable:
    """Turn any exception of ``handler`` into an error reply naming the partition."""

    def run(message: Message, context: Context) -> Message:
        try:
            use_slot_threads(message, context)
            return handler(message, context)
        except Exception as err:  # noqa: BLE001 - every failure must become an error reply
            pid = _partition_label(message, context)
            reason = f"partition-id={pid}: {type(err).__name__}: {err}"
            detail = traceback.format_exc(limit=3)
            return Message(Error(code=code, reason=f"{reason}\n{detail}"), reply_to=message)

    run.__name__ = handler.__name__
    run.__doc__ = handler.__doc__
    return run


# ----------------------------------------------------------------------------- train


def _initial_model(setup: ClientSetup, splits, pid: int, message: Message) -> nn.Module:
    """The per-client seeded initialisation at this client's width, or, when ``init = shared``,
    the received weights (:func:`shared_start`)."""
    from fedlmc.simulations.task import build_from_config, client_seed

    config, seed = setup.config, client_seed(setup.seed, pid)
    model = build_from_config(config, splits, seed=seed, width=client_width(config, pid))
    if setup.init == "shared":
        record = next(iter(message.content.array_records.values()))
        model.load_state_dict(shared_start(record_to_state(record), model), strict=True)
    return model


def shared_start(received: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """What an ``init = shared`` client starts from: the received weights (the server's
    initialisation at the server width, seeded by the cell's seed; in FedAvg's later rounds the
    global model), sliced to ``model``'s width when it is narrower (HeteroFL's nested sub-model:
    every hidden group's first units, :func:`fedlmc.permutation.embed.slice_state`)."""
    from fedlmc.permutation.embed import slice_state

    own = model.state_dict()
    if all(tuple(received[k].shape) == tuple(v.shape) for k, v in own.items() if k in received):
        return received
    return slice_state(received, model, "first")


def _checked_weights(model: nn.Module, poison: bool) -> dict[str, torch.Tensor]:
    """CPU weights after training; raises on non-finite ones (``poison`` = test-only NaN reply)."""
    import torch

    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if poison:
        return {
            k: torch.full_like(v, math.nan) if v.is_floating_point() else v
            for k, v in state.items()
        }
    if (bad := _non_finite_key(state)) is not None:
        raise FloatingPointError(f"non-finite weights in {bad!r} after training")
    return state


def _hang_past_deadline(message: Message, timeout: float) -> None:
    """Sleep until ``HANG_MARGIN`` s past ``created_at + timeout`` (``timeout + margin`` max)."""
    deadline = float(message.metadata.created_at) + timeout + HANG_MARGIN
    time.sleep(min(max(deadline - time.time(), 0.0), timeout + HANG_MARGIN))


def train_reply(message: Message, context: Context) -> Message:
    """Train on this node's partition and reply with the weights and training metrics."""
    import torch

    from fedlmc.simulations.task import (
        client_calibration_data,
        client_seed,
        client_setup,
        client_train_data,
        device_of,
        load_splits,
    )
    from fedlmc.train import train_model

    setup = client_setup(context.run_config, _message_config(message))
    config = setup.config
    pid, num_partitions = _partition(message, context)
    mode = setup.failures.get(pid)
    if mode == "raise":
        raise InjectedFailure(f"injected failure on partition {pid}")
    if mode == "hang":
        _hang_past_deadline(message, setup.timeout)
        raise InjectedFailure(f"injected hang on partition {pid} (replying after the timeout)")
    if mode == "exit":  # the process dies, as one the kernel's OOM killer ends
        os._exit(1)
    sent = _message_config(message)
    server_round = int(sent.get(SERVER_ROUND_KEY, 1))
    share = holdout_share(sent)
    start = time.perf_counter()
    splits = load_splits(config)
    data = client_train_data(config, pid, num_partitions, share)
    held_out = None
    if share > 0:  # its loss after every epoch (the reply's history)
        held_out = client_calibration_data(config, pid, num_partitions, share)
    model = _initial_model(setup, splits, pid, message)
    load_seconds = time.perf_counter() - start
    model, history = train_model(
        model,
        data,
        **setup.train,
        seed=client_seed(setup.seed, pid, server_round),
        device=device_of(config),
        augment=splits.augment,
        held_out=held_out,
    )
    metrics = {
        "num-examples": int(len(data[1])),
        "partition-id": pid,
        "train-loss": float(history.loss[-1]),
        "train-accuracy": float(history.accuracy[-1]),
        "train-seconds": float(history.seconds),
        "load-seconds": float(load_seconds),
        "torch-threads": int(torch.get_num_threads()),
        "pool-threads": int(pool_threads()),
    }
    arrays = state_to_record(_checked_weights(model, poison=mode == "nan"))
    if keep_model(sent) is not None:
        keep_trained_model(context, _kept_key(setup, pid, num_partitions), arrays)
    record = metric_record(metrics)
    for key, values in history_metrics(
        history.loss, history.accuracy, history.held_out_loss
    ).items():
        record[key] = values
    content = RecordDict({"arrays": arrays, "metrics": record})
    return Message(content, reply_to=message)


def _kept_key(setup: ClientSetup, pid: int, num_partitions: int) -> str:
    """The ``context.state`` key of a cell's trained model on this node."""
    return f"{KEPT_PREFIX}{setup.cell}/{pid}-of-{num_partitions}"


def keep_trained_model(context: Context, key: str, arrays: ArrayRecord) -> None:
    """Store ``arrays`` under ``key`` in ``context.state``, dropping the oldest kept models
    beyond :data:`KEPT_MODELS`."""
    kept = [k for k in context.state.array_records if k.startswith(KEPT_PREFIX) and k != key]
    for old in kept[: max(len(kept) - (KEPT_MODELS - 1), 0)]:
        del context.state[old]
    context.state[key] = arrays


# ----------------------------------------------------------------------------- queries


def _received_model_and_setup(message: Message, context: Context):
    from fedlmc.simulations.task import client_setup

    setup = client_setup(context.run_config, _message_config(message))
    pid, num_partitions = _partition(message, context)
    model = _model_from(setup.config, query_models(message.content)[0])
    return setup, pid, num_partitions, model


def _train_data(message: Message, config: dict, pid: int, num_partitions: int):
    """This node's training data: its partition minus the message's ``holdout-share``."""
    from fedlmc.simulations.task import client_train_data

    return client_train_data(config, pid, num_partitions, holdout_share(_message_config(message)))


def temperature_reply(message: Message, context: Context) -> Message:
    """NLL sums and derivatives in log T of the received model (or of each received model) on
    this node's calibration data (the query's ``holdout-share``; its training data when that
    is 0 or absent)."""
    from fedlmc.evaluation import predict_logits
    from fedlmc.merging.calibrate import temperature_statistics
    from fedlmc.simulations.task import client_calibration_data, client_setup

    config = client_setup(context.run_config, _message_config(message)).config
    pid, num_partitions = _partition(message, context)
    share = holdout_share(_message_config(message))
    x, y = client_calibration_data(config, pid, num_partitions, share)
    points = _message_config(message)["log-t"]
    points = points if isinstance(points, list) else [points]
    per_model = []
    for record in query_models(message.content):
        logits = predict_logits(_model_from(config, record), x)
        per_model.append([temperature_statistics(logits, y, float(u)) for u in points])
    several = MODEL_PREFIX + "0" in message.content.array_records
    stats = per_model if several else per_model[0]
    content = temperature_stats_to_content(stats, {"partition-id": pid}, per_model=several)
    return Message(content, reply_to=message)


def bn_stats_reply(message: Message, context: Context) -> Message:
    """Per-layer BatchNorm input moments of the received model on this node's training data."""
    from fedlmc.merging.calibrate import bn_statistics

    setup, pid, num_partitions, model = _received_model_and_setup(message, context)
    x, _ = _train_data(message, setup.config, pid, num_partitions)
    stats = bn_statistics(model, x)
    return Message(bn_stats_to_content(stats, {"partition-id": pid}), reply_to=message)


def unit_stats_reply(message: Message, context: Context) -> Message:
    """Per-unit output moments of the requested ``layers`` of the received model on this node's
    training data (REPAIR, :func:`fedlmc.merging.repair.unit_statistics`)."""
    from fedlmc.merging.repair import unit_statistics

    setup, pid, num_partitions, model = _received_model_and_setup(message, context)
    layers = _message_config(message)["layers"]
    x, _ = _train_data(message, setup.config, pid, num_partitions)
    stats = unit_statistics(model, x, layers if isinstance(layers, list) else [layers])
    return Message(unit_stats_to_content(stats, {"partition-id": pid}), reply_to=message)


def _kept_record(
    context: Context, setup: ClientSetup, pid: int, num_partitions: int
) -> ArrayRecord:
    """This node's trained model of the cell, kept since its train round."""
    key = _kept_key(setup, pid, num_partitions)
    if key not in context.state.array_records:
        raise LookupError(
            f"no trained model of this cell kept on this node (key {key!r}); was the node "
            "restarted between the train and query rounds?"
        )
    return context.state.array_records[key]


def _release_kept(
    message: Message, context: Context, setup: ClientSetup, pid: int, num_partitions: int
) -> None:
    """Remove the kept model after its query when the message says ``keep-model =
    "one-query"`` (one merge); ``several-queries`` keeps it for the study's other queries."""
    if keep_model(_message_config(message)) == KEEP_ONE_QUERY:
        del context.state[_kept_key(setup, pid, num_partitions)]


def align_reply(message: Message, context: Context) -> Message:
    """Client-side activation matching: this node's trained model (kept since its train round)
    matched to the received reference by activation correlation on its training data
    (:func:`fedlmc.permutation.matching.activation_matching`); replies with the permutations and the
    digest of the weights they permute."""
    from fedlmc.permutation.matching import activation_matching
    from fedlmc.simulations.task import client_seed

    setup, pid, num_partitions, reference = _received_model_and_setup(message, context)
    kept = _kept_record(context, setup, pid, num_partitions)
    own = _model_from(setup.config, kept)
    x, _ = _train_data(message, setup.config, pid, num_partitions)
    perms = activation_matching(reference, own, x, seed=client_seed(setup.seed, pid))
    content = permutations_to_content(
        dict(perms),
        state_digest(record_to_state(kept)),
        {"partition-id": pid, "num-examples": len(x)},
    )
    _release_kept(message, context, setup, pid, num_partitions)
    return Message(content, reply_to=message)


def statistics_reply(message: Message, context: Context) -> Message:
    """``query.fisher`` / ``query.gram``: the diagonal Fisher of this node's kept model, or the
    Gram matrices of the requested ``layers``' inputs, on a bounded seeded sample of its
    training data (:func:`fedlmc.merging.field.fisher.fisher_diagonal`,
    :func:`fedlmc.merging.field.regmean.gram_matrices`), with the digest of those weights."""
    from fedlmc.merging.field.fisher import bounded_sample, fisher_diagonal, statistics_seed
    from fedlmc.merging.field.regmean import gram_matrices
    from fedlmc.simulations.task import client_setup

    setup = client_setup(context.run_config, _message_config(message))
    pid, num_partitions = _partition(message, context)
    kept = _kept_record(context, setup, pid, num_partitions)
    own = _model_from(setup.config, kept)
    x, y = _train_data(message, setup.config, pid, num_partitions)
    seed = statistics_seed(setup.seed, pid)
    if message.metadata.message_type.rsplit(".", 1)[-1] == FISHER_QUERY:
        xs, ys = bounded_sample(x, y, setup.fisher_samples, seed)
        found = fisher_diagonal(own, xs, ys, labels=setup.fisher_labels, seed=seed)
    else:
        layers = _message_config(message)["layers"]
        xs, _ = bounded_sample(x, None, setup.regmean_samples, seed)
        found = gram_matrices(own, xs, layers if isinstance(layers, list) else [layers])
    digest = state_digest(record_to_state(kept))
    content = statistics_to_content(found, digest, {"partition-id": pid, "num-examples": len(xs)})
    _release_kept(message, context, setup, pid, num_partitions)
    return Message(content, reply_to=message)


def evaluate_reply(message: Message, context: Context) -> Message:
    """Loss and accuracy of the received model on this node's data."""
    import torch
    import torch.nn.functional as F

    from fedlmc.evaluation import predict_logits
    from fedlmc.simulations.task import client_data

    setup, pid, num_partitions, model = _received_model_and_setup(message, context)
    x, y = client_data(setup.config, pid, num_partitions)
    with torch.no_grad():
        logits = predict_logits(model, x)
    metrics = metric_record(
        {
            "num-examples": int(len(y)),
            "partition-id": pid,
            "eval-loss": float(F.cross_entropy(logits, y)),
            "eval-accuracy": float((logits.argmax(1) == y).float().mean()),
        }
    )
    return Message(RecordDict({"metrics": metrics}), reply_to=message)


secure = secure_train_mod(train_reply, use_slot_threads)  # SecAgg+ rounds (secure-aggregation)
app.train(mods=[secure, dp_clipping_mod])(_guarded(ERROR_TRAIN_FAILED, train_reply))
app.query(TEMPERATURE_QUERY)(_guarded(ERROR_QUERY_FAILED, temperature_reply))
app.query(BN_QUERY)(_guarded(ERROR_QUERY_FAILED, bn_stats_reply))
app.query(UNIT_STATS_QUERY)(_guarded(ERROR_QUERY_FAILED, unit_stats_reply))
app.query(ALIGN_QUERY)(_guarded(ERROR_QUERY_FAILED, align_reply))
app.query(FISHER_QUERY)(_guarded(ERROR_QUERY_FAILED, statistics_reply))
app.query(GRAM_QUERY)(_guarded(ERROR_QUERY_FAILED, statistics_reply))
app.evaluate()(_guarded(ERROR_QUERY_FAILED, evaluate_reply))
