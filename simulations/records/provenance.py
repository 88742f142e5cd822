"""Provenance: which code and which machine produced a result.

:func:`versions` (recorded in a sweep's ``config.json``) and :func:`version_columns` (the last
columns of every ``results.csv`` row written by the ServerApp) name the versions of fedlmc,
Flower, torch and Python and the device, as :func:`device_description` words it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["device_description", "package_version", "version_columns", "versions"]


def package_version(name: str) -> str:
    """The installed version of distribution ``name`` (``"not installed"`` when absent)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def device_description(device: torch.device | str | None = None) -> str:
    """``"cuda:0: NVIDIA H200"`` or ``"cpu: x86_64 (2 cores)"``; ``None`` describes the
    machine's default device (every visible GPU counted)."""
    import torch

    if device is None:
        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0)
            return f"cuda: {name} (x{torch.cuda.device_count()})"
        device = torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda":
        return f"{device}: {torch.cuda.get_device_name(device)}"
    return f"{device}: {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def versions() -> dict[str, str]:
    """Versions of fedlmc, flwr, torch and Python, the platform, and the default device."""
    import torch

    import fedlmc

    return {
        "fedlmc": fedlmc.__version__,
        "flwr": package_version("flwr"),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": device_description(),
    }


def version_columns(device: torch.device | str) -> dict[str, str]:
    """The provenance columns of a results row: versions and the device that evaluated it."""
    import torch

    import fedlmc

    return {
        "fedlmc_version": fedlmc.__version__,
        "flwr_version": package_version("flwr"),
        "torch_version": torch.__version__,
        "device_used": device_description(device),
    }
