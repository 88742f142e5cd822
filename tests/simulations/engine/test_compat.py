"""The private APIs of Python and Ray behind :mod:`fedlmc.simulations.engine.compat`: each test
fails when the private API it wraps changes (its signature, checked with ``inspect``, or what it
does, exercised for real)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from fedlmc.simulations.engine.compat import ray_bootstrap_address

ROOT = Path(__file__).resolve().parents[3]
POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD


def parameters(func) -> list[tuple[str, inspect._ParameterKind]]:
    return [(p.name, p.kind) for p in inspect.signature(func).parameters.values()]


def test_threading_still_has_register_atexit_with_its_signature():
    assert parameters(threading._register_atexit) == [
        ("func", POSITIONAL),
        ("arg", inspect.Parameter.VAR_POSITIONAL),
        ("kwargs", inspect.Parameter.VAR_KEYWORD),
    ]


@pytest.mark.slow
def test_registered_function_runs_before_the_non_daemon_threads_are_joined():
    """A non-daemon thread waits for an event that only the registered function sets: the
    process exits only if the function runs before the interpreter joins that thread."""
    code = textwrap.dedent(
        """
        import threading
        from fedlmc.simulations.engine.compat import register_before_thread_join

        release = threading.Event()
        def waiter():
            release.wait()
            print("thread released", flush=True)
        threading.Thread(target=waiter).start()
        def before_join():
            print("before join", flush=True)
            release.set()
        register_before_thread_join(before_join)
        print("main done", flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["main done", "before join", "thread released"]


def test_ray_still_canonicalises_bootstrap_addresses():
    from ray._private.services import canonicalize_bootstrap_address

    assert parameters(canonicalize_bootstrap_address) == [
        ("addr", POSITIONAL),
        ("temp_dir", POSITIONAL),
    ]


def test_ray_bootstrap_address_resolves_auto_from_ray_address(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6391")
    host, _, port = ray_bootstrap_address("auto").rpartition(":")
    assert port == "6391" and host  # localhost resolved to this node's address
    assert ray_bootstrap_address("local") is None
    monkeypatch.delenv("RAY_ADDRESS")
    assert ray_bootstrap_address("10.1.2.3:6379") == "10.1.2.3:6379"


def test_ray_takes_a_loopback_node_address_while_clusters_are_off(monkeypatch):
    """Ray's node address (what its servers bind to) is 127.0.0.1 inside ``loopback_node``
    and this machine's reachable address outside it (no Ray node runs in this process)."""
    import ray
    from ray._private import ray_constants, services

    from fedlmc.simulations.engine.compat import CLUSTER_VARIABLE, loopback_node

    assert not ray.is_initialized()  # else Ray answers with the running node's address
    monkeypatch.delenv(CLUSTER_VARIABLE, raising=False)
    assert isinstance(ray_constants.ENABLE_RAY_CLUSTER, bool)
    before = ray_constants.ENABLE_RAY_CLUSTER
    with loopback_node():
        assert services.get_node_ip_address() == "127.0.0.1"
        assert os.environ[CLUSTER_VARIABLE] == "0"
    assert ray_constants.ENABLE_RAY_CLUSTER == before and CLUSTER_VARIABLE not in os.environ


@pytest.mark.slow
def test_token_authentication_turns_on_ray_token_mode_after_ray_is_imported():
    """Ray read ``RAY_AUTH_MODE`` when it was imported; inside the block its mode is ``token``
    with the given token (what a node started there requires), and the environment is put
    back afterwards. In a fresh interpreter: the mode stays on in the process that set it."""
    code = textwrap.dedent(
        """
        import os
        import ray
        from ray._raylet import (
            AuthenticationMode, AuthenticationTokenLoader, get_authentication_mode,
        )
        from fedlmc.simulations.engine.compat import token_authentication

        loader = AuthenticationTokenLoader.instance()
        print(get_authentication_mode() == AuthenticationMode.TOKEN)
        with token_authentication("ab" * 32):
            print(get_authentication_mode() == AuthenticationMode.TOKEN)
            print(loader.get_raw_token() == "ab" * 32, os.environ["RAY_AUTH_MODE"])
        print(sorted(k for k in os.environ if k.startswith("RAY_AUTH")))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = "/nonexistent"  # no ~/.ray/auth_token
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:4] == ["False", "True", "True token", "[]"], out.stdout


@pytest.mark.slow
def test_a_plain_ray_after_the_local_ray_has_working_actors():
    """A local Ray (token mode) shut down, then a plain ``ray.init`` in the same process (as
    Flower's own ``run_simulation`` does): its actors answer. Before the engine's reset Ray
    stayed in token mode with the old token and the actor died at once ("The actor died
    unexpectedly before finishing this task"). In a fresh interpreter."""
    code = textwrap.dedent(
        """
        import ray
        from fedlmc.simulations.engine import ray_runtime
        from fedlmc.simulations.engine.compat import forget_token_authentication

        ray_runtime.start_local_ray(
            {"address": "local", "num_cpus": 1, "include_dashboard": False,
             "_system_config": dict(ray_runtime.LOCAL_SYSTEM_CONFIG)}, 1,
        )

        @ray.remote
        class Echo:
            def value(self):
                return 5

        print("token", ray.get(Echo.remote().value.remote(), timeout=60))
        ray.shutdown()
        forget_token_authentication()  # what the engine does after each simulation
        ray.init(num_cpus=1, include_dashboard=False)
        print("plain", ray.get(Echo.remote().value.remote(), timeout=60))
        ray.shutdown()
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = "/nonexistent"  # no ~/.ray/auth_token
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env, timeout=240
    )
    assert out.stdout.split() == ["token", "5", "plain", "5"], out.stderr[-2000:]
