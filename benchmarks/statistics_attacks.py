"""The statistics attack table of docs/reliability.md: a client's Gram matrices or Fisher diagonal
poisoned, against each defence, RegMean's or Fisher merging's accuracy and who was named.

Five IID clients (partitions 0-4) are trained in process exactly as the ClientApp trains them,
with the setting of benchmarks/robust_attacks.py (mnist5k, MLP with BatchNorm at width 0.5,
depth 2, ``init = "shared"``, 3 epochs); client 4 is the attacker (for the label-flip rows,
trained on labels shifted by one class). Each client's statistics are what its ClientApp
answers (:class:`fedlmc.merging.clients.LocalClients`: its own Fisher diagonal or Gram matrices
on 256 of its training examples), sent as real ``query.fisher`` / ``query.gram`` replies
(:func:`fedlmc.strategies.protocol.statistics_to_content`); the attacker's are rewritten first.
Every defence is the real query round (:class:`fedlmc.strategies.queries.ClientRounds`) and the
registered merge (:func:`fedlmc.merging.methods.merge_states`), then BatchNorm re-estimated on
the server split (none in the "no server data" rows), evaluated on the test split:

- "today's screen": the screen fedlmc had before the statistics screen (finite, a non-negative
  Fisher; a symmetric Gram with a non-negative diagonal): the attacker's reply is merged when it
  passes that, else left out;
- "reply screen": the per-reply screen (positive semi-definite Grams) and RegMean's blow-up check,
  without the relative rule (``outlier-factor = inf``);
- "fedlmc default": both and the relative rule on the statistics' scales (factor 10).

"honest only" merges the four honest clients alone. Also printed and written: the honest rounds'
largest statistic relative to the median over the clients, and RegMean's solution growth
(:func:`fedlmc.merging.field.regmean.solution_growth`) on honest clients and, per attack, without
the screen (``growth`` of the "today's screen" merges).

    nice -n 10 .venv/bin/python benchmarks/statistics_attacks.py            # seeds 0 1 2
    nice -n 10 .venv/bin/python benchmarks/statistics_attacks.py --seeds 0  # one seed

Writes ``benchmarks/results/statistics_attacks.json`` and prints the Markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import Message
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

sys.path.insert(0, str(Path(__file__).resolve().parent))
from robust_attacks import CONFIG, cell, scores, train  # noqa: E402

from fedlmc.merging.clients import LocalClients  # noqa: E402
from fedlmc.merging.field.field_methods import (  # noqa: E402
    FISHER_EPSILON,
    REGMEAN_ALPHA,
    REGMEAN_RIDGE,
)
from fedlmc.merging.field.fisher import fisher_merge  # noqa: E402
from fedlmc.merging.field.regmean import regmean_layers, regmean_merge, solution_growth  # noqa: E402
from fedlmc.merging.methods import merge_states  # noqa: E402
from fedlmc.merging.post_merge import ServerData, post_merge  # noqa: E402
from fedlmc.simulations.config import validate_run_config  # noqa: E402
from fedlmc.simulations.task import build_from_config, client_train_data, load_splits  # noqa: E402
from fedlmc.strategies.protocol import (  # noqa: E402
    FISHER_QUERY,
    state_digest,
    statistics_to_content,
)
from fedlmc.strategies.queries import ClientRounds  # noqa: E402
from fedlmc.strategies.robust import OFF, RobustScreen  # noqa: E402
from fedlmc.strategies.statistics_screen import statistics_outliers  # noqa: E402
from fedlmc.strategies.strategy_utils import ClientUpdate  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "statistics_attacks.json"
CLIENTS = 5
ATTACKER = 4
DEFENCES = {"reply screen": OFF, "fedlmc default": RobustScreen()}


def off_diagonal(g: torch.Tensor, factor: float) -> torch.Tensor:
    """``g`` with its off-diagonal entries multiplied by ``factor``."""
    diagonal = torch.diag(torch.diagonal(g))
    return diagonal + factor * (g - diagonal)


def top_negated(g: torch.Tensor) -> torch.Tensor:
    """``g`` with its top eigen-direction negated off the diagonal (the diagonal kept): an
    indefinite matrix that is symmetric with a non-negative diagonal."""
    values, vectors = torch.linalg.eigh(g.double())
    part = values[-1] * torch.outer(vectors[:, -1], vectors[:, -1])
    return (g.double() - 2 * (part - torch.diag(torch.diagonal(part)))).float()


GRAM_ATTACKS = {
    "no attack": lambda g: g,
    "Gram off-diagonal x -4": lambda g: off_diagonal(g, -4.0),
    "Gram indefinite (top direction negated)": top_negated,
    "Gram x1e6": lambda g: g * 1e6,
}
FISHER_ATTACKS = {
    "no attack": lambda f: f,
    "Fisher x1e6": lambda f: f * 1e6,
    "Fisher every entry 1e37": lambda f: torch.full_like(f, 1e37),
}


def passes_todays_screen(tensors: dict, kind: str) -> bool:
    """Whether the screen before the statistics screen accepted ``tensors``."""
    for t in tensors.values():
        v = t.double()
        if not torch.isfinite(v).all():
            return False
        if kind == "fisher" and (v < 0).any():
            return False
        scale = 1 + float(v.abs().max())
        if kind == "gram" and (
            float((v - v.T).abs().max()) > 1e-6 * scale or (torch.diagonal(v) < 0).any()
        ):
            return False
    return True


class StatisticsGrid:
    """Nodes ``100 + p`` answer ``query.fisher`` / ``query.gram`` with partition ``p``'s
    statistics (precomputed), the attacker's as given."""

    def __init__(self, answers: dict[int, dict], states: list[dict]):
        self.answers, self.states = answers, states

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            pid = int(message.metadata.dst_node_id) - 100
            kind = "fisher" if message.metadata.message_type.endswith(FISHER_QUERY) else "gram"
            found = self.answers[kind][pid]
            digest = state_digest(self.states[pid])
            content = statistics_to_content(found, digest, {"partition-id": pid})
            replies.append(Message(content, reply_to=message))
        return replies


def merged_scores(template, method, states, answers, screen, server, test) -> tuple[dict, str]:
    """The query round with ``screen`` and the registered merge (``screen = None``: today's
    screen and the merge rule alone, as fedlmc merged before the statistics screen), then
    BatchNorm on the server split (if any): the test scores and who was named."""
    kind = "fisher" if method == "fisher" else "gram"
    if screen is None:
        kept = [p for p in range(len(states)) if passes_todays_screen(answers[kind][p], kind)]
        merged = todays_merge(method, [states[p] for p in kept], [answers[kind][p] for p in kept])
        aligned = [states[p] for p in kept]
        named = [f"p{p}: today's screen" for p in range(len(states)) if p not in kept]
    else:
        updates = [ClientUpdate(p, 100 + p, states[p], 1, {}, 0) for p in range(len(states))]
        rounds = ClientRounds(
            StatisticsGrid(answers, states),
            updates,
            {},
            template=template,
            device="cpu",
            timeout=None,
            min_clients=2,
            robust=screen,
        )
        merged, aligned = merge_states(method, template, states, None, clients=rounds)
        named = [f"p{f.partition_id}: {short(f.reason)}" for f in rounds.dropped]
    source = None if server is None else ServerData(*server)
    weights = [1.0 / len(aligned)] * len(aligned)
    final = post_merge(template, merged, aligned, weights, method, source, device="cpu")
    found = scores(template, final.state, test)
    if method == "regmean":  # how far the solution grew past the clients' weights
        growth = solution_growth(merged, aligned, regmean_layers(template))
        found["growth"] = max(growth.values())
    return found, "; ".join(named)


def todays_merge(method: str, states: list[dict], answers: list[dict]) -> dict:
    """The merge rule on every answer as sent, at equal weights (the default options)."""
    weights = [1.0] * len(states)
    if method == "fisher":
        return fisher_merge(states, answers, weights, FISHER_EPSILON)
    return regmean_merge(states, answers, weights, REGMEAN_ALPHA, REGMEAN_RIDGE)


def short(reason: str) -> str:
    for words, kind in (
        ("positive semi-definite", "PSD"),
        ("x the median", "scale"),
        ("RegMean's solution", "blow-up"),
    ):
        if words in reason:
            return kind
    return reason[:40]


def honest_spread(template, states, local: LocalClients) -> dict[str, float]:
    """The honest clients' largest statistic over the median (every statistic of the relative
    rule) and RegMean's largest solution growth."""
    from fedlmc.strategies.statistics_screen import check_gram_spectrum, fisher_scale

    layers = regmean_layers(template)
    grams, fishers = local.gram_matrices(layers), local.fisher_diagonals()
    gram_summaries = [{k: check_gram_spectrum(k, v.double()) for k, v in g.items()} for g in grams]
    fisher_summaries = [{k: fisher_scale(v) for k, v in f.items()} for f in fishers]
    merged, _ = merge_states("regmean", template, states, None, clients=local)
    return {
        "gram_ratio": largest_ratio(gram_summaries),
        "fisher_ratio": largest_ratio(fisher_summaries),
        "regmean_growth": max(solution_growth(merged, states, layers).values()),
        "honest_named": len(statistics_outliers(gram_summaries, RobustScreen()))
        + len(statistics_outliers(fisher_summaries, RobustScreen())),
    }


def largest_ratio(summaries: list[dict]) -> float:
    worst = 0.0
    for tensor, stats in summaries[0].items():
        for stat in stats:
            values = [s[tensor][stat] for s in summaries]
            centre = float(np.median(values))
            if centre > 0:
                worst = max(worst, max(values) / centre)
    return worst


def client_answers(template, states, config, flipped: bool) -> tuple[dict, LocalClients]:
    """Every client's honest Fisher diagonal and Gram matrices, as its ClientApp answers them
    (``flipped``: the attacker's labels shifted by one class, as it trained)."""
    data = [client_train_data(config, p, CLIENTS) for p in range(CLIENTS)]
    if flipped:
        x, y = data[ATTACKER]
        data[ATTACKER] = (x, (y + 1) % 10)
    local = LocalClients(
        template,
        states,
        [x for x, _ in data],
        data,
        train_labels=[y for _, y in data],
        seed=config["seed"],
    )
    fishers = local.fisher_diagonals()
    grams = local.gram_matrices(regmean_layers(template))
    return {"fisher": dict(enumerate(fishers)), "gram": dict(enumerate(grams))}, local


def spoiled(answers: dict, kind: str, attack) -> dict:
    """``answers`` with the attacker's ``kind`` tensors rewritten by ``attack``."""
    found = {k: dict(v) for k, v in answers.items()}
    found[kind][ATTACKER] = {name: attack(t) for name, t in answers[kind][ATTACKER].items()}
    return found


def attack_row(template, method, states, answers, server, test) -> dict:
    """One attack against every defence, and the honest clients alone."""
    honest = states[:ATTACKER]
    alone = {k: {p: v[p] for p in range(ATTACKER)} for k, v in answers.items()}
    row = {}
    found, _ = merged_scores(template, method, honest, alone, RobustScreen(), server, test)
    row["honest only"] = found
    found, named = merged_scores(template, method, states, answers, None, server, test)
    row["today's screen"] = {**found, "named": named}
    for name, screen in DEFENCES.items():
        found, named = merged_scores(template, method, states, answers, screen, server, test)
        row[name] = {**found, "named": named}
    return row


def one_seed(seed: int) -> dict:
    """Every statistics attack against every defence for ``seed``, and the honest spreads."""
    config = validate_run_config({**CONFIG, "seed": seed, "num-clients": CLIENTS})
    splits = load_splits(config)
    template = build_from_config(config, splits, seed=seed)
    shared = template.state_dict()
    honest = [train(config, splits, shared, p, CLIENTS) for p in range(CLIENTS)]
    flipped = [*honest[:ATTACKER], train(config, splits, shared, ATTACKER, CLIENTS, flip=True)]
    answers, local = client_answers(template, honest, config, flipped=False)
    flip_answers, _ = client_answers(template, flipped, config, flipped=True)
    rows: dict[str, dict] = {}
    cases = [("regmean", "gram", GRAM_ATTACKS), ("fisher", "fisher", FISHER_ATTACKS)]
    for method, kind, table in cases:
        for attack, rewrite in table.items():
            print(f"  seed {seed}: {method}, {attack}", flush=True)
            sent = spoiled(answers, kind, rewrite)
            rows[f"{method}: {attack}"] = attack_row(
                template, method, honest, sent, splits.server, splits.test
            )
    for method, kind in (("regmean", "gram"), ("fisher", "fisher")):
        name = "Gram" if kind == "gram" else "Fisher"
        print(f"  seed {seed}: {method}, label flip + {name} x1e6, no server data", flush=True)
        sent = spoiled(flip_answers, kind, lambda t: t * 1e6)
        rows[f"{method}: label flip + {name} x1e6, no server data"] = attack_row(
            template, method, flipped, sent, None, splits.test
        )
    return {"rows": rows, "honest": honest_spread(template, honest, local)}


COLUMNS = ["honest only", "today's screen", *DEFENCES]


def markdown(runs: dict[int, dict]) -> str:
    """Per attack and defence, the mean ± std accuracy over the seeds and who was named."""
    seeds = sorted(runs)
    first = runs[seeds[0]]["rows"]
    lines = [
        "| attack (accuracy) | " + " | ".join(COLUMNS) + " |",
        "|---|" + "---|" * len(COLUMNS),
    ]
    for attack in first:
        cells = []
        for column in COLUMNS:
            text = cell([runs[s]["rows"][attack][column]["accuracy"] for s in seeds])
            named = {runs[s]["rows"][attack][column].get("named", "") for s in seeds}
            if named != {""}:
                text += f" ({' / '.join(sorted(named))})"
            cells.append(text)
        lines.append(f"| {attack} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SUPERLINK_NODE_ID
    torch.set_num_threads(1)
    start = time.perf_counter()
    runs = {seed: one_seed(seed) for seed in args.seeds}
    honest = {str(s): r["honest"] for s, r in runs.items()}
    table = markdown(runs)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "date": datetime.date.today().isoformat(),
                "seeds": args.seeds,
                "config": CONFIG,
                "machine": platform.processor() or platform.machine(),
                "seconds": round(time.perf_counter() - start, 1),
                "honest": honest,
                "runs": {str(s): r["rows"] for s, r in runs.items()},
                "table": table,
            },
            indent=1,
            default=lambda v: None if isinstance(v, float) and math.isnan(v) else v,
        )
    )
    print(table)
    for attack in runs[args.seeds[0]]["rows"]:
        if attack.startswith("regmean"):
            growth = [runs[s]["rows"][attack]["today's screen"]["growth"] for s in args.seeds]
            print(f"  {attack}: RegMean's growth without the screen {max(growth):.3g}")
    print("\nhonest rounds:", json.dumps(honest))
    print(f"\n{RESULTS} written in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
