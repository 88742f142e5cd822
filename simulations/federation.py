"""Run one federation in-process with Flower's simulation engine (Ray backend).

This is the only module that calls ``flwr.simulation.run_simulation`` (deprecated in Flower 1.42
but working; if it disappears, swap this one call for a SuperLink started with ``--simulation``
and ``flwr run``, see the README). The ServerApp runs in a thread of this process, so its
:class:`~simulations.server_app.ServerOutcome` comes back through a closure; ``num-clients``
virtual SuperNodes run the ClientApp in Ray actors with ``client_resources = {num_cpus:
num-cpus, num_gpus: num-gpus}`` each (Ray runs ``floor(available / requested)`` clients at once).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pandas as pd

from fedlmc.config import validate_run_config
from simulations.server_app import ServerOutcome, server_app_for


class FederationError(RuntimeError):
    """The federation ended without results."""


def backend_config(
    config: Mapping[str, Any], ray_init_args: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Flower's backend config: per-client resources and the arguments of ``ray.init``.

    ``ray_init_args={"address": "auto"}`` (or ``"ray://host:10001"``) joins an existing Ray
    cluster instead of starting a local one.
    """
    init_args: dict[str, Any] = {"include_dashboard": False}
    init_args.update(ray_init_args or {})
    return {
        "client_resources": {
            "num_cpus": float(config["num-cpus"]),
            "num_gpus": float(config["num-gpus"]),
        },
        "init_args": init_args,
    }


class _DropDeprecationNotice(logging.Filter):
    """Hides Flower's run_simulation deprecation notice (printed on every call otherwise)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "DEPRECATED FEATURE" not in record.getMessage()


@contextmanager
def _quiet_flower(verbose: bool) -> Iterator[None]:
    """Flower's logger at WARNING (our strategies' warnings still show) unless ``verbose``."""
    logger = logging.getLogger("flwr")
    level, notice = logger.level, _DropDeprecationNotice()
    if not verbose:
        logger.setLevel(logging.WARNING)
        logger.addFilter(notice)
    try:
        with warnings.catch_warnings():
            if not verbose:  # Ray's tip about CUDA_VISIBLE_DEVICES for num_gpus=0 actors
                warnings.filterwarnings("ignore", message="Tip: In future versions of Ray")
            yield
    finally:
        logger.setLevel(level)
        logger.removeFilter(notice)


def run_federation_outcome(
    config: Mapping[str, Any],
    *,
    verbose: bool = False,
    ray_init_args: Mapping[str, Any] | None = None,
) -> ServerOutcome:
    """Run the federation of ``config`` and return the ServerApp's full outcome.

    Raises the ServerApp's own exception (e.g. ``NotEnoughClientsError``) when it fails, and
    :class:`FederationError` when the engine stops without producing results.
    """
    from flwr.simulation import run_simulation

    from simulations.client_app import app as client_app

    config = validate_run_config(dict(config), check_devices=True)
    outcomes: list[ServerOutcome] = []
    server_app = server_app_for(config, outcomes.append)
    start = time.perf_counter()
    try:
        with _quiet_flower(verbose):
            run_simulation(
                server_app=server_app,
                client_app=client_app,
                num_supernodes=config["num-clients"],
                backend_config=backend_config(config, ray_init_args),
                verbose_logging=verbose,
            )
    except SystemExit as exc:  # flwr_exit() on engine failures
        raise FederationError(f"the Flower simulation engine exited with code {exc.code}") from exc
    if not outcomes:
        raise FederationError("the federation finished without results (see the Flower log)")
    outcome = outcomes[0]
    outcome.timings["wall_seconds"] = time.perf_counter() - start
    return outcome


def run_federation(
    config: Mapping[str, Any],
    *,
    with_config: bool = False,
    verbose: bool = False,
    ray_init_args: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """One row per method (see :mod:`simulations.server_app` for the columns); ``with_config``
    appends the run-config columns (``simulations.sweep`` adds them itself and refuses
    duplicates, hence off by default)."""
    outcome = run_federation_outcome(config, verbose=verbose, ray_init_args=ray_init_args)
    table = outcome.table(with_config=with_config)
    if table.empty:
        raise FederationError("the federation produced no rows")
    return table
