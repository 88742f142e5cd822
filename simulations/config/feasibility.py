"""Whether a cell fits this machine before any work: its memory estimate from the model's
parameter count against the machine's memory."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from fedlmc.data.catalog import (
    NUM_CLASSES,
)
from fedlmc.simulations.config.derived import server_width
from fedlmc.simulations.config.schema import (
    ConfigError,
)

MEMORY_FACTOR_CLIENT = 4  # a training client: weights, gradients, momentum, a copy
IN_SHAPES = {
    "mnist5k": (1, 28, 28),
    "mnist": (1, 28, 28),
    "fashion_mnist": (1, 28, 28),
    "cifar10": (3, 32, 32),
    "cifar100": (3, 32, 32),
}


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
