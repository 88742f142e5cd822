"""Run one federation in-process with Flower's simulation engine (Ray backend).

:func:`run_federation` is a sweep of one cell through :mod:`fedlmc.simulations.engine.cells`: one
``flwr.simulation.run_simulation`` whose ServerApp runs
:func:`fedlmc.simulations.server_app.run_server` in a thread of this process (its
:class:`~fedlmc.simulations.records.server_outcome.ServerOutcome` comes back in-process),
``num-clients`` virtual SuperNodes running the ClientApp in Ray actors with ``client_resources =
{num_cpus: num-cpus, num_gpus: num-gpus}`` each (Ray runs ``floor(available / requested)`` clients
at once). ``ray_address`` (or ``ray_init_args={"address": ...}``) joins an existing Ray cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.engine.cells import EngineError, run_cells
from fedlmc.simulations.engine.sweep_server import CellJob, CellResult
from fedlmc.simulations.records.server_outcome import ServerOutcome

__all__ = [
    "FederationError",
    "run_federation",
    "run_federation_outcome",
]


class FederationError(EngineError):
    """The federation ended without results."""


def run_federation_outcome(
    config: Mapping[str, Any],
    *,
    verbose: bool = False,
    ray_init_args: Mapping[str, Any] | None = None,
    ray_address: str | None = None,
    say: Callable[[str], None] | None = None,
) -> ServerOutcome:
    """Run the federation of ``config`` and return the ServerApp's full outcome (``say``
    receives its stages and where its rows went, :mod:`fedlmc.simulations.records.progress`).

    Raises the ServerApp's own exception (e.g. ``NotEnoughClientsError``) when it fails, and
    :class:`FederationError` when the engine stops without producing results.
    """
    config = validate_run_config(config, check_devices=True)  # as it is when validated
    results: list[CellResult] = []
    start = time.perf_counter()
    try:
        run_cells(
            [CellJob("federation", config, say)],
            results.append,
            ray_address=ray_address,
            ray_init_args=ray_init_args,
            max_in_flight=1,
            verbose=verbose,
        )
    except EngineError as err:
        raise FederationError(str(err)) from err
    if not results:
        raise FederationError("the federation finished without results (see the Flower log)")
    result = results[0]
    if result.error is not None:
        raise result.error
    outcome = result.outcome
    outcome.timings["wall_seconds"] = time.perf_counter() - start
    return outcome


def run_federation(
    config: Mapping[str, Any],
    *,
    with_config: bool = False,
    verbose: bool = False,
    ray_init_args: Mapping[str, Any] | None = None,
    ray_address: str | None = None,
    say: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """One row per method (see :mod:`fedlmc.simulations.server_app` for the columns);
    ``with_config`` appends the run-config columns (``fedlmc.simulations.runs.sweep`` adds them
    itself and refuses duplicates, hence off by default)."""
    outcome = run_federation_outcome(
        config, verbose=verbose, ray_init_args=ray_init_args, ray_address=ray_address, say=say
    )
    table = outcome.table(with_config=with_config)
    if table.empty:
        raise FederationError("the federation produced no rows")
    return table
