"""What a process of a sweep or of the test suite pays before it does fedlmc's work: the
start-up costs of the libraries it stands on, each timed in a fresh process.

Every step below runs ``--repeats`` times, each in a new Python process (the steps alternate,
so the machine's load falls on all alike); the process does the step's untimed set-up, then
times the step (wall and this process's CPU seconds) and prints them as JSON:

- ``import torch``: what every training, evaluating or merging process loads;
- ``first optimizer``: after ``import torch``, constructing the first ``torch.optim.SGD``.
  ``Optimizer.__init__`` calls ``add_param_group``, which PyTorch wraps in
  ``torch._disable_dynamo``; that wrapper imports ``torch._dynamo`` (and with it SymPy) on its
  first call, whether or not anything is compiled (``step`` imports it too, through
  ``_use_grad_for_differentiable``): every process that trains pays it once;
- ``import fedlmc's training``: after ``import torch``, what a ClientApp imports of fedlmc to
  train (``fedlmc.simulations.task``, ``fedlmc.train``, and what they import beyond torch,
  tqdm among them), for comparison;
- ``import the Ray actor class``: after ``import ray``, Flower's
  ``flwr.simulation.ray_transport.ray_actor``, which a Ray client actor imports to unpickle its
  class (``flwr.simulation``'s package imports the SuperLink, its state and the CLI);
  ``import the ClientApp's Flower``: after ``import ray``, the Flower modules fedlmc's ClientApp
  needs (``flwr.app``, ``flwr.clientapp``), for comparison;
- ``start Ray (plain ray.init)``: ``ray.init(address="local", include_dashboard=False)``, the
  least a local Ray costs; ``start Ray (fedlmc's init_ray)``: fedlmc's start of a local Ray
  (:func:`fedlmc.simulations.engine.ray_runtime.init_ray`: the same plus its reaper process,
  the token authentication and its system config); the CPU column is the driver's alone, not
  the Ray processes';
- ``stop Ray``: ``ray.shutdown()`` after fedlmc's start, with the time it spends on each of
  Ray's process types (each is sent SIGTERM and given up to a second before it is killed).

    python benchmarks/process_startup.py --repeats 5

Prints the medians and writes ``--json``. Single-machine figures: compare them within a run
(each run records the speed of a float32 matrix product and of a Python loop, the load, the
versions of PyTorch, Flower and Ray, and the caller's thread variables). The steps' processes
write and read bytecode caches whatever the caller's shell says (``PYTHONDONTWRITEBYTECODE``
would make every process compile fedlmc again) and get fedlmc first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from machine import machine_speed, write_result

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "process_startup.json"

# a step's process: its untimed set-up, then the timed step, its seconds printed as JSON
CHILD = """
import json, time
{setup}
wall, cpu = time.perf_counter(), time.process_time()
{step}
print(json.dumps({{"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu{extra}}}))
"""

_RAY_SETUP = """
import ray
import ray._private.node as ray_node
from fedlmc.simulations.engine.ray_runtime import init_ray
kill_seconds = {}
kill_process_type = ray_node.Node._kill_process_type
def timed_kill(self, process_type, *args, **kwargs):
    start = time.perf_counter()
    kill_process_type(self, process_type, *args, **kwargs)
    elapsed = time.perf_counter() - start
    kill_seconds[process_type] = kill_seconds.get(process_type, 0.0) + elapsed
ray_node.Node._kill_process_type = timed_kill
"""

STEPS: dict[str, dict[str, str]] = {
    "import torch": {"setup": "", "step": "import torch"},
    "first optimizer": {
        "setup": "import torch\nmodel = torch.nn.Linear(4, 4)",
        "step": "torch.optim.SGD(model.parameters(), lr=0.1)",
    },
    "import fedlmc's training": {
        "setup": "import torch",
        "step": "import fedlmc.simulations.task, fedlmc.train",
    },
    "import the Ray actor class": {
        "setup": "import ray",
        "step": "import flwr.simulation.ray_transport.ray_actor",
    },
    "import the ClientApp's Flower": {
        "setup": "import ray",
        "step": "import flwr.app, flwr.clientapp.client_app",
    },
    "start Ray (plain ray.init)": {
        "setup": "import ray",
        "step": 'ray.init(address="local", include_dashboard=False, logging_level="WARNING")',
    },
    "start Ray (fedlmc's init_ray)": {"setup": _RAY_SETUP, "step": "init_ray(None)"},
    "stop Ray": {
        "setup": _RAY_SETUP + "init_ray(None)",
        "step": "ray.shutdown()",
        "extra": ', "kills": kill_seconds',
    },
}
STEP_TIMEOUT_SECONDS = 300
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def step_environment() -> dict[str, str]:
    """The steps' environment: the caller's, with fedlmc first on ``PYTHONPATH``, bytecode
    caches written and read, and Ray's usage statistics off."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def run_step(name: str) -> dict[str, Any]:
    """One fresh process doing ``name``'s set-up and timing its step: ``{"wall": s, "cpu":
    s}`` (and ``"kills"`` for ``stop Ray``)."""
    spec = STEPS[name]
    code = CHILD.format(setup=spec["setup"], step=spec["step"], extra=spec.get("extra", ""))
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=step_environment(),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=STEP_TIMEOUT_SECONDS,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(lines[-1])


def versions() -> dict[str, str]:
    """The versions of the libraries whose start-ups are timed."""
    from importlib.metadata import version

    return {name: version(name) for name in ("torch", "flwr", "ray")}


def shutdown_by_process_type(stops: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per Ray process type, the median over the runs of the seconds ``ray.shutdown`` spent
    on it (a type a run did not stop counts as 0)."""
    kinds = dict.fromkeys(kind for stop in stops for kind in stop["kills"])
    return {k: statistics.median(s["kills"].get(k, 0.0) for s in stops) for k in kinds}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="processes per step (default 5)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}; allowed: >= 1")
    load_before = os.getloadavg()[0]
    speed = machine_speed()
    runs: dict[str, list[dict]] = {name: [] for name in STEPS}
    for _ in range(args.repeats):
        for name in STEPS:
            runs[name].append(run_step(name))
    print(
        f"float32 matmul {speed['matmul_gflops']:.0f} GFLOP/s, Python loop "
        f"{speed['python_loop_seconds']:.2f} s, load {load_before:.1f}"
    )
    print(f"{'step':<32} {'wall s':>8} {'CPU s':>8}")
    medians = {}
    for name, measured in runs.items():
        wall = statistics.median(m["wall"] for m in measured)
        cpu = statistics.median(m["cpu"] for m in measured)
        medians[name] = {"wall": wall, "cpu": cpu}
        print(f"{name:<32} {wall:8.2f} {cpu:8.2f}")
    kills = shutdown_by_process_type(runs["stop Ray"])
    print("ray.shutdown per process type: " + ", ".join(f"{k} {v:.2f} s" for k, v in kills.items()))
    record = {
        "repeats": args.repeats,
        "machine": speed,
        "versions": versions(),
        "caller_thread_variables": {k: os.environ.get(k) for k in THREAD_VARIABLES},
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "median_seconds": medians,
        "shutdown_median_seconds_by_process_type": kills,
        "runs": runs,
    }
    write_result(args.json, record)


if __name__ == "__main__":
    main()
