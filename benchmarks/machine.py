"""What the benchmarks record about the machine and how they write their results: the speed
of this machine now (a float32 matrix product and a Python loop, with the load average), so
that a slow day's seconds can be read against a normal day's, and the JSON record, written
the same way by every script that uses it (``process_startup.py``, ``forward_start.py``,
``weight_matching_speed.py``, ``weight_matching.py``)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def machine_speed() -> dict[str, float]:
    """GFLOP/s of a float32 2,048 x 2,048 product (best of 3, every core), the seconds of a
    ten-million-step Python loop and the 1-minute load average."""
    import numpy as np

    a = np.random.default_rng(0).random((2048, 2048), dtype=np.float32)
    best = min(timed(lambda: a @ a) for _ in range(3))
    total = 0

    def loop() -> None:
        nonlocal total
        for i in range(10_000_000):
            total += i

    return {
        "matmul_gflops": 2 * 2048**3 / best / 1e9,
        "python_loop_seconds": timed(loop),
        "load_average": os.getloadavg()[0],
    }


def timed(task: Callable[[], object]) -> float:
    """Wall seconds of ``task()``."""
    start = time.perf_counter()
    task()
    return time.perf_counter() - start


def write_result(path: Path, record: dict[str, Any]) -> None:
    """``record`` as indented JSON at ``path`` (its folder created), and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
