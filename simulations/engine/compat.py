"""Private APIs of Python and Ray that the simulation engine uses, behind one function each.

- :func:`register_before_thread_join`: CPython's ``threading._register_atexit(func)`` calls
  ``func`` at interpreter shutdown *before* the non-daemon threads are joined (and before the
  ``concurrent.futures`` workers registered earlier: the calls run in reverse order).
  :func:`fedlmc.simulations.engine.exit_workaround.exit_even_if_stuck` arms its exit timer there,
  the only moment left when Flower's worker threads hang in ``ray.get`` after an interrupted
  simulation.
- :func:`join_threads_as_at_exit`: CPython's ``threading._shutdown()`` is what the interpreter
  calls first when it exits: it runs the callbacks above, then joins the non-daemon threads.
  :func:`fedlmc.simulations.engine.exit_workaround.exit_without_teardown` calls it before its
  own ``os._exit``, so that leaving early skips only the modules' teardown.
- :func:`ray_bootstrap_address`: Ray's ``ray._private.services.canonicalize_bootstrap_address``
  resolves ``auto`` (``RAY_ADDRESS``, then the clusters running on this machine) the way
  ``ray.init`` does, so :func:`fedlmc.simulations.engine.ray_runtime.check_ray_address` probes the
  address Ray would join.

- :func:`loopback_node`: Ray takes a local node's address from
  ``ray._private.services.get_node_ip_address``, which on Linux is the address other machines
  reach it by (``_node_ip_address="127.0.0.1"`` is turned into that address too). While
  ``ray._private.ray_constants.ENABLE_RAY_CLUSTER`` is false (what the environment variable
  ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` sets when Ray is imported; Ray's own default on
  macOS and Windows) it is ``127.0.0.1``, and a node started then binds its GCS, raylet,
  object manager, agents and every worker's gRPC server to the loopback interface only
  (Ray's servers listen on ``127.0.0.1`` exactly when the node's address is ``127.0.0.1``).
- :func:`token_authentication`: Ray (>= 2.52) requires a token on every gRPC call of a node
  started with ``RAY_AUTH_MODE=token``. Ray reads the mode into its C++ ``RayConfig`` when it is
  first used (at ``import ray``) and caches the token (``RAY_AUTH_TOKEN``) in its
  ``AuthenticationTokenLoader``: a process that sets them later must re-read both
  (``ray._raylet.Config.initialize("")`` and ``AuthenticationTokenLoader.instance().reset_cache()``,
  what Ray's own ``ray._private.authentication_test_utils`` does), or the node it starts refuses
  its own driver.

If one of them changes, this module is the one place to change;
``tests/simulations/engine/test_compat.py`` fails first (it checks each signature and calls each
for real).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = [
    "loopback_node",
    "ray_bootstrap_address",
    "forget_token_authentication",
    "join_threads_as_at_exit",
    "register_before_thread_join",
    "token_authentication",
]

CLUSTER_VARIABLE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # Ray reads it when it is imported
AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")  # Ray's token sources


def register_before_thread_join(func: Callable[[], None]) -> None:
    """Call ``func`` at interpreter shutdown before the non-daemon threads are joined
    (CPython's ``threading._register_atexit``; the last registered runs first)."""
    threading._register_atexit(func)


def join_threads_as_at_exit() -> None:
    """Run the callbacks of :func:`register_before_thread_join`, then join the non-daemon
    threads, as the interpreter does first when it exits (CPython's ``threading._shutdown``)."""
    threading._shutdown()


def ray_bootstrap_address(address: str) -> str | None:
    """``address`` as the ``HOST:PORT`` Ray would join (``auto`` resolved; None: Ray would
    start a local instance); raises ``ConnectionError`` for ``auto`` with no cluster found
    (Ray's ``canonicalize_bootstrap_address``)."""
    from ray._private.services import canonicalize_bootstrap_address

    return canonicalize_bootstrap_address(address)


@contextmanager
def loopback_node() -> Iterator[None]:
    """While the block runs (``ray.init`` of a local node), Ray's node address is
    ``127.0.0.1`` (module docstring); this process's and its children's environment say so
    too (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read by a Ray imported there). Both are put
    back afterwards; the started node keeps its loopback address."""
    from ray._private import ray_constants

    before, variable = ray_constants.ENABLE_RAY_CLUSTER, os.environ.get(CLUSTER_VARIABLE)
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ[CLUSTER_VARIABLE] = "0"
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before
        if variable is None:
            os.environ.pop(CLUSTER_VARIABLE, None)
        else:
            os.environ[CLUSTER_VARIABLE] = variable


def forget_token_authentication() -> None:
    """After the local Ray started under :func:`token_authentication` has shut down, Ray's
    configuration is read again from this process's environment (where the variables were put
    back) and its token cache emptied. Otherwise Ray stays in token mode with the old token, and
    a later ``ray.init`` of this process that is not fedlmc's (Flower's ``run_simulation``, a
    notebook's own Ray) starts a node without authentication whose actors die at once ("The
    actor died unexpectedly"). Only once Ray is down: while a node runs, the driver's next call
    would be refused."""
    import ray

    if not ray.is_initialized():
        _reread_authentication()


def _reread_authentication() -> None:
    """Ray's authentication mode and token read again from this process's environment
    (module docstring)."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@contextmanager
def token_authentication(token: str) -> Iterator[None]:
    """While the block runs (``ray.init`` of a local node), Ray's authentication mode is
    ``token`` and its token ``token``, in this process's Ray and in the environment the node's
    processes and workers inherit (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN``; no token file is
    read or written). The variables are put back afterwards; the started node and this
    process's connection to it keep the token."""
    before = {name: os.environ.get(name) for name in AUTH_VARIABLES}
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    _reread_authentication()
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
