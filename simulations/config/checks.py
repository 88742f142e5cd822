"""The checks that involve several keys of a run config, each raising :class:`ConfigError` with
a one-line message naming the value and what is allowed."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedlmc.data.catalog import (
    DOWNLOADABLE,
    IN_SHAPES,
    NUM_CLASSES,
    TRAIN_SIZES,
    is_hf_name,
)
from fedlmc.merging.method_registry import MergeRequest, refusal
from fedlmc.models.registry import (
    MODELS,
    is_factory_path,
    model_entry,
    model_names,
    parameter_count,
    user_factory,
)
from fedlmc.simulations.config.defences import robust_method_options
from fedlmc.simulations.config.derived import (
    client_pool_size,
    client_widths,
    method_list,
    mixed_widths,
    model_options,
    resolved_bias,
    resolved_norm,
    selected_methods,
    server_width,
    uses_fedavg,
    widths_text,
)
from fedlmc.simulations.config.dp import check_dp
from fedlmc.simulations.config.schema import (
    ConfigError,
    shown,
)
from fedlmc.simulations.config.secure import check_secure_aggregation
from fedlmc.simulations.config.values import Mode, parse_widths


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
    """Before Ray starts: a model factory file (``path/file.py:make_net``) must exist and the
    factory a path names must import here and be called as ``factory(width, num_classes,
    in_shape, norm)`` (:func:`fedlmc.models.registry.user_factory`: ``os:system`` is refused,
    and so is any factory the allow-list ``FEDLMC_MODEL_ALLOW`` leaves out), and an ``hf:``
    data source must be an existing local file or folder or look like a hub name (``name`` or
    ``owner/name``: ``hf:../../x`` is neither). Machine-dependent: skipped with
    ``check_devices=False`` (``--no-device-check``)."""
    model = config["model"]
    location = model.rpartition(":")[0]
    if location.endswith(".py") and not Path(location).expanduser().is_file():
        raise ConfigError(
            f"model = {shown(model)}: no such file {shown(location)}; allowed: a "
            "registered model, 'package.module:make_net' or an existing 'file.py:make_net'"
        )
    if model not in model_names() and is_factory_path(model):
        try:
            user_factory(model)
        except ValueError as err:
            raise ConfigError(f"model = {shown(model)}: {err}") from None
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


def check_local_cpus(configs: Iterable[Mapping[str, Any]], local: bool) -> list[Mapping[str, Any]]:
    """A local Ray (``local``: the run starts one on this machine) hosts a client only on this
    machine's cores: a ``num-cpus`` above ``os.cpu_count()`` (what Ray counts, cgroup quotas
    aside) is refused here, before Ray starts (Ray would start and then find no node to host
    one client). A joined cluster (``--ray-address``) may have larger nodes: nothing is checked
    then. Returns ``configs`` (a list), for a caller that goes on with them."""
    configs = list(configs)
    if not local:
        return configs
    cores = os.cpu_count() or 1
    for config in configs:
        if float(config["num-cpus"]) > cores:
            raise ConfigError(
                f"num-cpus = {config['num-cpus']:g}: this machine has {cores} cores; allowed: "
                f"at most {cores} for a client of the local Ray (a cluster joined with "
                "--ray-address may offer more)"
            )
    return configs


def check_widths(config: Mapping[str, Any]) -> None:
    """``client-widths`` has one width per client; ``server-width`` is 0 or at least the widest
    client's; mixed widths (:func:`mixed_widths`) only with what can merge them: not the FedAvg
    baseline and no norm across units (``ln``: the embedding would change it); the merge methods
    that need one width are refused by their own refusal (:func:`check_merge_methods`)."""
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
    if not model_entry(config["model"]).mixed_widths:
        raise ConfigError(
            f"client-widths = {config['client-widths']!r} with model {config['model']!r}: a "
            f"narrow {config['model']} does not embed exactly into a wider one; allowed for "
            f"mixed widths: {', '.join(e.name for e in MODELS if e.mixed_widths)}"
        )
    if uses_fedavg(config):
        raise ConfigError(
            f"client-widths = {config['client-widths']!r} with server-width "
            f"{server_width(config):g}: the FedAvg baseline needs every client at the server "
            "width; allowed: fedavg only with equal client and server widths"
        )
    if resolved_norm(config) == "ln":
        raise ConfigError(
            f"norm = 'ln' with client widths {widths_text(client_widths(config))} and server "
            f"width {server_width(config):g}: a norm across units (LayerNorm, GroupNorm) changes "
            "when a narrow model is embedded in a wider one; allowed for mixed widths: bn, none"
        )


def check_model_layout(config: Mapping[str, Any]) -> None:
    """The model takes the configured norm (its registered ``norms``), and its declared layout
    fits the data set's images (a ViT's patch divides them): its declared parameter count,
    computed without torch, raises no ``ValueError``."""
    entry = model_entry(config["model"])
    norm = resolved_norm(config)
    if norm not in entry.norms:
        raise ConfigError(
            f"norm = {norm!r}: allowed for model {config['model']!r}: {', '.join(entry.norms)}"
        )
    if entry.parameters is None or config["dataset"] not in IN_SHAPES:
        return
    try:
        parameter_count(
            config["model"],
            server_width(config),
            NUM_CLASSES[config["dataset"]],
            IN_SHAPES[config["dataset"]],
            norm,
            **model_options(config),
        )
    except ValueError as error:
        raise ConfigError(
            f"model = {config['model']!r} on dataset {config['dataset']!r}: {error}"
        ) from None


def check_model_bias(config: Mapping[str, Any]) -> None:
    """``bias = true/false`` needs a model with a ``bias`` option."""
    if config["bias"] != "auto" and "bias" not in model_entry(config["model"]).options:
        raise ConfigError(
            f"bias = {config['bias']!r}: model {config['model']!r} has no bias option; "
            "allowed: auto"
        )


def merge_request(config: Mapping[str, Any]) -> MergeRequest:
    """The :class:`~fedlmc.merging.method_registry.MergeRequest` of a run config, from its keys
    alone (no model is built): ``num-clients`` clients, as few as ``min-clients`` (a round merges
    whoever survived), at the robust rules' method options (Krum's fewest clients); the model's
    name; why it is no norm-free plain chain (a residual model, a norm); what has no bias where
    REPAIR needs one (``bias = false`` without BatchNorm); how the clients' widths differ;
    whether the clients share a starting model (``init = "shared"``: the server's
    initialisation is the base). Server data and the clients' queries are not asked here (the
    merge asks them)."""
    model, norm = config["model"], resolved_norm(config)
    chain = ""
    if model_entry(model).plain_chain is False:
        chain = "residual"
    elif norm != "none":
        chain = f"norm = {norm!r}"
    bias_free = ""
    if resolved_bias(config) == "false" and norm != "bn":
        bias_free = f"model {model!r} with bias = false"
    try:
        widths = mixed_widths(config)
    except ValueError:  # a bad client-widths: check_widths names it
        widths = False
    return MergeRequest(
        num_clients=config["num-clients"],
        fewest_clients=config["min-clients"],
        model=model,
        chain_reason=chain,
        bias_free=bias_free,
        widths=(
            f"client widths {widths_text(client_widths(config))}, server width "
            f"{server_width(config):g}"
            if widths
            else ""
        ),
        base=config["init"] == "shared",
        options=robust_method_options(config),
    )


def check_merge_methods(config: Mapping[str, Any]) -> None:
    """Every merge method the run executes (:func:`selected_methods`) asked, before any work,
    whether it runs on the config's :func:`merge_request` (its one refusal,
    :func:`fedlmc.merging.method_registry.refusal`: a plain-chain method on a residual or normed
    model, more than two clients for ``random_direction``, a task-vector method without
    ``init = "shared"``, REPAIR without biases, a one-width method for clients of different
    widths, ``krum`` / ``multi_krum`` with fewer than ``2 krum-byzantine + 3`` or
    ``krum-select + krum-byzantine`` as its ``min-clients``)."""
    methods = selected_methods(config)
    if not methods:
        return
    request = merge_request(config)
    for method in methods:
        reason = refusal(method, request)
        if reason:
            raise ConfigError(reason)


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
    if not k or config["strategy"] == Mode.FEDAVG:
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
    (:func:`fedlmc.simulations.config.secure.check_secure_aggregation`)."""
    methods = [config["align"]] if config["strategy"] == Mode.ALIGNED else []
    methods += method_list(config) if config["strategy"] == Mode.COMPARE else []
    check_secure_aggregation(config, methods)


def check_dp_cell(config: Mapping[str, Any]) -> None:
    """``dp``: the settings DP runs with (:func:`fedlmc.simulations.config.dp.check_dp`)."""
    check_dp(config)
