r"""The ServerApp mode of ``strategy = "average"`` with ``dp = "server-fixed"`` or
``"client-fixed"``.

:func:`run_dp_average` replaces the clear one-shot round when the run is differentially
private: one round of Flower's ``FedAvg`` inside Flower's server-side (or client-side) fixed
clipping wrapper (:func:`fedlmc.strategies.private.private_one_shot_average`) on the run's
Grid, from the server's initialisation :math:`\theta_0` (``init = "shared"``): each client's update
:math:`\theta_i - \theta_0` is clipped to L2 norm :math:`C` (``dp-clipping-norm``; a zero
update is kept as it is; with ``"client-fixed"`` each client clips its own update before it
sends it, Flower's ``fixedclipping_mod``, :mod:`fedlmc.simulations.private.dp_client`), the
clipped models are averaged (weighted by example counts, as
``FedAvg`` does) and Gaussian noise of standard deviation :math:`z C / N`
(``dp-noise-multiplier`` :math:`z`, :math:`N` = ``num-clients``) is added to every value. The
noise is drawn from a generator seeded with the run's ``seed`` (reproducible). Then the
same post-merge steps on the server's data as the clear ``average`` (BatchNorm statistics
re-estimated on the server split, the temperature of ``average_t`` fitted on it with
``calibration = "server"``). What differs from a clear run's rows:

- the row is the **noisy average of clipped updates**, not the plain average;
- ``dp_epsilon``: :math:`\varepsilon` of the one release at :math:`\delta` =
  :data:`fedlmc.simulations.config.dp.DP_DELTA` from Flower's RDP accountant
  (:func:`fedlmc.strategies.private.one_round_epsilon`); ``inf`` with no noise; NaN without
  Flower's optional ``dp-accounting`` dependency;
- the endpoint and merge-gap columns are NaN (the wrapper hands the server only the average);
  ``train_seconds`` is NaN (Flower's ``FedAvg`` averages the clients' metrics).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from fedlmc.merging.merge_result import calibrated, finish_merge
from fedlmc.merging.post_merge import Calibration, ServerData
from fedlmc.simulations.config.dp import CLIENT_FIXED, DP_DELTA
from fedlmc.simulations.records.server_outcome import ServerRun, width_columns
from fedlmc.study.model_rows import merge_rows

__all__ = ["dp_epsilon", "run_dp_average"]


def dp_epsilon(noise_multiplier: float, num_clients: int, delta: float = DP_DELTA) -> float:
    """The ``dp_epsilon`` column: ``inf`` for ``noise_multiplier`` 0 (no noise, no privacy),
    NaN when Flower's accountant is not installed, else its one-round epsilon at ``delta``."""
    from fedlmc.strategies.private import one_round_epsilon

    if noise_multiplier == 0:
        return math.inf
    found = one_round_epsilon(noise_multiplier, num_clients, delta)
    return math.nan if found is None else found


def dp_round_columns(strategy, config: Mapping[str, Any], seconds: float, widths) -> dict:
    """The round columns (:data:`fedlmc.study.rows.ROUND_COLUMNS`) of the DP round."""
    from fedlmc.study.rows import ROUND_COLUMNS

    survived = int(strategy.replies)
    dropped = "; ".join(strategy.dropped)  # replies the payload screen refused, by node
    columns = {
        "clients_survived": survived,
        "clients_failed": dropped,
        "clients_dropped": int(config["num-clients"]) - survived,
        "clients_dropped_reasons": dropped,
        "bytes_sent_by_clients": int(strategy.bytes_received),
        "rounds": 1,
        "train_seconds": math.nan,
        "round_seconds": float(seconds),
        **widths,
    }
    assert tuple(columns) == ROUND_COLUMNS
    return columns


def run_dp_average(run: ServerRun) -> None:
    """The DP ``average`` mode (see the module docstring); fills ``run.outcome`` like the clear
    mode (its rows, :func:`fedlmc.study.model_rows.merge_rows`, and merged state)."""
    from flwr.app import ConfigRecord

    from fedlmc.strategies.private import private_one_shot_average
    from fedlmc.strategies.protocol import record_to_state, state_to_record

    grid, config, splits, template = run.grid, run.config, run.splits, run.template
    device, outcome = run.device, run.outcome
    n_clients, z, clip = (
        int(config["num-clients"]),
        float(config["dp-noise-multiplier"]),
        float(config["dp-clipping-norm"]),
    )
    side = "client" if config["dp"] == CLIENT_FIXED else "server"
    strategy = private_one_shot_average(n_clients, z, clip, side, noise_seed=int(config["seed"]))
    initial = {k: v.detach().cpu().clone() for k, v in template.state_dict().items()}
    outcome.progress.training(n_clients, config["epochs"])
    start = time.perf_counter()
    result = strategy.start(
        grid=grid,
        initial_arrays=state_to_record(initial),
        num_rounds=1,
        timeout=float(config["timeout"]),
        train_config=ConfigRecord({**dict(config), "server-round": 1}),
    )
    seconds = time.perf_counter() - start
    outcome.progress.trained(strategy.replies, seconds)
    if strategy.replies == 0:
        raise RuntimeError(f"dp = {config['dp']!r}: no client replied within the round")
    noisy = {k: v.to(initial[k].dtype) for k, v in record_to_state(result.arrays).items()}
    start = time.perf_counter()
    server = ServerData(*splits.server) if len(splits.server[1]) else None
    merged = finish_merge("average", template, noisy, [], [1.0], server, device=device)
    outcome.merged["average"] = merged.state
    columns = dp_round_columns(strategy, config, seconds, width_columns(config))
    columns.update(merge_seconds=time.perf_counter() - start, dp_epsilon=dp_epsilon(z, n_clients))
    fits = run.plan.strategy_options.calibration == "server" and server is not None
    if fits:
        merged = calibrated(merged, Calibration(server.temperature(merged.model)[0]))
    temperature = merged.temperature if fits else None
    rows = merge_rows(
        "average",
        merged.model,
        splits,
        device=device,
        num_clients=strategy.replies,
        calibrated=fits,
        temperature=temperature,
        temperature_server_split=temperature,
    )
    outcome.rows.extend({**row, **columns} for row in rows)
