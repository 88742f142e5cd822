"""The fedlmc ServerApp: one federation, evaluated rows, results on disk.

``run-config`` key ``strategy`` chooses what the server does:

- ``compare`` (studies): one training round collects the client models
  (:class:`fedlmc.strategies.OneShotAverage` with ``keep_client_states=True``), then
  :func:`fedlmc.study.compare_methods` evaluates every method of ``methods`` on those same
  models (temperatures fitted on the server split; each base merge computed once and its
  weights kept). ``fedavg`` in ``methods`` additionally runs
  :class:`fedlmc.strategies.FedAvgBaseline` afterwards on the same nodes.
- ``average``: :class:`fedlmc.strategies.OneShotAverage` with the configured ``calibration``; rows
  ``average`` and, unless ``calibration = none``, ``average_t`` (with the strategy's temperature).
- ``aligned``: :class:`fedlmc.strategies.PermutationAlignedAverage` with the registered merge method
  ``align``; rows ``<align>`` and ``<align>_t``.
- ``fedavg``: :class:`~fedlmc.strategies.FedAvgBaseline`, ``fedavg-rounds`` rounds; row ``fedavg``.

``warmup-rounds = k > 0`` (``init = "shared"``; the one-shot strategies): first ``k`` FedAvg
rounds of one local epoch each from the server's initialisation (:func:`warm_up`), then the
one-shot round trains ``epochs - k`` epochs from their global model; the rows' ``rounds``,
``bytes_sent_by_clients``, ``train_seconds`` and ``round_seconds`` include the warm-up rounds.

Every row gets ``clients_survived``,
``clients_failed`` (``"partition P: reason; ..."``), ``bytes_sent_by_clients`` (what the clients
sent: the tensor bytes of their trained weights, every round, plus the payload of every query
reply, calibration, statistics and alignment rounds included: tensors and 8 bytes per metric
number), ``rounds`` (message rounds with the clients: training rounds plus query rounds),
``train_seconds`` (sum of the survivors' training times) and ``round_seconds`` (wall time of the
strategy). The ``_t`` rows of ``average``/``aligned`` also get ``temperature_server_split``: the
temperature fitted on the server split for the same merged model, beside the row's
``temperature`` (fitted where ``calibration`` says: with ``federated``, on the clients' held-out
data). With a non-empty ``out-dir``
the server writes ``results.csv`` (atomically, :func:`fedlmc.io.atomic_write`) and the merged
weights ``merged-<method>.safetensors`` (one file per merge, shared by a method and its ``_t``);
``results.csv`` also has the run-config columns (hyphenated keys), the in-process table
(:meth:`ServerOutcome.table`, ``run_federation``) only on request (the sweep adds them itself),
and, last, ``fedlmc_version``, ``flwr_version``, ``torch_version`` and ``device_used`` (the
resolved server device, e.g. ``cpu: x86_64 (2 cores)``; ``device`` is the run-config key).
Beside it, ``training.csv``: the clients' per-epoch training curves and FedAvg's per-round
curve (:mod:`fedlmc.simulations.records.training_file`; FedAvg evaluates its global model on the
test split after every round for it, :func:`merged_test_evaluation`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from logging import INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log
from safetensors.torch import save_file
from torch import nn

from fedlmc.averaging import load_state
from fedlmc.data.loading import DataSplits, fetch_dataset
from fedlmc.evaluation import metrics_from_logits, predict_logits
from fedlmc.io import atomic_write, atomic_write_csv
from fedlmc.merging.method_registry import REFERENCE_METHODS, base_method
from fedlmc.simulations.config import (
    FEDAVG,
    Mode,
    cell_default_methods_note,
    client_width,
    mixed_widths,
)
from fedlmc.simulations.config.dp import is_dp
from fedlmc.simulations.config.lewc_calibration import lewc_note
from fedlmc.simulations.config.run_plan import RunPlan, plan_run
from fedlmc.simulations.config.secure import is_secure
from fedlmc.simulations.config.threads import server_threads, use_threads
from fedlmc.simulations.private.dp_server import run_dp_average
from fedlmc.simulations.private.secure_server import run_secure_average
from fedlmc.simulations.records.clients_line import clients_line
from fedlmc.simulations.records.out_dir_lock import out_dir_lock
from fedlmc.simulations.records.progress import (
    RunProgress,
    Say,
    flower_say,
    rows_destination,
    shorten_flower_config_logs,
)
from fedlmc.simulations.records.provenance import version_columns
from fedlmc.simulations.records.results_file import check_writable_folder, refuse_mixing
from fedlmc.simulations.records.server_outcome import (
    MIXED_COLLECT,
    ServerOutcome,
    ServerRun,
    _train_seconds,
    round_columns,
    train_config_record,
)
from fedlmc.simulations.records.training_file import training_rows, write_training
from fedlmc.simulations.records.watched_grid import WatchedGrid
from fedlmc.simulations.task import (
    build_from_config,
    client_calibration_data,
    client_templates,
    client_train_data,
    device_of,
    load_splits,
)
from fedlmc.strategies import (
    FedAvgBaseline,
    FedAvgResult,
    OneShotAverage,
    OneShotResult,
    PermutationAlignedAverage,
)
from fedlmc.strategies.fedavg import MERGED_TEST_ACCURACY, MERGED_TEST_LOSS
from fedlmc.strategies.options import StrategyOptions
from fedlmc.strategies.protocol import record_to_state, state_to_record
from fedlmc.strategies.queries import ClientRounds
from fedlmc.strategies.screening import ClientReferences, WeightBound
from fedlmc.strategies.strategy_utils import StateDict
from fedlmc.study.compare import (
    Comparison,
    compare_methods,
)
from fedlmc.study.flags import flag_columns, flag_lines
from fedlmc.study.method_policy import check_info
from fedlmc.study.model_rows import endpoint_metrics, merge_rows


def _start(
    strategy,
    grid: Grid,
    template: nn.Module,
    config: Mapping[str, Any],
    rounds: int,
    evaluate_fn=None,
    initial: StateDict | None = None,
    progress: RunProgress | None = None,
):
    start = time.perf_counter()
    if progress is not None:
        progress.training(config["num-clients"], config["epochs"])
    result = strategy.start(
        grid=grid,
        initial_arrays=state_to_record(template.state_dict() if initial is None else initial),
        num_rounds=rounds,
        timeout=config["timeout"],
        train_config=train_config_record(config),
        evaluate_fn=evaluate_fn,
    )
    seconds = time.perf_counter() - start
    if progress is not None:
        reports = getattr(result, "reports", None) or {0: getattr(result, "report", None)}
        last = reports[max(reports)]  # FedAvg: the last round's; one-shot: its only one
        progress.trained(len(last.survivors) if last is not None else 0, seconds)
    return result, seconds


def merged_test_evaluation(template: nn.Module, splits: DataSplits, device: torch.device):
    """Flower's ``evaluate_fn`` for FedAvg's per-round curve: after each round ``r >= 1``, the
    global model's test accuracy and mean cross-entropy at T = 1
    (:data:`~fedlmc.strategies.fedavg.MERGED_TEST_ACCURACY`,
    :data:`~fedlmc.strategies.fedavg.MERGED_TEST_LOSS`); round 0 (the initial model) is skipped."""
    x, y = splits.test

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round < 1:
            return None
        model = load_state(template, record_to_state(arrays)).to(device).eval()
        found = metrics_from_logits(predict_logits(model, x, device=device), y, 1.0)
        return MetricRecord(
            {MERGED_TEST_ACCURACY: found["accuracy"], MERGED_TEST_LOSS: found["nll"]}
        )

    return evaluate


def weight_bound(config: Mapping[str, Any], simulated: bool) -> WeightBound:
    """The bound on each client's weight (:class:`fedlmc.strategies.screening.WeightBound`): in a
    simulation the partition sizes the server knows (the ClientApp's own split of the same
    data), in a deployment ``max-client-share``."""
    if not simulated:
        return WeightBound(max_share=config["max-client-share"])
    n = int(config["num-clients"])
    return WeightBound(
        max_share=config["max-client-share"],
        sizes={
            "train": {p: len(client_train_data(config, p, n)[1]) for p in range(n)},
            "calibration": {p: len(client_calibration_data(config, p, n)[1]) for p in range(n)},
        },
    )


def one_shot_options(
    plan: RunPlan, splits: DataSplits, device: torch.device, outcome: ServerOutcome
) -> StrategyOptions:
    """The plan's strategy options with what only the running server knows: the weight bound,
    the server split, the device and the clients' references (:func:`client_references`)."""
    return plan.strategy_options.replace(
        weight_bound=outcome.weight_bound,
        server_data=splits.server if len(splits.server[1]) else None,
        device=device,
        client_references=client_references(plan, outcome),
    )


def client_references(plan: RunPlan, outcome: ServerOutcome) -> ClientReferences | None:
    """Clients of different widths: the arrays the server expects of each partition (its
    width's model), for the train screen; ``None`` when every client has the server's width."""
    if outcome.client_templates is None:
        return None
    states = {p: model.state_dict() for p, model in outcome.client_templates.items()}
    labels = {p: f"width {client_width(plan.config, p):g}" for p in states}
    return ClientReferences.of_states(states, labels)


# ----------------------------------------------------------------------------- warm-up


@dataclass(frozen=True)
class WarmUp:
    """What the ``warmup-rounds`` FedAvg rounds before a one-shot round produced: the global
    model the one-shot round starts from (``state``; ``None`` without warm-up), and what they
    cost, added to the one-shot round's columns (:meth:`columns`)."""

    state: StateDict | None = None
    rounds: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0
    train_seconds: float = 0.0

    def one_shot_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The one-shot round's train config: after ``k`` warm-up rounds, ``epochs - k`` local
        epochs from the received global model (``init = "shared"``)."""
        if self.state is None:
            return dict(config)
        return {**config, "epochs": config["epochs"] - self.rounds, "init": "shared"}

    def columns(self, columns: Mapping[str, Any]) -> dict[str, Any]:
        """The one-shot round's round columns with the warm-up's rounds, bytes and times
        added."""
        return {
            **columns,
            "rounds": columns["rounds"] + self.rounds,
            "bytes_sent_by_clients": columns["bytes_sent_by_clients"] + self.bytes_sent,
            "round_seconds": columns["round_seconds"] + self.seconds,
            "train_seconds": columns["train_seconds"] + self.train_seconds,
        }


def survivors_train_seconds(result: FedAvgResult) -> float:
    """Sum of the survivors' training times over every round of a FedAvg run."""
    return float(sum(_train_seconds(u) for r in result.reports.values() for u in r.survivors))


def warm_up(grid, plan: RunPlan, template, outcome: ServerOutcome) -> WarmUp:
    """``warmup-rounds = k`` FedAvg rounds of one local epoch each from the server's
    initialisation (:class:`fedlmc.strategies.FedAvgBaseline`, ``epochs = k``, the plan's
    :attr:`~fedlmc.simulations.config.run_plan.RunPlan.fedavg_options`); no rounds for
    ``k = 0``."""
    k = plan.config["warmup-rounds"]
    if not k:
        return WarmUp()
    options = plan.fedavg_options.replace(weight_bound=outcome.weight_bound)
    strategy = FedAvgBaseline(options, total_epochs=k, num_rounds=k)
    result, seconds = _start(strategy, grid, template, plan.config, k)
    outcome.results["warmup"] = result
    return WarmUp(
        record_to_state(result.arrays),
        k,
        result_bytes(result),
        seconds,
        survivors_train_seconds(result),
    )


# ----------------------------------------------------------------------------- modes


def compare_cell(
    plan: RunPlan,
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float],
    splits: DataSplits,
    device: torch.device,
    client_templates: Sequence[nn.Module] | None = None,
    progress: Say | None = None,
    clients: ClientRounds | None = None,
    base: StateDict | None = None,
) -> Comparison:
    """:func:`fedlmc.study.compare_methods` with the plan's settings: its ``compare_methods``
    (FedAvg aside: it is a run of its own), its study's ``lambdas``, ``seed``, ``diagnostics``
    and the merge methods' options; ``client_templates``: each client's architecture (its width's)
    when it differs from ``template``'s; ``clients``: the query rounds on the collected
    clients, for the methods that run on them; ``base``: their shared starting model."""
    return compare_methods(
        template,
        states,
        weights,
        splits,
        list(plan.compare_methods),
        lambdas=plan.study.lambdas,
        seed=plan.study.seed,
        diagnostics=plan.study.diagnostics,
        device=device,
        method_options=dict(plan.method_options),
        client_templates=client_templates,
        progress=progress,
        clients=clients,
        base=base,
    )


def run_compare(grid, plan: RunPlan, splits, template, device, outcome: ServerOutcome) -> None:
    """Collect the client models once, evaluate every requested method on them (each base merge
    once, its weights kept for ``merged-<method>.safetensors``)."""
    config = plan.config
    options = one_shot_options(plan, splits, device, outcome)
    keep = plan.client.keeps_model  # the study's methods query the collected clients
    if outcome.client_templates is None:
        strategy = OneShotAverage(template, options)
    else:  # the collecting round's own merge must take clients of different widths
        strategy = PermutationAlignedAverage(template, options, method=MIXED_COLLECT)
    strategy.summary_note = (
        "this round only collects the client models; every method's temperature, the _t rows, "
        "is fitted afterwards on the server split"
    )
    warm = warm_up(grid, plan, template, outcome)
    one_shot = warm.one_shot_config(config)
    result, seconds = _start(
        strategy, grid, template, one_shot, 1, initial=warm.state, progress=outcome.progress
    )
    report = result.report
    outcome.results[Mode.COMPARE], outcome.reports[Mode.COMPARE] = result, report
    states = [u.state for u in report.survivors]
    weights = list(result.weights)
    start = time.perf_counter()
    own = None if outcome.client_templates is None else outcome.templates_of(report, template)
    methods = plan.compare_methods
    bases = list(dict.fromkeys(base_method(m) for m in methods if m not in REFERENCE_METHODS))
    say = outcome.progress.merging(bases)
    clients = strategy.client_rounds(report.survivors) if keep else None
    base = (warm.state or template.state_dict()) if one_shot["init"] == "shared" else None
    comparison = compare_cell(
        plan, template, states, weights, splits, device, own, say, clients, base
    )
    outcome.timings["evaluate_seconds"] = time.perf_counter() - start
    columns = warm.columns(round_columns(report, result_bytes(result), seconds, 1, config))
    outcome.rows.extend(with_query_cost(row, columns) for row in comparison.rows)
    outcome.merged.update(comparison.merged)
    if plan.runs_fedavg:
        run_fedavg(grid, plan, splits, template, device, outcome)


def with_query_cost(row: Mapping[str, Any], columns: Mapping[str, Any]) -> dict[str, Any]:
    """A compare row with the cell's round columns; a method that queried the clients keeps its
    query rounds and their reply bytes added to the collecting round's, and the clients its
    queries lost (:func:`fedlmc.study.compare.lost_columns`) counted and named: dropped and
    failed, no longer among the survivors it merged."""
    merged = {**row, **columns}
    rounds, sent = row.get("rounds", math.nan), row.get("bytes_sent_by_clients", math.nan)
    if isinstance(rounds, int | float) and math.isfinite(rounds):
        merged["rounds"] = columns["rounds"] + int(rounds)
        merged["bytes_sent_by_clients"] = columns["bytes_sent_by_clients"] + int(sent)
    lost = int(row.get("clients_dropped", 0) or 0)
    if lost:
        reasons = str(row["clients_dropped_reasons"])
        merged["clients_survived"] = columns["clients_survived"] - lost
        merged["clients_dropped"] = columns["clients_dropped"] + lost
        for key, own in (("clients_dropped_reasons", reasons), ("clients_failed", reasons)):
            merged[key] = "; ".join(text for text in (columns[key], own) if text)
    return merged


def result_bytes(result: OneShotResult | FedAvgResult) -> int:
    """Sum of ``bytes-received`` over the rounds of ``result``."""
    return int(sum(m.get("bytes-received", 0) for m in result.train_metrics_clientapp.values()))


def run_one_shot(grid, plan: RunPlan, splits, template, device, outcome: ServerOutcome) -> None:
    """``average`` or ``aligned``: one strategy, its merged model and temperature."""
    config = plan.config
    options = one_shot_options(plan, splits, device, outcome)
    if plan.mode == Mode.AVERAGE:
        strategy = OneShotAverage(template, options)
    else:
        strategy = PermutationAlignedAverage(
            template,
            options,
            method=plan.merge_method,
            seed=config["seed"],
            method_options=dict(plan.method_options),
        )
    base = strategy.merge_method
    warm = warm_up(grid, plan, template, outcome)
    one_shot = warm.one_shot_config(config)
    result, seconds = _start(
        strategy, grid, template, one_shot, 1, initial=warm.state, progress=outcome.progress
    )
    report = result.report
    outcome.results[base], outcome.reports[base] = result, report
    outcome.merged[base] = result.merged_state
    model = load_state(template, result.merged_state).to(device).eval()
    states = [u.state for u in report.survivors]
    endpoints = endpoint_metrics(outcome.templates_of(report, template), states, splits, device)
    rounds = 1 + result.query_rounds
    columns = warm.columns(round_columns(report, result_bytes(result), seconds, rounds, config))
    columns["merge_seconds"] = result.merge_seconds
    rows = merge_rows(
        base,
        model,
        splits,
        device=device,
        num_clients=len(report.survivors),
        calibrated=options.calibration != "none",
        temperature=result.temperature,
        temperature_server_split=result.server_split_temperature,
        endpoints=endpoints,
    )
    check_info(base, result.merge_info)  # the method's info becomes results columns
    outcome.rows.extend({**row, **result.merge_info, **columns} for row in rows)


def run_fedavg(grid, plan: RunPlan, splits, template, device, outcome: ServerOutcome) -> None:
    """Multi-round FedAvg from the shared template initialisation (the plan's
    :attr:`~fedlmc.simulations.config.run_plan.RunPlan.fedavg_options`)."""
    config = plan.config
    rounds = config["fedavg-rounds"]
    options = plan.fedavg_options.replace(weight_bound=outcome.weight_bound)
    strategy = FedAvgBaseline(options, total_epochs=config["epochs"], num_rounds=rounds)
    evaluate = merged_test_evaluation(template, splits, device)
    result, seconds = _start(
        strategy, grid, template, config, rounds, evaluate, progress=outcome.progress
    )
    last = result.reports[rounds]
    outcome.results[FEDAVG], outcome.reports[FEDAVG] = result, last
    merged = record_to_state(result.arrays)
    outcome.merged[FEDAVG] = merged
    model = load_state(template, merged).to(device).eval()
    [row] = merge_rows(FEDAVG, model, splits, device=device, num_clients=len(last.survivors))
    columns = round_columns(last, result_bytes(result), seconds, rounds, config)
    columns["train_seconds"] = survivors_train_seconds(result)
    outcome.rows.append({**row, **columns})


def run_secure(grid, plan: RunPlan, splits, template, device, outcome: ServerOutcome) -> None:
    """``average`` under ``secure-aggregation``
    (:mod:`fedlmc.simulations.private.secure_server`)."""
    run_secure_average(ServerRun(grid, plan, splits, template, device, outcome))


def run_dp(grid, plan: RunPlan, splits, template, device, outcome: ServerOutcome) -> None:
    """``average`` under ``dp`` (:mod:`fedlmc.simulations.private.dp_server`)."""
    run_dp_average(ServerRun(grid, plan, splits, template, device, outcome))


MODES = {
    Mode.COMPARE: run_compare,
    Mode.AVERAGE: run_one_shot,
    Mode.ALIGNED: run_one_shot,
    Mode.FEDAVG: run_fedavg,
}


# ----------------------------------------------------------------------------- output


def write_outputs(
    outcome: ServerOutcome, out_dir: str | os.PathLike, device: torch.device | None = None
) -> None:
    """``results.csv``, ``training.csv`` and ``merged-<method>.safetensors`` under ``out_dir``
    (atomic writes)."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    table = outcome.table(with_config=True)
    device = device_of(outcome.config) if device is None else device
    for column, value in version_columns(device).items():
        table[column] = value
    write_training(training_rows(outcome, outcome.config), folder)
    atomic_write_csv(folder / "results.csv", table)
    for method, state in outcome.merged.items():
        tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state.items()}
        path = folder / f"merged-{method}.safetensors"
        atomic_write(path, lambda tmp, t=tensors: save_file(t, tmp))


def prepare_data(config: Mapping[str, Any]) -> DataSplits:
    """The run's data set, fetched first when ``download`` is set: once, on the server, before
    any client is asked to train (clients never download)."""
    if config["download"]:
        fetch_dataset(config["dataset"], config["data-root"], mirror=config["data-mirror"] or None)
    return load_splits(config)


def run_mode(grid: Grid, plan: RunPlan, simulated: bool, progress: RunProgress) -> ServerOutcome:
    """The data, the models and the planned mode (:data:`MODES`) of a run, its stages told
    through ``progress``."""
    config = plan.config
    outcome = ServerOutcome(config=config, progress=progress)
    if progress.watching:  # each reply told as it arrives, the waits on a timer
        grid = WatchedGrid(grid, progress)
    for note in (cell_default_methods_note(config), lewc_note(config)):
        if note is not None:
            outcome.progress(note)
    start = time.perf_counter()
    splits = prepare_data(config)
    outcome.timings["load_seconds"] = time.perf_counter() - start
    template = build_from_config(config, splits)
    if mixed_widths(config):
        outcome.client_templates = client_templates(config, splits)
    outcome.weight_bound = weight_bound(config, simulated)
    mode = run_secure if is_secure(config) else MODES[plan.mode]
    mode = run_dp if is_dp(config) else mode
    mode(grid, plan, splits, template, device_of(config), outcome)
    for row in outcome.rows:  # after every mode: a strategy's T replaces the study's
        row.update(flag_columns(row, splits.num_classes, len(splits.test[1])))
    outcome.timings["server_seconds"] = time.perf_counter() - start
    outcome.progress.finished(len(outcome.rows))
    return outcome


def run_server(
    grid: Grid,
    run_config: Mapping[str, Any] | RunPlan,
    *,
    simulated: bool = False,
    say: Say | None = None,
) -> ServerOutcome:
    """Plan the run once (:func:`fedlmc.simulations.config.run_plan.plan_run`: a plan is taken as
    it is, a validated :class:`~fedlmc.simulations.config.RunConfig` is not validated again),
    run the planned mode, add columns, write the outputs.
    ``simulated``: the clients are this project's simulated ClientApps, whose partition sizes
    the server knows (the weight bound, :func:`weight_bound`). ``say`` receives the stages
    and, last, where the rows went (:mod:`fedlmc.simulations.records.progress`)."""
    plan = run_config if isinstance(run_config, RunPlan) else plan_run(run_config)  # the boundary
    config = plan.config
    if config["out-dir"]:  # before any work: never overwrite a sweep's results.csv
        check_writable_folder(config["out-dir"], "out-dir")
        refuse_mixing(config["out-dir"], "run")
        with out_dir_lock(config["out-dir"], "the fedlmc ServerApp"):  # re-entrant in fedlmc run
            refuse_mixing(config["out-dir"], "run")  # again, under the lock
            outcome = run_mode(grid, plan, simulated, RunProgress(say))
            write_outputs(outcome, config["out-dir"], device_of(config))
    else:
        outcome = run_mode(grid, plan, simulated, RunProgress(say))
    if say is not None:
        say(rows_destination(config))
    for row in outcome.rows:
        log(
            INFO,
            "fedlmc result: %s accuracy %.4f nll %.4f temperature %.4f survivors %d",
            row["method"],
            row["accuracy"],
            row["nll"],
            row["temperature"] if not math.isnan(row["temperature"]) else float("nan"),
            row["clients_survived"],
        )
    for line in flag_lines(outcome.rows):
        log(INFO, "fedlmc warning: %s", line)
    merged = clients_line(outcome.rows, config["num-clients"])
    if merged is not None:  # last: how many clients were merged, each dropped one by name
        log(INFO, "fedlmc %s", merged)
    return outcome


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point of ``flwr run``: the run config comes from ``context.run_config``; the
    server computes with ``server-cpus`` threads (0: every usable core, no client slots run
    beside a deployment's ServerApp; :mod:`fedlmc.simulations.config.threads`)."""
    plan = plan_run(dict(context.run_config))  # the boundary: validated and planned once
    use_threads(server_threads(plan.config["server-cpus"]))
    shorten_flower_config_logs()  # the train ConfigRecord: 50+ keys on one line otherwise
    run_server(grid, plan, say=flower_say)
