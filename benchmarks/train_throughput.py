"""Training throughput of ``fedlmc.train.train_model`` versus two baselines timed in the same run.

Pipelines, all training the same ``build_model("mlp", width=w)`` on the embedded mnist5k training
pool with SGD (momentum 0.9, weight decay 3e-3) and a per-batch one-cycle schedule:

- ``train_model``: fedlmc's loop (data on the device once, batches by ``index_select``, torch's
  fused SGD kernel, NaN checks, history);
- ``dataloader``: the torchvision-style pipeline, a ``Dataset`` returning one uint8 image at a time
  through ``transforms.ToTensor()`` + ``Normalize`` in a shuffling ``DataLoader`` (num_workers=0);
- ``bare``: a minimal tensor-slicing loop (randperm, ``x[idx]``, forward, backward, step).

The two baselines build ``torch.optim.SGD`` and ``OneCycleLR`` by hand, as a user would.

Each repeat builds a fresh model, runs one untimed warm-up epoch, then times ``--epochs`` epochs.
samples/s is the best over ``--repeats`` (the machine is shared; the best is the least disturbed),
the median is stored in the JSON too. On the CPU samples/s divides by this process's CPU time
(``--clock auto``), which is far less noisy than wall time on a shared machine (run with
``OMP_NUM_THREADS=1``; with more threads CPU time adds up over threads); on CUDA it is wall time.
Both are stored in the JSON. Usage::

    OMP_NUM_THREADS=1 python benchmarks/train_throughput.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

from fedlmc.data.loading import NORMALISATION, load_dataset
from fedlmc.evaluation import resolve_device
from fedlmc.models.classifiers import build_model
from fedlmc.train import train_model

LR, WEIGHT_DECAY, MOMENTUM = 0.05, 3e-3, 0.9
DEFAULT_OUT = Path(__file__).parent / "results" / "train_throughput.json"


class UInt8Digits(Dataset):
    """One (1, 28, 28) float image per index, from uint8 pixels via ToTensor + Normalize
    (the same values as fedlmc.data's normalised tensors)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images, self.labels = images, labels
        self.transform = transforms.Compose(
            [transforms.ToTensor(), transforms.Normalize(*NORMALISATION["mnist5k"])]
        )

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        return self.transform(self.images[i]), int(self.labels[i])


def as_uint8_images(x: Tensor) -> np.ndarray:
    """Undo mnist5k's normalisation: (N, 1, H, W) floats -> the original (N, H, W, 1) uint8."""
    mean, std = NORMALISATION["mnist5k"]
    pixels = ((x * std[0] + mean[0]) * 255).round().clamp(0, 255).to(torch.uint8)
    return pixels.permute(0, 2, 3, 1).contiguous().numpy()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clocks() -> dict[str, float]:
    """Wall-clock and this process's CPU time (the latter is robust on a shared CPU machine)."""
    return {"wall": time.perf_counter(), "cpu": time.process_time()}


def elapsed(start: dict[str, float]) -> dict[str, float]:
    now = clocks()
    return {k: now[k] - start[k] for k in start}


def timed_epochs(epoch, epochs: int, device: torch.device) -> dict[str, float]:
    """Clock times of ``epochs`` calls of ``epoch`` after one untimed warm-up call."""
    epoch()
    sync(device)
    start = clocks()
    for _ in range(epochs):
        epoch()
    sync(device)
    return elapsed(start)


def fresh_setup(width: float, device: torch.device, steps: int):
    """A freshly initialised MLP with the optimiser and schedule a user would write by hand
    (plain ``torch.optim.SGD``; train_model itself picks torch's fused SGD kernel)."""
    torch.manual_seed(0)
    model = build_model("mlp", width=width).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=LR, total_steps=steps, cycle_momentum=False
    )
    return model, opt, sched


def sgd_step(model: nn.Module, opt, sched, xb: Tensor, yb: Tensor) -> None:
    loss = F.cross_entropy(model(xb), yb)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()


def time_train_model(data, width, epochs, batch_size, device) -> dict[str, float]:
    """Seconds of a train_model call of ``epochs`` epochs, after a 1-epoch warm-up call on the
    same model (as the baselines time their epochs after a warm-up epoch of the same model)."""
    torch.manual_seed(0)
    model = build_model("mlp", width=width)
    args = dict(lr=LR, weight_decay=WEIGHT_DECAY, batch_size=batch_size, device=device)
    train_model(model, data, epochs=1, **args)
    sync(device)
    start = clocks()
    train_model(model, data, epochs=epochs, **args)
    sync(device)
    return elapsed(start)


def time_dataloader(dataset, width, epochs, batch_size, device) -> dict[str, float]:
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=0,
        generator=torch.Generator().manual_seed(0),
    )
    model, opt, sched = fresh_setup(width, device, (epochs + 1) * len(loader))

    def epoch() -> None:
        for xb, yb in loader:
            sgd_step(model, opt, sched, xb.to(device), yb.to(device))

    return timed_epochs(epoch, epochs, device)


def time_bare(data, width, epochs, batch_size, device) -> dict[str, float]:
    x, y = data[0].to(device), data[1].to(device)
    n = len(x)
    model, opt, sched = fresh_setup(width, device, (epochs + 1) * -(-n // batch_size))

    def epoch() -> None:
        perm = torch.randperm(n, device=device)
        for i in range(0, n, batch_size):
            idx = perm[i : i + batch_size]
            sgd_step(model, opt, sched, x[idx], y[idx])

    return timed_epochs(epoch, epochs, device)


def measure(args: argparse.Namespace) -> list[dict]:
    device = resolve_device(args.device)
    train = load_dataset("mnist5k").train
    data = (train[0].float(), train[1].long())
    n = len(data[1])
    dataset = UInt8Digits(as_uint8_images(data[0]), data[1].numpy())
    rows = []
    for width in args.widths:
        timers: dict[str, Callable[[], dict[str, float]]] = {
            "train_model": lambda w=width: time_train_model(
                data, w, args.epochs, args.batch_size, device
            ),
            "dataloader": lambda w=width: time_dataloader(
                dataset, w, args.epochs, args.batch_size, device
            ),
            "bare": lambda w=width: time_bare(data, w, args.epochs, args.batch_size, device),
        }
        rates: dict[str, dict[str, list[float]]] = {
            name: {"wall": [], "cpu": []} for name in timers
        }
        for _ in range(args.repeats):  # interleaved so that machine noise hits all pipelines
            for name, timer in timers.items():
                for clock, seconds in timer().items():
                    rates[name][clock].append(n * args.epochs / seconds)
        best = {name: max(r[args.clock]) for name, r in rates.items()}
        for name, r in rates.items():
            rows.append(
                {
                    "width": width,
                    "pipeline": name,
                    "clock": args.clock,
                    "samples_per_s": best[name],
                    "samples_per_s_median": statistics.median(r[args.clock]),
                    "samples_per_wall_s_all": r["wall"],
                    "samples_per_cpu_s_all": r["cpu"],
                    "ratio_vs_dataloader": best[name] / best["dataloader"],
                    "ratio_vs_bare": best[name] / best["bare"],
                }
            )
    return rows


def print_table(rows: list[dict]) -> None:
    rate = rows[0]["clock"] + " samples/s"
    print(f"{'width':>6} {'pipeline':<12} {rate:>15} {'vs DataLoader':>14} {'vs bare':>8}")
    for r in rows:
        print(
            f"{r['width']:>6g} {r['pipeline']:<12} {r['samples_per_s']:>15.0f} "
            f"{r['ratio_vs_dataloader']:>14.2f} {r['ratio_vs_bare']:>8.2f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--device", default=None, help="default: CUDA if available, else CPU")
    parser.add_argument(
        "--clock",
        choices=("auto", "wall", "cpu"),
        default="auto",
        help="time base of samples/s: cpu = process CPU time (robust on a shared CPU machine); "
        "auto = cpu on the CPU, wall on CUDA",
    )
    parser.add_argument("--quick", action="store_true", help="1 timed epoch, 2 repeats")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.repeats = 1, 2
    if args.clock == "auto":
        args.clock = "cpu" if resolve_device(args.device).type == "cpu" else "wall"
    rows = measure(args)
    print_table(rows)
    meta = {
        "device": str(resolve_device(args.device)),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "epochs": args.epochs,
        "repeats": args.repeats,
        "batch_size": args.batch_size,
        "statistic": "best of repeats",
        "clock": args.clock,
        "load_average_1min_at_end": os.getloadavg()[0],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
