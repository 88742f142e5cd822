"""What a process of a sweep or of the test suite pays before it does fedlmc's work: the
start-up costs of the libraries it stands on, each timed in a fresh process.

Every step below runs ``--repeats`` times, each in a new Python process (the steps alternate,
so the machine's load falls on all alike); the process does the step's untimed set-up, then
times the step (wall and this process's CPU seconds) and prints them as JSON:

- ``import torch``: what every training, evaluating or merging process loads;
- ``first optimizer``: after ``import torch``, constructing the first ``torch.optim.SGD``.
  PyTorch wraps ``Optimizer.__init__`` and ``step`` in ``torch._disable_dynamo``, which imports
  ``torch._dynamo`` (and with it SymPy and ``torch.distributed``) on the first call, whether or
  not anything is compiled: every process that trains pays it once;
- ``import fedlmc's training``: after ``import torch``, what a ClientApp imports of fedlmc to
  train (``fedlmc.simulations.task``, ``fedlmc.train``): fedlmc's own share, for comparison;
- ``import the Ray actor class``: after ``import ray``, Flower's
  ``flwr.simulation.ray_transport.ray_actor``, which a Ray client actor imports to unpickle its
  class (``flwr.simulation``'s package imports the SuperLink, its state and the CLI);
  ``import the ClientApp's Flower``: after ``import ray``, the Flower modules fedlmc's ClientApp
  needs (``flwr.app``, ``flwr.clientapp``), for comparison;
- ``start a local Ray`` / ``stop it``: fedlmc's ``init_ray`` of a local Ray (the driver's wall
  time; the CPU column is the driver's alone, not the Ray processes') and ``ray.shutdown()``,
  with the time ``ray.shutdown`` spends on each of Ray's process types (each is sent SIGTERM
  and given up to a second before it is killed).

    python benchmarks/process_startup.py --repeats 5

Prints the medians and writes ``--json``. Single-machine figures: compare them within a run
(each run records the speed of a float32 matrix product and of a Python loop, and the load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "process_startup.json"

_TIMED = """
import json, time
{setup}
wall, cpu = time.perf_counter(), time.process_time()
{step}
print(json.dumps({{"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu{extra}}}))
"""

_RAY_SETUP = """
import ray
import ray._private.node as node
from fedlmc.simulations.engine.ray_runtime import init_ray
kills = {}
kill = node.Node._kill_process_type
def timed_kill(self, process_type, *args, **kwargs):
    start = time.perf_counter()
    kill(self, process_type, *args, **kwargs)
    kills[process_type] = time.perf_counter() - start
node.Node._kill_process_type = timed_kill
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
    "start a local Ray": {"setup": _RAY_SETUP, "step": "init_ray(None)\n"},
    "stop it": {
        "setup": _RAY_SETUP + "init_ray(None)",
        "step": "ray.shutdown()",
        "extra": ', "kills": kills',
    },
}


def run_step(name: str) -> dict:
    """One fresh process doing ``name``'s set-up and timing its step."""
    spec = STEPS[name]
    code = _TIMED.format(setup=spec["setup"], step=spec["step"], extra=spec.get("extra", ""))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT
    )
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def machine_speed() -> dict[str, float]:
    """GFLOP/s of a float32 2,048 x 2,048 product (best of 3, every core) and the seconds of a
    ten-million-step Python loop, to read the run's figures against other days'."""
    import numpy as np

    a = np.random.default_rng(0).random((2048, 2048), dtype=np.float32)
    best = min(_timed(lambda: a @ a) for _ in range(3))
    total = 0

    def loop() -> None:
        nonlocal total
        for i in range(10_000_000):
            total += i

    return {"matmul_gflops": 2 * 2048**3 / best / 1e9, "python_loop_seconds": _timed(loop)}


def _timed(task) -> float:
    start = time.perf_counter()
    task()
    return time.perf_counter() - start


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
    kills = {
        kind: statistics.median(m["kills"][kind] for m in runs["stop it"])
        for kind in runs["stop it"][0]["kills"]
    }
    print("ray.shutdown per process type: " + ", ".join(f"{k} {v:.2f} s" for k, v in kills.items()))
    record = {
        "repeats": args.repeats,
        "machine": speed,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "median_seconds": medians,
        "shutdown_median_seconds_by_process_type": kills,
        "runs": runs,
    }
    args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
