"""The sweep engine: the Ray and Flower machinery behind one call, :func:`run_cells`.

:mod:`~fedlmc.simulations.engine.cells` (``run_cells``: many cells in one Flower simulation),
:mod:`~fedlmc.simulations.engine.sweep_server` (the ServerApp that runs every cell on one Grid),
:mod:`~fedlmc.simulations.engine.grid_view` (a cell's view of that Grid),
:mod:`~fedlmc.simulations.engine.slots` (client slots handed out oldest cell first),
:mod:`~fedlmc.simulations.engine.ray_runtime` (starting or joining Ray),
:mod:`~fedlmc.simulations.engine.stop_signals` (SIGINT / SIGTERM), and Flower's quirks kept in one
place (:mod:`~fedlmc.simulations.engine.log_filters`, :mod:`~fedlmc.simulations.engine.compat`,
:mod:`~fedlmc.simulations.engine.exit_workaround`,
:mod:`~fedlmc.simulations.engine.actor_pool`). It runs the Flower app (``client_app``,
``server_app``) and sits below the run drivers (:mod:`fedlmc.simulations.runs`).
"""

from __future__ import annotations

from fedlmc._lazy import lazy_exports

_EXPORTS = {
    "run_cells": "fedlmc.simulations.engine.cells",
    "EngineError": "fedlmc.simulations.engine.cells",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
