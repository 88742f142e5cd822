"""How many threads each part of a run computes with, whatever the caller's shell says.

A user's shell (clusters, many dotfiles) often sets ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``.
Ray sets ``OMP_NUM_THREADS=1`` for an actor only when the variable is not set already, and torch
otherwise starts one intra-op thread per core in every process: the client slots and the server
then oversubscribe the cores (the quick sweep took twice as long under ``OMP_NUM_THREADS=2``).
The rule here does not read those variables at all:

- **a client slot** (a Ray actor of the simulation, or the ClientApp process of a SuperNode)
  computes with :func:`slot_threads` = ``max(1, floor(num-cpus))`` threads: torch's intra-op
  and inter-op pools and every BLAS / OpenMP pool ``threadpoolctl`` finds. The ClientApp applies
  it at each message (:func:`use_threads`); the sweep engine also exports it as
  ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ... to the Ray workers it starts
  (:func:`thread_environment`), so that libraries read the right value when they load;
- **the server** (the process running the ServerApp: merges, weight matching, evaluation)
  computes with :func:`server_threads`: ``server-cpus`` threads when that key is > 0, else what
  the client slots leave: ``max(1, floor(C - S * num-cpus))`` for ``C`` usable cores of this
  machine and ``S`` client slots on it. A deployment's ServerApp (``flwr run`` on a SuperLink)
  has no client slots beside it (``S = 0``): all ``C`` cores.

``S`` counts the slots this machine hosts: at most ``C / num-cpus`` of them (a joined Ray
cluster's other nodes host the rest). ``C`` is the number of cores this process may run on
(``os.sched_getaffinity``), not the machine's count, so ``taskset`` and container CPU sets are
respected.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
"""Environment variables that size a library's thread pool when it loads."""

_applied_pools: int | None = None  # the count threadpoolctl last set in this process


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` where unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def slot_threads(num_cpus: float) -> int:
    """Threads of one client slot: ``max(1, floor(num-cpus))`` (a fractional share gets 1)."""
    return max(1, math.floor(float(num_cpus) + 1e-9))


def server_threads(
    server_cpus: float, slots: int = 0, num_cpus: float = 0.0, cores: int | None = None
) -> int:
    """Threads of the server: ``server-cpus`` when > 0, else ``max(1, floor(C - S * num-cpus))``
    with ``C`` = ``cores`` (default :func:`usable_cores`) and ``S`` = ``slots``, at most
    ``floor(C / num-cpus)`` (the slots this machine can host)."""
    if float(server_cpus) > 0:
        return slot_threads(server_cpus)
    cores = usable_cores() if cores is None else int(cores)
    here = int(slots)
    if float(num_cpus) > 0:
        here = min(here, math.floor(cores / float(num_cpus) + 1e-9))
    return max(1, math.floor(cores - here * float(num_cpus) + 1e-9))


def config_slot_threads(config: Mapping[str, Any]) -> int:
    """:func:`slot_threads` of a run config's ``num-cpus``."""
    return slot_threads(config["num-cpus"])


def use_threads(count: int) -> None:
    """Make this process compute with ``count`` threads: torch's intra-op pool, its inter-op pool
    (settable once per process, before its first inter-op work; left as it is afterwards) and,
    when ``threadpoolctl`` is installed, every BLAS / OpenMP pool loaded so far."""
    global _applied_pools
    import torch

    count = max(1, int(count))
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    if torch.get_num_interop_threads() != count:
        try:
            torch.set_num_interop_threads(count)
        except RuntimeError:  # already used in this process: only settable before
            pass
    if _applied_pools != count:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # optional: torch's own pools are set above
            return
        threadpool_limits(limits=count)
        _applied_pools = count


def pool_threads() -> int:
    """The largest thread count among the BLAS / OpenMP pools ``threadpoolctl`` sees in this
    process (0 when none is loaded or threadpoolctl is missing)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return 0
    return max((int(pool["num_threads"]) for pool in threadpool_info()), default=0)


def thread_variables(count: int) -> dict[str, str]:
    """Every :data:`THREAD_VARIABLES` set to ``count``."""
    return {name: str(max(1, int(count))) for name in THREAD_VARIABLES}


@contextmanager
def thread_environment(count: int) -> Iterator[dict[str, str]]:
    """Set :data:`THREAD_VARIABLES` to ``count`` in ``os.environ`` (inherited by processes
    started meanwhile, such as Ray's workers), restoring the caller's values afterwards."""
    saved = {name: os.environ.get(name) for name in THREAD_VARIABLES}
    values = thread_variables(count)
    os.environ.update(values)
    try:
        yield values
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def threads_of_this_process(count: int) -> Iterator[None]:
    """:func:`use_threads` ``count`` inside, torch's and the pools' previous counts after."""
    import torch

    before = torch.get_num_threads()
    use_threads(count)
    try:
        yield
    finally:
        use_threads(before)
