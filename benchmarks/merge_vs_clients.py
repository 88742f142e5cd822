r"""Benchmark: the server's merge and evaluation time against the number of clients N.

For each N (default 2, 4, 8, 16, 32, 64) the embedded MNIST pool (3,600 digits) is split IID
among N clients; each trains its own independently initialised bias-free 3-hidden-layer MLP
(hidden ``128 * width``, default width 0.25: 32 units) for ``--epochs`` epochs, so the total
training work is the same at every N. The server's side is then timed exactly as a sweep cell
runs it: ``fedlmc.study.compare_methods`` on ``average_t``, ``weight_matching_t`` and
``merge_many_t`` (plus the ``ensemble`` reference) with diagnostics on (``--lambdas`` points on
every path), split into its stages by the progress messages it emits:

- ``predict_clients``: every client's logits on the test and server splits (the endpoints and
  the ensembles): N forward passes, linear in N by necessity;
- ``merge`` (per method): the alignment and averaging, then the merged model's evaluation;
- ``client_paths`` (per method, N > 2): the barriers on the clients' paths to the merge;
- ``pairwise`` (per method, 3 <= N <= ``PAIRWISE_MAX_CLIENTS``): inside ``client_paths``;
- ``diagnostics`` (per method): LEWC/LLFC per layer, orthogonality, ReLU additivity.

Times: CPU seconds of this process (every thread), which measure the work whatever else loads
the machine, and wall seconds. Growth: a least-squares fit of :math:`\log t = a + k \log N`
over the N values (``exponent`` k: 1 is linear). The merge must read every client, so linear
growth is the floor for ``predict_clients`` and every merge; ``weight_matching`` solves N - 1
assignments per layer and ``merge_many`` N per pass (times the passes it needs).

    python benchmarks/merge_vs_clients.py                       # N = 2..64, width 0.25
    python benchmarks/merge_vs_clients.py --clients 2 4 --epochs 1 --out /tmp/m.json \
        --figure /tmp/m.png                                      # quick
    python benchmarks/merge_vs_clients.py --redraw             # the figure from the JSON
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from collections import defaultdict
from pathlib import Path

import torch

from fedlmc.analysis.paths import CLIENT_PATHS_MAX_CLIENTS
from fedlmc.data.loading import load_dataset, partition
from fedlmc.models.classifiers import build_model
from fedlmc.study.compare import PAIRWISE_MAX_CLIENTS, compare_methods
from fedlmc.train import train_model

DEFAULT_OUT = Path(__file__).parent / "results" / "merge_vs_clients.json"
DEFAULT_FIGURE = Path(__file__).parents[1] / "docs" / "merge_vs_clients" / "merge_vs_clients.png"
METHODS = ["average_t", "weight_matching_t", "merge_many_t", "ensemble"]
TIMED = ["average", "weight_matching", "merge_many"]
STAGE_OF_MESSAGE = {
    "predicting client": "predict_clients",
    "merging": "merge",
    "client barriers": "client_paths",
    "diagnostics": "diagnostics",
}


def train_clients(count: int, width: float, epochs: int, seed: int, splits) -> list[dict]:
    """``count`` IID clients of the fixed pool, each its own seeded initialisation."""
    states = []
    for i, data in enumerate(partition(splits.train, count, "iid", seed=seed)):
        torch.manual_seed(1000 * seed + i)
        model = build_model("mlp", width=width, bias=False)
        train_model(model, data, epochs=epochs, lr=0.05, weight_decay=3e-3, batch_size=32, seed=i)
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return states


class StageClock:
    """Wall and CPU seconds per stage, from the one-line progress messages of
    ``compare_methods``: each message starts a stage that lasts until the next message (or
    :meth:`stop`). CPU seconds (this process, every thread) measure the work done whatever else
    loads the machine; wall seconds what a user waits."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self._stage: str | None = None
        self._since = (time.perf_counter(), time.process_time())

    def __call__(self, message: str) -> None:
        self.stop()
        head, _, method = message.partition(": ")
        stage = next((s for m, s in STAGE_OF_MESSAGE.items() if head.startswith(m)), head)
        self._stage = f"{stage}:{method}" if method else stage

    def stop(self) -> None:
        now = (time.perf_counter(), time.process_time())
        if self._stage is not None:
            self.wall[self._stage] += now[0] - self._since[0]
            self.cpu[self._stage] += now[1] - self._since[1]
        self._stage, self._since = None, now


def warm_up_solver() -> None:
    """Load the compiled assignment solver before any timing (its first call compiles)."""
    from fedlmc.permutation import permutation_spec
    from fedlmc.permutation.matching import weight_matching

    tiny = [build_model("mlp", width=0.125, depth=1).state_dict() for _ in range(2)]
    weight_matching(permutation_spec(build_model("mlp", width=0.125, depth=1)), *tiny)


def measure(count: int, width: float, epochs: int, lambdas: int, seed: int, splits) -> dict:
    start = time.perf_counter()
    states = train_clients(count, width, epochs, seed, splits)
    train_seconds = time.perf_counter() - start
    clock = StageClock()
    start, cpu_start = time.perf_counter(), time.process_time()
    rows = compare_methods(
        build_model("mlp", width=width, bias=False),
        states,
        None,
        splits,
        METHODS,
        lambdas=lambdas,
        seed=seed,
        diagnostics=True,
        progress=clock,
    ).rows
    clock.stop()
    total, cpu_total = time.perf_counter() - start, time.process_time() - cpu_start
    by = {r["method"]: r for r in rows}
    return {
        "clients": count,
        "train_seconds": train_seconds,
        "server_seconds": total,
        "server_cpu_seconds": cpu_total,
        "stages": dict(clock.wall),
        "stages_cpu": dict(clock.cpu),
        "merge_seconds": {m: by[f"{m}_t"]["merge_seconds"] for m in TIMED},
        "accuracy": {m: by[m]["accuracy"] for m in METHODS},
        "endpoint_acc_mean": by["ensemble"]["endpoint_acc_mean"],
    }


def exponent(counts: list[int], seconds: list[float]) -> float:
    r"""Least-squares slope :math:`k` of :math:`\log t` on :math:`\log N` (NaN for fewer than two
    points or a non-positive time)."""
    if len(counts) < 2 or min(seconds) <= 0:
        return float("nan")
    xs = [math.log(n) for n in counts]
    ys = [math.log(t) for t in seconds]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den


def growth(results: list[dict], cpu: bool) -> dict[str, dict]:
    """Per timed quantity (CPU seconds, or wall seconds): seconds at every N and the fitted
    exponent (over the N where the quantity was measured)."""
    counts = [r["clients"] for r in results]
    stages = "stages_cpu" if cpu else "stages"
    total = "server_cpu_seconds" if cpu else "server_seconds"
    series = {"server_total": [r[total] for r in results]}
    for stage in sorted({s for r in results for s in r[stages]}):
        series[stage] = [r[stages].get(stage, 0.0) for r in results]
    if not cpu:
        for method in TIMED:
            series[f"merge_seconds:{method}"] = [r["merge_seconds"][method] for r in results]
    out = {}
    for name, values in series.items():
        kept = [(n, t) for n, t in zip(counts, values, strict=True) if t > 0]
        out[name] = {
            "seconds": values,
            "exponent": exponent([n for n, _ in kept], [t for _, t in kept]),
        }
    return out


def stage_totals(result: dict, prefix: str) -> float:
    """CPU seconds of every stage whose name starts with ``prefix`` (summed over methods)."""
    return sum(v for k, v in result["stages_cpu"].items() if k.startswith(prefix))


def draw(summary: dict, path: Path) -> Path:
    """Log-log CPU seconds against N: the server's total and its stages, with a line of
    slope 1 (linear growth) through the total's first point."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = summary["results"]
    counts = [r["clients"] for r in results]
    prefixes = {
        "client predictions": "predict_clients",
        "average (merge + eval)": "merge:average",
        "weight matching (merge + eval)": "merge:weight_matching",
        "MergeMany (merge + eval)": "merge:merge_many",
        "client -> merge paths, 3 methods": "client_paths",
        "diagnostics, 3 methods": "diagnostics",
    }
    series = {"server total": [r["server_cpu_seconds"] for r in results]}
    for label, prefix in prefixes.items():
        series[label] = [stage_totals(r, prefix) for r in results]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, values in series.items():
        kept = [(n, t) for n, t in zip(counts, values, strict=True) if t > 0]
        if kept:
            k = exponent([n for n, _ in kept], [t for _, t in kept])
            ax.plot(*zip(*kept, strict=True), marker="o", label=f"{label} (N^{k:.2f})")
    first = series["server total"][0]
    ax.plot(counts, [first * n / counts[0] for n in counts], "k:", label="linear in N")
    ax.set(xscale="log", yscale="log", xlabel="clients N", ylabel="server CPU seconds")
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_title(f"server merge + evaluation, {summary['hidden']} hidden units")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    parser.add_argument("--width", type=float, default=0.25)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lambdas", type=int, default=11)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: the growth, not the "
        "parallelism; on a loaded machine more threads mostly wait)",
    )
    parser.add_argument("--note", default="", help="free text stored with the results")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--figure", type=Path, default=DEFAULT_FIGURE)
    parser.add_argument(
        "--redraw", action="store_true", help="only draw the figure from the JSON in --out"
    )
    args = parser.parse_args()
    if args.redraw:
        print(f"written: {draw(json.loads(args.out.read_text()), args.figure)}")
        return
    torch.set_num_threads(args.threads)
    splits = load_dataset("mnist5k")
    warm_up_solver()
    results = []
    print(
        " N  train s  server s  server cpu s  predict cpu s  avg cpu s  wm cpu s  mm cpu s  "
        "paths cpu s  endpoints  avg_t  mm_t"
    )
    for count in args.clients:
        found = measure(count, args.width, args.epochs, args.lambdas, args.seed, splits)
        results.append(found)
        cpu, acc = found["stages_cpu"], found["accuracy"]
        paths = sum(v for k, v in cpu.items() if k.startswith("client_paths"))
        print(
            f"{count:2d}  {found['train_seconds']:7.1f}  {found['server_seconds']:8.1f}  "
            f"{found['server_cpu_seconds']:12.1f}  {cpu.get('predict_clients', 0.0):13.2f}  "
            f"{cpu.get('merge:average', 0.0):9.2f}  {cpu.get('merge:weight_matching', 0.0):8.2f}  "
            f"{cpu.get('merge:merge_many', 0.0):8.2f}  {paths:11.2f}  "
            f"{found['endpoint_acc_mean']:9.3f}  {acc['average_t']:.3f}  {acc['merge_many_t']:.3f}"
        )
    fitted = growth(results, cpu=True)
    print("growth exponents of CPU seconds (t ~ N^k):")
    for name, entry in fitted.items():
        print(f"  {name:36s} k = {entry['exponent']:.2f}")
    summary = {
        "width": args.width,
        "hidden": round(128 * args.width),
        "epochs": args.epochs,
        "lambdas": args.lambdas,
        "seed": args.seed,
        "pairwise_max_clients": PAIRWISE_MAX_CLIENTS,
        "client_paths_max_clients": CLIENT_PATHS_MAX_CLIENTS,
        "machine": f"{platform.machine()} ({torch.get_num_threads()} threads)",
        "note": args.note,
        "results": results,
        "growth_cpu": fitted,
        "growth_wall": growth(results, cpu=False),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"written: {args.out}, {draw(summary, args.figure)}")


if __name__ == "__main__":
    main()
