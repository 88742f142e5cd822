r"""Benchmark: the field's merge methods (issue 42) against the plain average, on the server, and
the clients' Fisher and Gram passes.

For each width (default 4 and 16 times base 128: 512 and 2,048 hidden units) the embedded MNIST
pool (3,600 digits) is split IID among ``--clients`` (default 8) clients, each training a
bias-free 3-hidden-layer MLP for ``--epochs`` epochs twice: from one shared initialisation (the
base of Task Arithmetic, TIES and DARE) and from its own (the alignments' setting). Every merge
is then timed as :func:`fedlmc.merging.methods.merge_states` runs it, CPU seconds of this
process (every thread: the work whatever else loads the machine) and wall seconds, best of
``--repeats``:

- ``average`` (the baseline of every ratio), ``task_arithmetic``, ``ties``, ``dare`` on the
  shared clients; ``weight_matching``, ``merge_many``, ``cca_merge`` (on the server split's
  400 inputs), ``ot_fusion`` (POT's exact solver) on the independent ones;
- ``fisher``, ``regmean`` on the shared clients with in-memory clients
  (:class:`fedlmc.merging.clients.LocalClients`): the merge *and* every client's statistics
  pass (``fisher-samples`` / ``regmean-samples`` = 256 examples each), what a federation's
  clients compute in parallel, one after the other here;
- the passes alone, per client: the Fisher by ``torch.func`` (``vmap`` of ``grad``, one batched
  pass per chunk) against the same Fisher by one backward pass per example (the obvious loop,
  timed on 32 examples and scaled to 256), and the Gram matrices (one forward pass); with the
  bytes each client's answer holds.

- ``--screen-only``: only the server's side of a screened ``query.fisher`` / ``query.gram`` round
  and its merge (:class:`fedlmc.strategies.queries.ClientRounds` on replies encoded beforehand)
  and, in the same run, the statistics screen's own share of it (``ratio``: the round over the
  round without that share).

    python benchmarks/field_methods.py                            # 512 and 2,048 units, 8 clients
    python benchmarks/field_methods.py --widths 4 --screen-only \
        --out benchmarks/results/field_methods_screen.json       # the screen's share
    python benchmarks/field_methods.py --widths 1 --clients 2 --epochs 1 --out /tmp/f.json  # quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from fedlmc.averaging import load_state
from fedlmc.data.loading import load_dataset, partition
from fedlmc.merging.clients import LocalClients
from fedlmc.merging.field.fisher import bounded_sample, fisher_diagonal
from fedlmc.merging.field.regmean import gram_matrices, regmean_layers, solution_growth
from fedlmc.merging.methods import merge_states
from fedlmc.models.classifiers import build_model
from fedlmc.train import train_model

DEFAULT_OUT = Path(__file__).parent / "results" / "field_methods.json"
SHARED = ["average", "task_arithmetic", "ties", "dare", "fisher", "regmean"]
INDEPENDENT = ["average", "weight_matching", "merge_many", "cca_merge", "ot_fusion"]
SAMPLES = 256
LOOP_SAMPLES = 32


def train_clients(splits, width: float, count: int, epochs: int, shared: bool) -> tuple:
    """``count`` IID clients of the pool, from one initialisation (``shared``) or each its own;
    returns ``(template, states, data)``."""
    torch.manual_seed(0)
    template = build_model("mlp", width=width, bias=False)
    states, data = [], []
    for i, part in enumerate(partition(splits.train, count, "iid", seed=0)):
        torch.manual_seed(100 + i)
        model = build_model("mlp", width=width, bias=False)
        if shared:
            model.load_state_dict(template.state_dict())
        train_model(model, part, epochs=epochs, lr=0.05, weight_decay=3e-3, batch_size=128, seed=i)
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        data.append(part)
    return template, states, data


def timed(run, repeats: int) -> dict[str, float]:
    """Best CPU and wall seconds of ``repeats`` calls of ``run``."""
    cpu, wall = [], []
    for _ in range(repeats):
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        run()
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start_wall)
    return {"cpu_s": min(cpu), "wall_s": min(wall)}


def merge_timings(template, states, data, methods, splits, repeats) -> dict[str, dict]:
    """Every method of ``methods`` merged as the study merges, timed."""
    local = LocalClients(
        template,
        states,
        [x for x, _ in data],
        data,
        train_labels=[y for _, y in data],
        fisher_samples=SAMPLES,
        regmean_samples=SAMPLES,
    )
    counts = [len(y) for _, y in data]
    base = template.state_dict()
    found = {}
    for method in methods:
        print(f"  merging: {method}", flush=True)
        found[method] = timed(
            lambda m=method: merge_states(
                m, template, states, counts, server_data=splits.server, clients=local, base=base
            ),
            repeats,
        )
    return found


def fisher_by_loop(model: torch.nn.Module, x, y) -> None:
    """The Fisher by one backward pass per example (the baseline of the batched pass)."""
    for xi, yi in zip(x, y, strict=True):
        model.zero_grad()
        torch.log_softmax(model(xi[None]), dim=1)[0, yi].backward()
        for p in model.parameters():
            p.grad.square()


def pass_timings(template, states, data, repeats: int) -> dict[str, float]:
    """Per client (the first): the batched Fisher, the per-example loop (scaled to
    :data:`SAMPLES`), the Gram matrices, and their answers' bytes."""
    model = load_state(template, states[0]).eval()
    x, y = bounded_sample(*data[0], SAMPLES, 0)
    fisher = timed(lambda: fisher_diagonal(model, x, y), repeats)
    loop = timed(lambda: fisher_by_loop(model, x[:LOOP_SAMPLES], y[:LOOP_SAMPLES]), repeats)
    layers = regmean_layers(model)
    gram = timed(lambda: gram_matrices(model, x, layers), repeats)
    scale = SAMPLES / LOOP_SAMPLES
    parameters = sum(p.numel() for p in model.parameters())
    grams = sum(model.state_dict()[f"{n}.weight"].shape[1] ** 2 for n in layers)
    return {
        "fisher_vmap_cpu_s": fisher["cpu_s"],
        "fisher_vmap_wall_s": fisher["wall_s"],
        "fisher_loop_cpu_s": loop["cpu_s"] * scale,
        "fisher_loop_wall_s": loop["wall_s"] * scale,
        "gram_cpu_s": gram["cpu_s"],
        "gram_wall_s": gram["wall_s"],
        "fisher_bytes": 4 * parameters,
        "gram_bytes": 4 * grams,
        "weights_bytes": 4 * parameters,
    }


class AnsweringGrid:
    """Nodes ``0 .. N-1`` answer ``query.fisher`` / ``query.gram`` with the replies their
    ClientApps would send (encoded once, before the timing: the clients' side)."""

    def __init__(self, contents: dict[str, list]):
        self.contents = contents

    def send_and_receive(self, messages, *, timeout=None):
        from flwr.app import Message

        found = []
        for message in messages:
            kind = message.metadata.message_type.rsplit(".", 1)[-1]
            content = self.contents[kind][int(message.metadata.dst_node_id)]
            found.append(Message(content, reply_to=message))
        return found


def screened_query_timings(template, states, data, repeats: int) -> dict[str, dict]:
    """Server seconds of a screened ``query.fisher`` / ``query.gram`` round and its merge
    (:class:`fedlmc.strategies.queries.ClientRounds` on replies encoded beforehand, the default
    relative rule), and, in the same run, the statistics screen's own share: the Gram spectra
    or Fisher scales of every reply, their comparison and RegMean's growth check. ``ratio``:
    the round's time over the time without that share (fedlmc's query before the screen)."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from fedlmc.strategies.protocol import state_digest, statistics_to_content
    from fedlmc.strategies.queries import ClientRounds
    from fedlmc.strategies.robust import RobustScreen
    from fedlmc.strategies.statistics_screen import (
        check_gram_spectrum,
        fisher_scale,
        statistics_outliers,
    )
    from fedlmc.strategies.strategy_utils import ClientUpdate

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SUPERLINK_NODE_ID
    local = LocalClients(
        template,
        states,
        [x for x, _ in data],
        data,
        train_labels=[y for _, y in data],
        fisher_samples=SAMPLES,
        regmean_samples=SAMPLES,
    )
    layers = regmean_layers(template)
    answers = {"fisher": local.fisher_diagonals(), "gram": local.gram_matrices(layers)}
    contents = {
        kind: [
            statistics_to_content(a, state_digest(states[i]), {"partition-id": i})
            for i, a in enumerate(found)
        ]
        for kind, found in answers.items()
    }
    counts = [len(y) for _, y in data]
    updates = [ClientUpdate(i, i, s, counts[i], {}, 0) for i, s in enumerate(states)]
    found = {}
    for method, kind in (("fisher", "fisher"), ("regmean", "gram")):
        print(f"  screened query: {method}", flush=True)

        def round_and_merge(method=method):
            rounds = ClientRounds(
                AnsweringGrid(contents),
                updates,
                {},
                template=template,
                device="cpu",
                timeout=None,
                min_clients=2,
                robust=RobustScreen(),
            )
            merged, _ = merge_states(method, template, states, counts, clients=rounds)
            assert rounds.dropped == [], rounds.dropped
            return merged

        merged = round_and_merge()

        def screen_share(kind=kind, merged=merged):
            summaries = []
            for tensors in answers[kind]:
                check = check_gram_spectrum if kind == "gram" else lambda _, t: fisher_scale(t)
                summaries.append({k: check(k, v) for k, v in tensors.items()})  # as sent
            statistics_outliers(summaries, RobustScreen())
            if kind == "gram":
                solution_growth(merged, states, layers)

        total, share = timed(round_and_merge, repeats), timed(screen_share, repeats)
        found[method] = {
            "round_and_merge_cpu_s": total["cpu_s"],
            "round_and_merge_wall_s": total["wall_s"],
            "screen_cpu_s": share["cpu_s"],
            "screen_wall_s": share["wall_s"],
            "ratio_cpu": total["cpu_s"] / (total["cpu_s"] - share["cpu_s"]),
            "ratio_wall": total["wall_s"] / (total["wall_s"] - share["wall_s"]),
        }
    return found


def print_width(width: float, merges: dict[str, dict], passes: dict[str, float]) -> None:
    hidden = int(128 * width)
    base = merges["average"]["cpu_s"]
    print(f"\n{hidden} hidden units: merge CPU s (wall s), x the plain average's CPU time")
    for method, t in merges.items():
        print(f"  {method:16s} {t['cpu_s']:9.3f} ({t['wall_s']:8.3f})  {t['cpu_s'] / base:9.1f}x")
    speedup = passes["fisher_loop_cpu_s"] / passes["fisher_vmap_cpu_s"]
    print(
        f"  per client: Fisher (vmap) {passes['fisher_vmap_cpu_s']:.2f} CPU s, per-example loop "
        f"{passes['fisher_loop_cpu_s']:.2f} CPU s ({speedup:.1f}x), Gram "
        f"{passes['gram_cpu_s']:.3f} CPU s; answers: Fisher {passes['fisher_bytes'] / 1e6:.2f} MB, "
        f"Gram {passes['gram_bytes'] / 1e6:.2f} MB, weights {passes['weights_bytes'] / 1e6:.2f} MB"
    )


def print_screened(width: float, screened: dict[str, dict]) -> None:
    print(f"\n{int(128 * width)} hidden units: screened query round and merge (server)")
    for method, t in screened.items():
        print(
            f"  {method:8s} {t['round_and_merge_cpu_s']:8.3f} CPU s, the statistics screen "
            f"{t['screen_cpu_s']:.3f} CPU s: {t['ratio_cpu']:.3f}x the round without it "
            f"(wall {t['ratio_wall']:.3f}x)"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=float, nargs="+", default=[4, 16])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--screen-only",
        action="store_true",
        help="time only the screened Fisher and Gram query rounds on the shared clients "
        "(server side) and the statistics screen's share of them",
    )
    args = parser.parse_args(argv)
    splits = load_dataset("mnist5k")
    results = {
        "clients": args.clients,
        "epochs": args.epochs,
        "samples": SAMPLES,
        "threads": torch.get_num_threads(),
        "load_before": os.getloadavg()[0],
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d"),
        "widths": {},
    }
    for width in args.widths:
        print(f"width {width:g}: training {2 * args.clients} clients", flush=True)
        shared = train_clients(splits, width, args.clients, args.epochs, shared=True)
        screened = screened_query_timings(*shared, args.repeats)
        print_screened(width, screened)
        if args.screen_only:
            results["widths"][f"{width:g}"] = {"screened_queries": screened}
            continue
        independent = train_clients(splits, width, args.clients, args.epochs, shared=False)
        merges = merge_timings(*shared, SHARED, splits, args.repeats)
        merges.update(merge_timings(*independent, INDEPENDENT[1:], splits, args.repeats))
        passes = pass_timings(*shared, args.repeats)
        results["widths"][f"{width:g}"] = {
            "merges": merges,
            "passes": passes,
            "screened_queries": screened,
        }
        print_width(width, merges, passes)
    results["load_after"] = os.getloadavg()[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
