"""The client side of the secure plain average: Flower's ``secaggplus_mod`` on the ``train``
handler of the fedlmc ClientApp.

A ClientApp cannot mix a ``client_fn`` with ``@app.train`` handlers, so instead of a separate
``NumPyClient`` app, the mod :func:`secure_train_mod` returns sits on the ClientApp's ``train``
handler (``app.train(mods=[secure_train_mod(train_reply, use_slot_threads)])``): a message of
Flower's SecAgg+ workflow (it carries the ``secaggplus_configs`` record) goes through
:func:`flwr.client.mod.secaggplus_mod`, whose masked-vector stage calls
:func:`secure_fit_reply`; every other message goes to the ordinary handler untouched.

:func:`secure_fit_reply` trains exactly as the clear ``train`` handler does (the
``train_reply`` it is given: :func:`fedlmc.simulations.client_app.train_reply`, same seeds),
checks that its example count is at most ``max_weight``, pre-scales its arrays for the merge
the server named (:func:`scaled_for_merge`: its share to the power of the method's
``sum_exponents``, nothing for the plain average; for ``heterofl`` its held values and
holder masks, :func:`sent_for_merge`; for a rule of several sums, ``fisher`` or ``regmean``,
the parts its own trained model and training data give, :func:`statistics_for_merge`),
checks that every floating-point value it sends lies inside the clipping range the server
chose (an error reply naming the key and value, never a silent clip:
:func:`fedlmc.strategies.secure.check_in_range`), and answers in the legacy ``FitRes`` format
with its floating-point arrays only (:func:`fedlmc.strategies.secure.secure_arrays`), which the
mod then quantises and masks. No weight leaves the client in the clear.

Only the masked-vector stage trains, so only it imports torch and the strategies' SecAgg+
modules (function-level imports): on a SuperNode, where every message is a fresh ClientApp
process, the setup, key-sharing and unmasking stages start without them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat

from fedlmc.strategies.protocol import (
    NUM_PARTITIONS_KEY,
    PARTITION_KEY,
    PARTITION_RECORD,
    holdout_share,
    record_to_state,
    state_to_record,
)

__all__ = [
    "scaled_for_merge",
    "secure_fit_reply",
    "secure_train_mod",
    "sent_for_merge",
    "statistics_for_merge",
]
REPORTED_METRICS = ("partition-id", "train-loss", "train-accuracy", "train-seconds")


def is_secure_message(message: Message) -> bool:
    """Whether ``message`` belongs to Flower's SecAgg+ protocol."""
    return message.has_content() and RECORD_KEY_CONFIGS in message.content.config_records


Handler = Callable[[Message, Context], Any]


def secure_train_mod(train_reply: Handler, use_threads: Handler) -> Callable[..., Message]:
    """The ``train`` handler's mod: SecAgg+ for the protocol's messages (their training by
    :func:`secure_fit_reply` with the clear ``train_reply``, after ``use_threads``), the
    ordinary handler for every other message."""

    def fit(message: Message, context: Context) -> Message:
        use_threads(message, context)
        return secure_fit_reply(message, context, train_reply)

    def mod(message: Message, context: Context, call_next: Handler) -> Message:
        if not is_secure_message(message):
            return call_next(message, context)
        return secaggplus_mod(message, context, fit)

    return mod


def _train_content(
    message: Message, fit_config: dict[str, Any], arrays: list
) -> tuple[RecordDict, Any]:
    """The content of the clear ``train`` message equivalent to a legacy fit instruction (the
    initial arrays under the model's keys, the fit config and the sweep's partition record),
    and the model they belong to."""
    import torch

    from fedlmc.simulations.task import build_from_config, client_run_config, load_splits

    config = client_run_config({}, fit_config)
    model = build_from_config(config, load_splits(config))
    keys = list(model.state_dict())
    if len(keys) != len(arrays):
        raise ValueError(f"received {len(arrays)} initial arrays for a model of {len(keys)}")
    state = {k: torch.as_tensor(a) for k, a in zip(keys, arrays, strict=True)}
    content = RecordDict({"arrays": state_to_record(state), "config": ConfigRecord(fit_config)})
    if PARTITION_RECORD in message.content.config_records:
        content[PARTITION_RECORD] = message.content.config_records[PARTITION_RECORD]
    return content, model


def scaled_for_merge(state: dict, model: Any, fit_config: dict[str, Any], count: int) -> dict:
    """``state`` prepared for the merge the server named
    (:data:`~fedlmc.strategies.secure.MERGE_KEY`, default the plain average) on the server's
    ``model``: a client narrower than the server embedded at its first units when the method
    takes mixed widths (``embed_average``: HeteroFL's nesting,
    :func:`fedlmc.merging.sum_form.embedded_for_sum`), then each key times this client's
    SecAgg+ share to the power of the method's ``sum_exponents``
    (:func:`fedlmc.merging.sum_form.client_scaled`)."""
    from fedlmc.merging.method_registry import merge_method
    from fedlmc.merging.sum_form import client_scaled, embedded_for_sum
    from fedlmc.permutation.model_spec import permutation_spec
    from fedlmc.strategies.secure import CLIPPING_KEY, MAX_WEIGHT_KEY, MERGE_KEY, SecureSettings
    from fedlmc.strategies.secure_forms import runs_securely, secure_form

    entry = merge_method(str(fit_config.get(MERGE_KEY, "average")))
    if not runs_securely(entry.name):
        raise ValueError(f"merge method {entry.name!r} does not run under secure aggregation")
    spec = permutation_spec(model)
    if entry.needs.mixed_widths:
        state = embedded_for_sum(state, model, spec)
    exponents = secure_form(entry.name).sum_exponents(spec, state)
    if not any(exponents.values()):
        return state
    settings = SecureSettings(float(fit_config[CLIPPING_KEY]), float(fit_config[MAX_WEIGHT_KEY]))
    return client_scaled(state, exponents, settings.share(count))


def sent_for_merge(state: dict, model: Any, fit_config: dict[str, Any], count: int) -> list[dict]:
    """The state dicts a client sends in the secure round, in order: its
    :func:`scaled_for_merge` state; for a rule that divides by the holders (``heterofl``), its
    model embedded in the server's shapes with the entries it does not hold set to 0 and its
    holder masks times the clipping range (:func:`fedlmc.merging.sum_form.held_for_sum`)."""
    from fedlmc.merging.sum_form import held_for_sum
    from fedlmc.permutation.model_spec import permutation_spec
    from fedlmc.strategies.secure import CLIPPING_KEY, MERGE_KEY
    from fedlmc.strategies.secure_forms import secure_form

    if not secure_form(str(fit_config.get(MERGE_KEY, "average"))).divide_by_holders:
        return [scaled_for_merge(state, model, fit_config, count)]
    clipping = float(fit_config[CLIPPING_KEY])
    return list(held_for_sum(state, model, permutation_spec(model), clipping))


def statistics_for_merge(
    state: dict, model: Any, message: Message, context: Context, fit_config: dict[str, Any]
) -> list[dict]:
    """The parts a client of a ``secure_sums`` rule (``fisher``, ``regmean``) sends: computed
    by the rule's ``client_parts`` from its trained ``state`` (loaded into ``model``) and its
    own training data, with the run's method options, the clipping and statistics ranges and
    its statistics seed (:func:`fedlmc.merging.field.fisher.statistics_seed`)."""
    import torch

    from fedlmc.merging.field.fisher import statistics_seed
    from fedlmc.simulations.config.field_keys import field_method_options
    from fedlmc.simulations.task import client_run_config, client_train_data
    from fedlmc.strategies.secure import CLIPPING_KEY, MERGE_KEY
    from fedlmc.strategies.secure_forms import secure_form
    from fedlmc.strategies.secure_statistics import WEIGHT_RANGE_KEY

    config = client_run_config(context.run_config, fit_config)
    pid, num_partitions = _partition_of(message, context)
    model.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    options = {
        **field_method_options(config),
        "clipping_range": float(fit_config[CLIPPING_KEY]),
        "weight_range": float(fit_config.get(WEIGHT_RANGE_KEY, fit_config[CLIPPING_KEY])),
        "statistics_range": float(config["secagg-statistics-range"]),
        "statistics_seed": statistics_seed(config["seed"], pid),
    }
    sums = secure_form(str(fit_config[MERGE_KEY])).secure_sums
    data = client_train_data(config, pid, num_partitions, holdout_share(fit_config))
    return sums.client_parts(model.eval(), data, options)


def _clear_train_reply(
    message: Message, context: Context, content: RecordDict, train_reply: Handler
) -> Message:
    """``train_reply``'s answer to ``message`` carrying ``content`` (a client cannot create a
    message of its own, so the received one is lent and restored)."""
    received = message.content
    message.content = content
    try:
        return train_reply(message, context)
    finally:
        message.content = received


def secure_fit_reply(message: Message, context: Context, train_reply: Handler) -> Message:
    """Train with the clear ``train_reply``, check the range and the example count, reply with
    a legacy ``FitRes`` holding the floating-point arrays (the mod masks them before anything
    is sent)."""
    from fedlmc.strategies.secure import CLIPPING_KEY, MERGE_KEY, check_in_range, secure_arrays
    from fedlmc.strategies.secure_forms import secure_form
    from fedlmc.strategies.secure_temperature import TASK_KEY, TEMPERATURE_TASK

    fit_ins = compat.recorddict_to_fitins(message.content, keep_input=True)
    fit_config = dict(fit_ins.config)
    arrays = parameters_to_ndarrays(fit_ins.parameters)
    if fit_config.get(TASK_KEY) == TEMPERATURE_TASK:
        return secure_temperature_reply(message, context, fit_config, arrays)
    content, model = _train_content(message, fit_config, arrays)
    reply = _clear_train_reply(message, context, content, train_reply)
    state = record_to_state(reply.content.array_records["arrays"])
    metrics = reply.content.metric_records["metrics"]
    pid = int(metrics["partition-id"])
    count = int(metrics["num-examples"])
    _check_count(count, fit_config, pid)
    if secure_form(str(fit_config.get(MERGE_KEY, "average"))).secure_sums is not None:
        sent = statistics_for_merge(state, model, message, context, fit_config)
    else:
        sent = sent_for_merge(state, model, fit_config, count)
    for part in sent:
        check_in_range(part, float(fit_config[CLIPPING_KEY]), f"client partition {pid}")
    reported = {k: metrics[k] for k in REPORTED_METRICS}
    arrays = [array for part in sent for array in secure_arrays(part)]
    return _fit_reply(message, arrays, count, fit_config, reported)


def _check_count(count: int, fit_config: dict, pid: Any) -> None:
    """``ValueError`` when ``count`` exceeds the server's ``max_weight``."""
    from fedlmc.strategies.secure import MAX_WEIGHT_KEY

    if count > float(fit_config[MAX_WEIGHT_KEY]):
        raise ValueError(
            f"client partition {pid}: {count} examples; allowed: at most "
            f"the max_weight {fit_config[MAX_WEIGHT_KEY]} the server set"
        )


def _fit_reply(
    message: Message, arrays: list, count: int, fit_config: dict, metrics: dict
) -> Message:
    """The legacy ``FitRes`` reply (checked: ``count`` at most the server's ``max_weight``)."""
    _check_count(count, fit_config, metrics["partition-id"])
    fit_res = FitRes(Status(Code.OK, "ok"), ndarrays_to_parameters(arrays), count, metrics)
    return Message(compat.fitres_to_recorddict(fit_res, keep_input=True), reply_to=message)


def _partition_of(message: Message, context: Context) -> tuple[int, int]:
    """``(partition-id, num-partitions)``: the sweep's partition record, else the node's."""
    sent = message.content.config_records.get(PARTITION_RECORD, {})
    source = sent if PARTITION_KEY in sent else context.node_config
    return int(source[PARTITION_KEY]), int(source[NUM_PARTITIONS_KEY])


def secure_temperature_reply(
    message: Message, context: Context, fit_config: dict[str, Any], arrays: list
) -> Message:
    """The means of the NLL and its two derivatives in log T, at the ``log T`` the server
    sent, of the received (merged) model on this node's calibration data
    (:mod:`fedlmc.strategies.secure_temperature`), checked to lie in the clipping range."""
    import numpy as np
    import torch

    from fedlmc.evaluation import predict_logits
    from fedlmc.merging.calibrate import temperature_statistics
    from fedlmc.simulations.task import (
        build_from_config,
        client_calibration_data,
        client_run_config,
        device_of,
        load_splits,
    )
    from fedlmc.strategies.secure import CLIPPING_KEY, check_in_range
    from fedlmc.strategies.secure_temperature import LOG_T_KEY

    config = client_run_config(context.run_config, fit_config)
    pid, num_partitions = _partition_of(message, context)
    model = build_from_config(config, load_splits(config))
    keys = list(model.state_dict())
    model.load_state_dict({k: torch.as_tensor(a) for k, a in zip(keys, arrays, strict=True)})
    x, y = client_calibration_data(config, pid, num_partitions, holdout_share(fit_config))
    logits = predict_logits(model.to(device_of(config)).eval(), x)
    stats = temperature_statistics(logits, y, float(fit_config[LOG_T_KEY]))
    means = np.array([stats.nll_sum, stats.grad_sum, stats.hess_sum]) / max(stats.count, 1)
    check_in_range(
        {"temperature statistics": torch.as_tensor(means)},
        float(fit_config[CLIPPING_KEY]),
        f"client partition {pid} at log T = {float(fit_config[LOG_T_KEY]):.4g}",
    )
    return _fit_reply(message, [means], int(stats.count), fit_config, {"partition-id": pid})
