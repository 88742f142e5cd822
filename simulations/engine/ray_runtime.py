"""Ray for the sweep engine: Flower's backend config, starting Ray or joining a cluster
(:func:`init_ray`; an address where nothing answers is refused at once with
:class:`ClusterError`, :func:`check_ray_address`) and the number of client slots Flower will
run (:func:`client_slots`).

A local Ray (no ``--ray-address``) is this machine's alone: its node address is ``127.0.0.1``
(:func:`fedlmc.simulations.engine.compat.loopback_node`), so its GCS, raylet, object manager,
agents and workers, the driver's own gRPC server included, listen on the loopback interface
only (on every interface, anyone who reaches the machine could run code in them), and its
dashboard is off. Loopback keeps other machines out, not other users of this one: a local Ray
also uses Ray's token authentication (``RAY_AUTH_MODE=token``,
:func:`fedlmc.simulations.engine.compat.token_authentication`) with a random token made for
this start, held only in the environment of this process's Ray and of the processes it starts
(never in a file, a log or the results), so a process that knows a port but not the token is
refused on every call. Its processes end with this process, even when it is killed
(:mod:`fedlmc.simulations.engine.ray_reaper`). It waits longer than Ray's defaults for
what a loaded machine makes slow (:data:`LOCAL_SYSTEM_CONFIG`); a start that fails all the same
(Ray's own 30 s wait for its node to register is fixed in Ray 2.55) ends in one line saying
what happened and what to do (:class:`RayStartError`). Joining a cluster changes none of this:
the cluster's own ``ray start`` decides where it listens."""

from __future__ import annotations

import os
import secrets
import socket
import sys
from collections.abc import Mapping
from typing import Any

from fedlmc.simulations.config.threads import thread_environment, thread_variables
from fedlmc.simulations.engine.compat import (
    forget_token_authentication,
    loopback_node,
    ray_bootstrap_address,
    token_authentication,
)
from fedlmc.simulations.engine.ray_reaper import findable_processes, reap_when_this_process_dies

CONNECT_TIMEOUT = 5.0  # seconds to reach a --ray-address before refusing it
LOCAL_SYSTEM_CONFIG = {
    "worker_niceness": 0,  # the clients at this process's priority (init_ray's docstring)
    "raylet_start_wait_time_s": 60,  # a worker's wait for the raylet (Ray: 10 s)
    "worker_register_timeout_seconds": 180,  # a started worker's registration (Ray: 60 s)
}
"""Ray's ``_system_config`` of a local Ray: its start-up waits lengthened where Ray allows it."""


class ClusterError(ValueError):
    """No Ray cluster answers at the given address, or none can host a client."""


class RayStartError(RuntimeError):
    """A local Ray did not start (e.g. its start-up wait ran out on a loaded machine): one line
    saying what Ray reported and what to do."""


def backend_config(
    config: Mapping[str, Any], ray_init_args: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Flower's backend config: per-client resources and the arguments of ``ray.init``."""
    init_args: dict[str, Any] = {"include_dashboard": False}
    init_args.update(ray_init_args or {})
    return {
        "client_resources": {
            "num_cpus": float(config["num-cpus"]),
            "num_gpus": float(config["num-gpus"]),
        },
        "init_args": init_args,
    }


def _address_host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a Ray address (``auto`` resolved the way Ray resolves it)."""
    if address == "auto":
        try:
            address = ray_bootstrap_address("auto") or ""
        except ConnectionError as err:
            raise ClusterError(
                f"--ray-address auto: no running Ray cluster found on this machine ({err}); "
                "start one with `ray start --head`, or give HOST:PORT"
            ) from None
    address = address.removeprefix("ray://")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_ray_address(address: str) -> None:
    """Refuse at once an address where nothing listens (``ray.init`` retries for minutes)."""
    target = _address_host_port(address)
    if target is None:
        raise ClusterError(
            f"--ray-address {address!r}: allowed: auto, HOST:PORT (the head's GCS port, 6379 "
            "by default) or ray://HOST:PORT"
        )
    try:
        with socket.create_connection(target, timeout=CONNECT_TIMEOUT):
            pass
    except OSError as err:
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise ClusterError(
            f"--ray-address {address}: no Ray cluster answers at {target[0]}:{target[1]} "
            f"({reason}); start one with `ray start --head --port {target[1]}` or fix the address"
        ) from None


def init_ray(
    ray_address: str | None,
    ray_init_args: Mapping[str, Any] | None = None,
    worker_threads: int = 1,
) -> None:
    """Start Ray locally or join the cluster at ``ray_address`` (no-op when Ray is already up).

    Ray's workers (the client slots) get ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ... =
    ``worker_threads`` (:mod:`fedlmc.simulations.config.threads`), whatever this process's
    environment says: a local Ray's inherit them from the environment ``ray.init`` starts it in
    (restored afterwards), a cluster's through the ``runtime_env``.

    As Flower's ``RayBackend.init_ray`` (which then finds Ray running): the driver's
    ``sys.path`` reaches the workers through ``PYTHONPATH``, logging at WARNING. A local Ray's
    workers inherit it from this process's environment; only a cluster's get it through a
    ``runtime_env`` (which, locally, would keep Ray from using its pre-started workers and
    cost about 2 s of start-up). A local Ray runs its workers, the clients, at this process's
    priority (Ray's default, ``nice 15``, lets any other job, and the server's own evaluation,
    take their CPU: on a shared 2-core machine the clients trained 3 times slower); a
    cluster keeps the setting its ``ray start`` gave it.
    """
    import ray

    if ray.is_initialized():
        return
    args: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": "WARNING",
        "log_to_driver": True,
    }
    args.update(ray_init_args or {})
    if ray_address:
        args["address"] = ray_address
    joining = bool(args.get("address")) and args["address"] != "local"
    if joining:
        check_ray_address(str(args["address"]))
    pythonpath = os.pathsep.join(sys.path)
    if os.environ.get("PYTHONPATH"):
        pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
    os.environ["PYTHONPATH"] = pythonpath
    threads = thread_variables(worker_threads)
    if joining:
        args.setdefault("runtime_env", {"env_vars": {"PYTHONPATH": pythonpath, **threads}})
        try:
            with thread_environment(worker_threads):
                ray.init(**args)
        except ConnectionError as err:
            raise ClusterError(f"--ray-address {ray_address}: {one_line(err)}") from None
        return
    # "local": a new Ray of this process's own, never the cluster a `ray start` on this
    # machine left behind (ray.init's default resolves an absent address to that one)
    args.setdefault("address", "local")
    args.setdefault("_system_config", dict(LOCAL_SYSTEM_CONFIG))
    start_local_ray(args, worker_threads)


def start_local_ray(args: Mapping[str, Any], worker_threads: int) -> None:
    """``ray.init(**args)`` of a local Ray on the loopback interface that admits only callers
    holding a token made for it (module docstring); :class:`RayStartError` when it fails to
    start, Ray's token mode then forgotten
    (:func:`fedlmc.simulations.engine.compat.forget_token_authentication`)."""
    import ray

    token = secrets.token_hex(32)  # 256 bits, as Ray's own generate_new_authentication_token
    reap_when_this_process_dies(token)  # its processes end with this one, even a killed one
    try:  # the workers inherit all four
        with (
            thread_environment(worker_threads),
            loopback_node(),
            token_authentication(token),
            findable_processes(),  # the reaper can read the token of every one of them
        ):
            ray.init(**args)
    except Exception as err:  # noqa: BLE001 - Ray raises bare exceptions: one line for each
        if ray.is_initialized():
            ray.shutdown()
        forget_token_authentication()  # a later plain ray.init of this process works
        raise RayStartError(start_failure(err)) from None


def one_line(err: BaseException) -> str:
    """An exception's text on one line."""
    return " ".join(str(err).split()) or type(err).__name__


def start_failure(err: BaseException) -> str:
    """What to tell the user when a local Ray did not start: Ray's reason, this machine's
    load, and what to do (a timed-out start on a loaded machine: wait for a quieter moment;
    the results already written stay, and a sweep resumes where it stopped)."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    reason = f"{type(err).__name__}: {one_line(err)}"
    if "timed out" in reason.lower():
        advice = (
            f"this machine is loaded (load average {load:.1f} on {cores} cores) and Ray's "
            "start-up wait ran out: nothing ran; try again when it is quieter"
        )
    else:
        advice = "nothing ran; fix the cause above and try again"
    return f"Ray did not start ({reason}); {advice}"


def client_slots(client_resources: Mapping[str, float]) -> int:
    """How many ClientApp actors Flower starts for ``client_resources`` (its own count)."""
    import ray
    from flwr.simulation.ray_transport.ray_actor import pool_size_from_resources

    try:
        return pool_size_from_resources(dict(client_resources))
    except ValueError:
        total = ray.cluster_resources()
        raise ClusterError(
            f"num-cpus = {client_resources['num_cpus']:g}, num-gpus = "
            f"{client_resources['num_gpus']:g}: no Ray node can host one client (cluster: "
            f"{total.get('CPU', 0):g} CPUs, {total.get('GPU', 0):g} GPUs); lower them"
        ) from None


def resources_of(config: Mapping[str, Any]) -> tuple[float, float]:
    """``(num-cpus, num-gpus)``: what one client slot of ``config`` asks Ray for."""
    return float(config["num-cpus"]), float(config["num-gpus"])
