"""The sweep engine: many cells (federations) in one Flower simulation, on warm clients.

One call of :func:`run_cells` starts **one** Flower simulation (``flwr.simulation.run_simulation``:
one Ray session, one pool of ClientApp actors, as many virtual SuperNodes as the widest cell has
clients) whose ServerApp (:class:`SweepServer`) runs every cell on the same Grid, several at once:

- each cell is :func:`fedlmc.simulations.server_app.run_server` (every strategy, federated
  calibration queries, FedAvg, the rows and files of one federation) in a thread of its own, on a
  :class:`~fedlmc.simulations.engine.grid_view.CellGrid`: a view of the shared Grid that shows the
  cell only the first ``num-clients`` node ids (sorted) and adds ``partition-id`` /
  ``num-partitions`` of that cell to every message it sends (a ConfigRecord named ``partition``;
  the ClientApp prefers it to its node config). The same warm actors thus serve every cell; they
  keep their loaded data sets and partitions (:mod:`fedlmc.simulations.task`, bounded caches keyed
  by what determines them) and rebuild the model for every message;
- client slots: Flower runs ``S = floor(resources / (num-cpus, num-gpus))`` actors (per Ray
  node; fractional GPU shares allowed) and gives each message to a free one. A
  :class:`~fedlmc.simulations.engine.slots.Broker` hands out ``S`` slot tokens, oldest cell first:
  a message is pushed only when a slot is free and its token comes back only with its reply (a late
  reply included), so a message never waits in a queue and a cell's ``timeout`` counts from the
  moment a client slot takes its message (its ``created_at`` is set then; the test-only ``hang``
  failure sleeps past exactly that deadline). One broker thread pulls the replies of every message
  in flight, so concurrent cells never see each other's replies;
- client state: a cell whose clients keep their trained model in the node's ``context.state``
  between rounds (client-side activation matching,
  the run plan's ``client.queried_methods``, :mod:`fedlmc.simulations.config.run_plan`) sends
  *exclusive* messages: one runs on a
  node only while no other message runs there, and no message runs on a node while an exclusive one
  does (Flower's simulation stores a node's context after each message, so two messages on one
  node at once would lose one's update). Other cells keep sharing nodes freely; a message never
  overtakes an older waiting one for the same node;
- threads (:mod:`fedlmc.simulations.config.threads`): each client slot computes with ``max(1,
  floor(num-cpus))`` threads and the server's merges and evaluations with ``server-cpus``
  threads (default: the cores the slots leave, at least one), whatever ``OMP_NUM_THREADS`` /
  ``MKL_NUM_THREADS`` the caller's shell sets;
- cells in flight: ``ceil(S / num-clients) + 1`` by default (``max_in_flight``), so that while
  one cell merges and evaluates on the server, the next one trains;
- determinism: a cell gives the same numbers whatever runs before or beside it. Clients
  derive every seed from ``(seed, partition-id, round)`` and a Ray actor runs one message at a
  time; on the server, :func:`fedlmc.simulations.task.build_from_config` seeds and builds under a
  lock (the only use of the global RNG) and everything else uses explicit generators.

Results reach the caller through ``on_done(CellResult)``, called (one at a time) as each cell
finishes, in any order. A cell whose ServerApp raises (too few clients, timeout, NaN, ...) gives
a result with ``error`` set; the others go on. When the simulation itself ends early (Ctrl-C,
SIGTERM, engine failure), the cells in flight stop at their next message and report nothing;
SIGTERM is handled like Ctrl-C (:mod:`fedlmc.simulations.engine.stop_signals`, exit status 143
instead of 130). A client actor that dies (its process killed) fails the message it ran and is
replaced by a new one (:mod:`fedlmc.simulations.engine.actor_pool`): later cells keep the client.

``ray_address`` (``"auto"``, ``"HOST:PORT"`` or ``"ray://HOST:PORT"``) joins an existing Ray
cluster instead of starting a local one; an address where nothing answers is refused at once
with :class:`~fedlmc.simulations.engine.ray_runtime.ClusterError` (``ray.init`` would otherwise
retry for minutes).

The parts live in modules of their own; this one drives them (:func:`run_cells`) and
re-exports their names:

- :mod:`fedlmc.simulations.engine.ray_runtime`: Flower's backend config, starting or joining Ray,
the
  number of client slots (:class:`~fedlmc.simulations.engine.ray_runtime.ClusterError`);
- :mod:`fedlmc.simulations.engine.log_filters`: Flower's and Ray's console output
(:func:`quiet_flower`);
- :mod:`fedlmc.simulations.engine.slots`: the slot broker
(:class:`~fedlmc.simulations.engine.slots.Broker`,
:class:`~fedlmc.simulations.engine.slots.EngineStopped`);
- :mod:`fedlmc.simulations.engine.grid_view`: one cell's view of the shared Grid
(:class:`~fedlmc.simulations.engine.grid_view.CellGrid`);
- :mod:`fedlmc.simulations.engine.sweep_server`: the ServerApp inside the simulation
(:class:`SweepServer`,
  :class:`CellJob`, :class:`CellResult`);
- :mod:`fedlmc.simulations.engine.exit_workaround`: a process that exits after an interrupted
simulation
  (:func:`exit_even_if_stuck`); :mod:`fedlmc.simulations.engine.compat` holds the private APIs of
  Python and Ray it and :mod:`fedlmc.simulations.engine.ray_runtime` use.

This is the only module that calls ``flwr.simulation.run_simulation`` (deprecated in Flower
1.42 but working; if it disappears, this is the one call to replace).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedlmc.simulations.config.secure import secure_cells_in_flight
from fedlmc.simulations.config.threads import (
    config_slot_threads,
    server_threads,
    threads_of_this_process,
)
from fedlmc.simulations.engine.actor_pool import dead_actors_replaced
from fedlmc.simulations.engine.compat import forget_token_authentication
from fedlmc.simulations.engine.exit_workaround import exit_even_if_stuck
from fedlmc.simulations.engine.log_filters import quiet_flower
from fedlmc.simulations.engine.ray_runtime import (
    RayStartError,
    backend_config,
    client_slots,
    init_ray,
    resources_of,
)
from fedlmc.simulations.engine.stop_signals import exit_status, restore_signals
from fedlmc.simulations.engine.sweep_server import CellJob, CellResult, SweepServer

__all__ = [
    "EngineError",
    "EngineStats",
    "default_in_flight",
    "run_cells",
]


class EngineError(RuntimeError):
    """The simulation stopped before every cell had finished (the unfinished cells report
    nothing: a sweep retries them on its next run)."""


@dataclass
class EngineStats:
    """What the engine used (filled by :func:`run_cells`, for benchmarks and progress)."""

    slots: int = 0
    max_in_flight: int = 0
    supernodes: int = 0
    simulations: int = 0
    server_threads: int = 0
    startup_seconds: list[float] = field(default_factory=list)


def default_in_flight(slots: int, jobs: Sequence[CellJob]) -> int:
    """``ceil(S / num-clients) + 1`` (the narrowest cell's clients): the slots stay busy and
    one more cell merges and evaluates on the server meanwhile."""
    fewest = min(int(job.config["num-clients"]) for job in jobs)
    return math.ceil(slots / fewest) + 1


# ----------------------------------------------------------------------------- driver


def run_cells(
    jobs: Sequence[CellJob],
    on_done: Callable[[CellResult], None],
    *,
    on_start: Callable[[CellJob], None] | None = None,
    on_reply: Callable[[CellJob, int], None] | None = None,
    ray_address: str | None = None,
    ray_init_args: Mapping[str, Any] | None = None,
    max_in_flight: int | None = None,
    verbose: bool = False,
    stats: EngineStats | None = None,
) -> None:
    """Run every job in one Flower simulation per client-resource setting (usually one).

    ``on_done`` receives each finished cell (errors included) as it finishes; a failure of
    ``on_done`` stops the engine and is re-raised. ``on_reply(job, count)`` hears of the
    client replies to a cell as they arrive (progress inside a cell of many clients). Raises
    :class:`~fedlmc.simulations.engine.ray_runtime.ClusterError` for an unreachable ``ray_address``
    or resources no node can host, and
    :class:`EngineError` when the simulation ends with cells unfinished (they reported
    nothing).
    """
    groups: dict[tuple[float, float], list[CellJob]] = {}
    for job in jobs:
        groups.setdefault(resources_of(job.config), []).append(job)
    stats = stats if stats is not None else EngineStats()
    for group in groups.values():
        _run_group(
            group,
            on_done,
            on_start,
            ray_address,
            ray_init_args,
            max_in_flight,
            verbose,
            stats,
            on_reply=on_reply,
        )


def _run_group(
    jobs: Sequence[CellJob],
    on_done: Callable[[CellResult], None],
    on_start: Callable[[CellJob], None] | None,
    ray_address: str | None,
    ray_init_args: Mapping[str, Any] | None,
    max_in_flight: int | None,
    verbose: bool,
    stats: EngineStats,
    *,
    on_reply: Callable[[CellJob, int], None] | None = None,
) -> None:
    import ray
    from flwr.simulation import run_simulation

    from fedlmc.simulations.client_app import app as client_app

    backend = backend_config(jobs[0].config, ray_init_args)
    pool_size = max(int(job.config["num-clients"]) for job in jobs)
    stop = threading.Event()
    start = time.perf_counter()
    with quiet_flower(verbose):
        try:
            init_ray(ray_address, backend["init_args"], config_slot_threads(jobs[0].config))
            restore_signals()  # the command's SIGTERM handler, not ray.init's sys.exit
            slots = client_slots(backend["client_resources"])
        except RayStartError as err:  # one line: what Ray said and what to do
            raise EngineError(str(err)) from None
        except BaseException:
            if ray.is_initialized():
                ray.shutdown()
            raise
        stats.startup_seconds.append(time.perf_counter() - start)
        stats.slots, stats.supernodes = slots, max(stats.supernodes, pool_size)
        wanted = max_in_flight or default_in_flight(slots, jobs)
        stats.max_in_flight = secure_cells_in_flight([j.config for j in jobs], wanted)
        stats.simulations += 1
        server = SweepServer(
            jobs,
            slots=slots,
            pool_size=pool_size,
            max_in_flight=stats.max_in_flight,
            on_done=on_done,
            on_start=on_start,
            stop=stop,
            on_reply=on_reply,
        )
        stats.server_threads = server_threads(
            jobs[0].config["server-cpus"], slots, jobs[0].config["num-cpus"]
        )
        try:
            with threads_of_this_process(stats.server_threads), dead_actors_replaced():
                run_simulation(
                    server_app=server.app(),
                    client_app=client_app,
                    num_supernodes=pool_size,
                    backend_config=backend,
                    verbose_logging=verbose,
                )
        except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM (stop_signals.Terminated)
            exit_even_if_stuck(exit_status(interrupt), grace=0.0)
            raise
        except SystemExit as exc:  # flwr_exit() on engine failures
            exit_even_if_stuck(1)
            raise EngineError(f"the Flower simulation engine exited with code {exc.code}") from exc
        except Exception as exc:  # e.g. "Simulation Runtime crashed" (the Ray backend failed)
            exit_even_if_stuck(1)
            raise EngineError(f"the Flower simulation failed: {exc}") from exc
        finally:
            stop.set()
            if ray.is_initialized():  # Flower shuts Ray down itself, unless it failed early
                ray.shutdown()
            forget_token_authentication()  # a later plain ray.init of this process works
    if server.fatal is not None:
        raise server.fatal
    missing = [job.key for job in jobs if job.key not in server.finished]
    if missing:
        raise EngineError(
            f"the simulation ended with {len(missing)} cell(s) unfinished (see the Flower log)"
        )
