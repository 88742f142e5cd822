"""Whether a cell fits this machine before any work: its memory estimate from the model's
parameter count against the machine's memory."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from fedlmc.data.catalog import IN_SHAPES, NUM_CLASSES
from fedlmc.models.registry import parameter_count
from fedlmc.simulations.config.derived import model_options, resolved_norm, server_width
from fedlmc.simulations.config.schema import ConfigError

MEMORY_FACTOR_CLIENT = 4  # a training client: weights, gradients, momentum, a copy


def model_parameters(config: Mapping[str, Any]) -> int | None:
    """How many parameters the configured model has at the server's width, from the model's
    declared count (:func:`fedlmc.models.registry.parameter_count`, without building it:
    validation imports no torch); where the model declares none (a user factory) the count of
    the model built on torch's meta device when torch is loaded anyway, else ``None``; ``None``
    for an ``hf:`` data set (its shape is known only once it is loaded) and for a factory that
    fails to build here (building it for the run names the error)."""
    if config["dataset"] not in IN_SHAPES:
        return None
    try:
        return _parameter_count(config)
    except Exception:  # noqa: BLE001  a factory that fails to build: the build names its error
        return None


def _parameter_count(config: Mapping[str, Any]) -> int | None:
    return parameter_count(
        config["model"],
        server_width(config),
        NUM_CLASSES[config["dataset"]],
        IN_SHAPES[config["dataset"]],
        resolved_norm(config),
        build="torch" in sys.modules,
        **model_options(config),
    )


def memory_check_note(config: Mapping[str, Any]) -> str | None:
    """The line saying that :func:`check_memory` was skipped, and why; ``None`` when it ran."""
    if config["dataset"] not in IN_SHAPES:
        return (
            f"note: memory check skipped: the shape of dataset {config['dataset']!r} is known "
            "only once it is loaded"
        )
    if model_parameters(config) is None:
        return (
            f"note: memory check skipped: model {config['model']!r} declares no parameter count "
            "(register_model(..., parameters=...))"
        )
    return None


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
    check_bytes_needed(
        config,
        elements,
        memory_estimate(config, elements),
        f"{config['num-clients']} clients and the server need",
        "a smaller width or fewer clients",
    )


MEMORY_FACTOR_LOAD = 2  # a model loaded back: its weights and the state dict read into it


def available_memory() -> int:
    """Bytes of memory available now (``MemAvailable`` of ``/proc/meminfo``: free memory plus
    what the kernel can reclaim), else :func:`machine_memory`."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return machine_memory()


def check_load_memory(config: Mapping[str, Any], elements: int) -> None:
    """:class:`ConfigError` when the configured model of ``elements`` parameters, built and
    loaded back from a file (:func:`fedlmc.simulations.load_merged`), needs more than the
    memory available now: :math:`4 P` bytes (float32) times :data:`MEMORY_FACTOR_LOAD` (a run
    is planned against the machine's memory, a load happens now, beside whatever runs)."""
    check_bytes_needed(
        config,
        elements,
        4 * int(elements) * MEMORY_FACTOR_LOAD,
        "building it and reading its weights need",
        "a model that fits the memory available now",
        have=(available_memory(), "available now"),
    )


def check_bytes_needed(
    config: Mapping[str, Any],
    elements: int,
    needed: int,
    who: str,
    allowed: str,
    have: tuple[int, str] | None = None,
) -> None:
    """:class:`ConfigError` naming the width key, the model's parameters and ``needed`` bytes
    against ``have`` (bytes, what they are; default :func:`machine_memory`, "this machine
    has") when ``needed`` exceeds it."""
    limit, what = have or (machine_memory(), "this machine has")
    if needed > limit:
        raise ConfigError(
            f"{width_key(config)} = {_shown(config[width_key(config)])}: the {config['model']} at "
            f"width {server_width(config):g} has about {elements:,} parameters; "
            f"{who} about {needed:,} bytes "
            f"({needed / 2**30:.1f} GiB), {what} {limit:,} ({limit / 2**30:.1f} GiB); "
            f"allowed: {allowed}"
        )
