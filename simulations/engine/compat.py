"""Private APIs of Python and Ray that the simulation engine uses, behind one function each.

- :func:`register_before_thread_join`: CPython's ``threading._register_atexit(func)`` calls
  ``func`` at interpreter shutdown *before* the non-daemon threads are joined (and before the
  ``concurrent.futures`` workers registered earlier: the calls run in reverse order).
  :func:`fedlmc.simulations.engine.exit_workaround.exit_even_if_stuck` arms its exit timer there,
  the only moment left when Flower's worker threads hang in ``ray.get`` after an interrupted
  simulation.
- :func:`ray_bootstrap_address`: Ray's ``ray._private.services.canonicalize_bootstrap_address``
  resolves ``auto`` (``RAY_ADDRESS``, then the clusters running on this machine) the way
  ``ray.init`` does, so :func:`fedlmc.simulations.engine.ray_runtime.check_ray_address` probes the
  address Ray would join.

If one of them changes, this module is the one place to change;
``tests/strategies/test_flower_compat.py`` fails first (it checks each signature and calls each for
real).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["ray_bootstrap_address", "register_before_thread_join"]


def register_before_thread_join(func: Callable[[], None]) -> None:
    """Call ``func`` at interpreter shutdown before the non-daemon threads are joined
    (CPython's ``threading._register_atexit``; the last registered runs first)."""
    threading._register_atexit(func)


def ray_bootstrap_address(address: str) -> str | None:
    """``address`` as the ``HOST:PORT`` Ray would join (``auto`` resolved; None: Ray would
    start a local instance); raises ``ConnectionError`` for ``auto`` with no cluster found
    (Ray's ``canonicalize_bootstrap_address``)."""
    from ray._private.services import canonicalize_bootstrap_address

    return canonicalize_bootstrap_address(address)
