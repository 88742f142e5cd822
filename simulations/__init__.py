"""Flower ClientApp/ServerApp, simulation driver, sweeps, reports and the command line.

``fedlmc.simulations.run_federation`` (and ``run_sweep``, ``load_sweep_config``) are imported on
first use, so that ``import fedlmc.simulations`` (and validating a sweep file) loads neither Flower
nor torch.
"""

from __future__ import annotations

from fedlmc._lazy import lazy_exports

_EXPORTS = {
    "run_federation": "fedlmc.simulations.federation",
    "run_federation_outcome": "fedlmc.simulations.federation",
    "run_sweep": "fedlmc.simulations.sweep",
    "load_sweep_config": "fedlmc.simulations.config",
    "validate_run_config": "fedlmc.simulations.config",
    "load_merged": "fedlmc.simulations.merged_file",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
