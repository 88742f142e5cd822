"""The ServerApp mode of ``secure-aggregation = "secagg+"``: ``strategy = "average"``, or
``"aligned"`` with a method that runs securely (``align = "average_lewc_bias"``,
``"embed_average"``, ``"heterofl"``, ``"fisher"`` or ``"regmean"``).

:func:`run_secure_average` replaces the clear one-shot round (``run_one_shot``) when the run
is secure: one SecAgg+ round (:func:`fedlmc.strategies.secure.secure_average`) on the run's
Grid, in a simulation or a deployment alike, then the same post-merge steps on the server's
own data as the clear strategy (BatchNorm statistics re-estimated on the server split where
the method does; the server holds the merged model, never a client's). The merge method
(the plan's ``merge_method``) travels in the fit config (:data:`MERGE_KEY`): each client
pre-scales its arrays by its share to the power of the method's ``sum_exponents`` and the
server post-scales the weighted mean (:mod:`fedlmc.merging.sum_form`; the plain average's
exponents are all 0); for a rule that divides by the holders (``heterofl``) the clients also
send their holder masks and the server divides the two means
(:func:`fedlmc.strategies.secure.holder_divided`); for a rule of several sums (``fisher``,
``regmean``: registered with ``secure_sums``) every client sends its parts, computed on its own
data, in the same round, at the finest quantisation Flower allows, and the server divides or
solves (:func:`fedlmc.strategies.secure_statistics.secure_sums_merge`). The temperature of the
``_t`` row is fitted on the server split (``calibration = "server"``) or, with ``calibration =
"federated"``, by secure Newton rounds on the held-out data of the clients that survived the
average's round (:mod:`fedlmc.strategies.secure_temperature`: the server sees only pooled NLL
means), or, with ``calibration = "lewc"``, predicted from the template's depth and the
survivors' public example counts alone (:mod:`fedlmc.merging.lewc_temperature`: no data, no
round); no ``average_t`` with ``"none"``. What differs from a clear run's rows:

- the endpoint and merge-gap columns are NaN: the server never holds a client's model to
  evaluate (the clients' own accuracy is not reported under secure aggregation);
- ``rounds`` counts SecAgg+'s four message rounds (four more per secure temperature round),
  ``bytes_sent_by_clients`` every reply's payload (public keys, encrypted shares, the masked
  vectors, the unmasking shares), ``round_seconds`` the wall time of all secure rounds,
  ``clients_survived`` the clients whose masked vectors entered the sum, ``clients_dropped``
  the others and ``clients_dropped_reasons`` (= ``clients_failed``) each by node id, with the
  SecAgg+ stage it missed and why (``"node N: SecAgg+ stage 'masked vectors': Error: Node
  Unavailable ..."``: the server never learns a dropped node's partition);
- no row at all when the round is implausible: the server checks what it can without seeing a
  client (:mod:`fedlmc.strategies.secure_checks`: the weights, the aggregate's range, and here
  the merged model on the server split, :func:`check_merged_model`) and refuses the round with
  one line (:class:`~fedlmc.strategies.secure_checks.ImplausibleAggregateError`);
- ``secagg_error_bound``: the largest difference of a merged value from the clear rule the
  quantisation allows (:attr:`fedlmc.strategies.secure.SecureResult.error_bound`: the plain
  :math:`3Nc/(QS)`, grown by a post-scale, or the ratio bound of ``heterofl``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from fedlmc.averaging import load_state
from fedlmc.evaluation import evaluate
from fedlmc.merging.lewc_temperature import LewcPrediction
from fedlmc.merging.merge_result import calibrated, finish_merge
from fedlmc.merging.post_merge import Calibration, ServerData
from fedlmc.simulations.config.field_keys import field_method_options
from fedlmc.simulations.records.server_outcome import ServerRun, width_columns
from fedlmc.strategies.protocol import HOLDOUT_SHARE_KEY
from fedlmc.strategies.secure import (
    CLIPPING_KEY,
    MAX_WEIGHT_KEY,
    MERGE_KEY,
    SecureResult,
    dropped_text,
    secure_average,
    secure_settings,
)
from fedlmc.strategies.secure_checks import (
    ImplausibleAggregateError,
    merged_model_problem,
    refusal,
)
from fedlmc.strategies.secure_forms import secure_form
from fedlmc.strategies.secure_statistics import (
    WEIGHT_RANGE_KEY,
    fine_settings,
    secure_sums_merge,
    weight_range,
)
from fedlmc.strategies.secure_temperature import SecureTemperature, secure_temperature
from fedlmc.study.model_rows import merge_rows
from fedlmc.study.server_sees import SECURE_SUM

__all__ = [
    "finish_secure_average",
    "run_secure_average",
    "secure_fit_config",
    "secure_round_columns",
    "secure_sums_options",
]


def secure_fit_config(
    config: Mapping[str, Any],
    clipping: float,
    max_weight: float,
    method: str = "average",
    weights_bound: float | None = None,
    holdout_share: float = 0.0,
) -> dict:
    """What the secure round sends every client: the run config, the round, the share each
    client holds out for federated calibration (``holdout-share``,
    :mod:`fedlmc.strategies.protocol`, the plan's
    :attr:`~fedlmc.simulations.config.run_plan.ClientPlan.holdout_share`, when it is not 0),
    the clients' check values (the clipping range and ``max_weight``), the merge ``method`` whose
    ``sum_exponents`` they pre-scale by and, for a rule of several sums, the weight range
    ``weights_bound`` (:func:`fedlmc.strategies.secure_statistics.weight_range`)."""
    sent = {k: v for k, v in config.items()}
    sent.update({"server-round": 1, CLIPPING_KEY: float(clipping), MAX_WEIGHT_KEY: max_weight})
    if holdout_share > 0:
        sent[HOLDOUT_SHARE_KEY] = float(holdout_share)
    sent[MERGE_KEY] = method
    if weights_bound is not None:
        sent[WEIGHT_RANGE_KEY] = float(weights_bound)
    return sent


def merge_exponents(method: str, template) -> dict[str, int]:
    """The per-key weight exponents of ``method``'s rule on ``template``
    (:mod:`fedlmc.merging.sum_form`)."""
    from fedlmc.permutation.model_spec import permutation_spec

    form = secure_form(method)
    if form.sum_exponents is None:  # the run-config check refuses it first
        raise ValueError(f"merge method {method!r} does not run under secure aggregation")
    exponents = form.sum_exponents(permutation_spec(template), template.state_dict())
    if form.divide_by_holders and any(exponents.values()):
        raise ValueError(f"merge method {method!r}: holder division with nonzero exponents")
    return exponents


def secure_sums_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The method options of a ``secure_sums`` rule's merge and client parts: the field
    methods' (:func:`fedlmc.simulations.config.field_keys.field_method_options`) and
    ``secagg-statistics-range``."""
    return {**field_method_options(config), "statistics_range": config["secagg-statistics-range"]}


def secure_round_columns(
    result: SecureResult, config: Mapping[str, Any], widths: Mapping[str, Any]
) -> dict[str, Any]:
    """The round columns (:data:`fedlmc.study.rows.ROUND_COLUMNS`) of a secure round
    (``widths``: the server's width columns)."""
    from fedlmc.study.rows import ROUND_COLUMNS

    train_seconds = [float(m.get("train-seconds", math.nan)) for m in result.metrics]
    survived = len(result.num_examples)
    dropped = dropped_text(result.dropped)
    columns = {
        "clients_survived": survived,
        "clients_failed": dropped,
        "clients_dropped": int(config["num-clients"]) - survived,
        "clients_dropped_reasons": dropped,
        "bytes_sent_by_clients": int(result.bytes_sent),
        "rounds": int(result.rounds),
        "train_seconds": float(sum(train_seconds)),
        "round_seconds": float(result.seconds),
        **widths,
    }
    assert tuple(columns) == ROUND_COLUMNS
    return columns


def run_secure_average(run: ServerRun) -> None:
    """The secure mode (see the module docstring); fills ``run.outcome`` like the clear mode
    (its rows, :func:`fedlmc.study.model_rows.merge_rows`, and merged state)."""
    grid, config, splits, template = run.grid, run.config, run.splits, run.template
    outcome = run.outcome
    method = run.plan.merge_method  # average, or the align method of aligned
    initial = {k: v.detach().cpu() for k, v in template.state_dict().items()}
    n_clients, timeout = int(config["num-clients"]), float(config["timeout"])
    settings = secure_settings(
        initial, len(splits.train[1]), float(config["secagg-clipping-range"])
    )
    sums, bound = secure_form(method).secure_sums, None
    if sums is not None:  # finer levels, and the weight range the Fisher values are scaled by
        settings = fine_settings(settings, n_clients)
        fixed = float(config["secagg-clipping-range"]) > 0
        bound = weight_range(initial, settings.clipping_range, fixed)
    c, m = settings.clipping_range, settings.max_weight
    sent = secure_fit_config(config, c, m, method, bound, run.plan.client.holdout_share)
    outcome.progress.training(config["num-clients"], config["epochs"], secure=True)
    if sums is not None:
        options = secure_sums_options(config)
        result = secure_sums_merge(
            grid, initial, template, n_clients, sent, settings, sums, options, timeout
        )
    else:
        exponents = merge_exponents(method, template)
        holders = secure_form(method).divide_by_holders
        result = secure_average(
            grid, initial, n_clients, sent, settings, timeout, exponents, holders
        )
    if result.dropped:  # the survivors' masks were removed without them (SecAgg+'s promise)
        outcome.progress(f"SecAgg+ merged without {dropped_text(result.dropped)}")
    if result.unmask_missed:  # their masked vectors are in the sum
        late = dropped_text(result.unmask_missed)
        outcome.progress(f"SecAgg+ merged, unmasked without the shares of {late}")
    outcome.progress.trained(len(result.num_examples), result.seconds)
    outcome.progress(secure_round_text(result))
    finish_secure_average(run, result, sent, settings.max_weight, initial)


def finish_secure_average(
    run: ServerRun, result: SecureResult, sent: Mapping[str, Any], max_weight: float, initial
) -> None:
    """The secure round's merge result (:func:`fedlmc.merging.merge_result.finish_merge`: the
    post-merge steps on the SecAgg+ sum, what the server saw: ``sum``), checked on the server
    split, at the run's temperature (server-fitted, SecAgg+'s federated fit on the
    ``sent`` config, or LEWC's prediction), and its rows in ``run.outcome``."""
    grid, config, splits, template = run.grid, run.config, run.splits, run.template
    device, outcome, method = run.device, run.outcome, run.plan.merge_method
    timeout = float(config["timeout"])
    start = time.perf_counter()
    server = ServerData(*splits.server) if len(splits.server[1]) else None
    weights = [n / sum(result.num_examples) for n in result.num_examples]
    merged = finish_merge(  # the server saw the SecAgg+ sum, never a client's model
        method,
        template,
        result.merged_state,
        [],
        weights,
        server,
        device=device,
        started=start,
        server_saw=SECURE_SUM,
    )
    model = merged.model
    if server is not None:  # the one check of the merge on data (secure_checks)
        models = (model, load_state(template, initial))
        check_merged_model(models, server, config["init"] == "shared", device)
    outcome.merged[method] = merged.state
    columns = secure_round_columns(result, config, width_columns(config))
    columns.update(merge_seconds=merged.seconds, secagg_error_bound=result.error_bound)
    n = len(result.num_examples)
    calibration = run.plan.strategy_options.calibration
    fits = calibration != "none"
    reference = server.temperature(model)[0] if fits and server is not None else math.nan
    temperature = reference
    if calibration == "federated":
        fitted = secure_temperature(  # on the clients that survived the average's round
            grid, merged.state, n, sent, max_weight, timeout
        )
        outcome.secure[f"{method}_t"] = fitted
        temperature = fitted.temperature
        columns = add_temperature_rounds(columns, fitted)
    if calibration == "lewc":  # the public shares and the depth: nothing else
        shared = config["init"] == "shared"
        temperature = LewcPrediction.of(template, weights, shared_start=shared).value
    if math.isfinite(temperature):
        merged = calibrated(merged, Calibration(temperature))
    rows = merge_rows(
        merged.method,
        merged.model,
        splits,
        device=device,
        num_clients=n,
        calibrated=fits and math.isfinite(temperature),
        temperature=merged.temperature,
        temperature_server_split=reference,
    )
    outcome.rows.extend({**row, **columns} for row in rows)
    outcome.secure[method] = result


def check_merged_model(models: tuple, server: ServerData, shared_start: bool, device) -> None:
    """:class:`~fedlmc.strategies.secure_checks.ImplausibleAggregateError` when the merged
    model of ``models = (merged, initial)`` is implausible on the server split
    (:func:`~fedlmc.strategies.secure_checks.merged_model_problem`: a non-finite loss, or, from
    a ``shared_start``, no better than the initial model in accuracy and loss)."""
    merged, initial = (
        evaluate(m.to(device).eval(), (server.x, server.y), device=device) for m in models
    )
    labels = server.y.cpu().numpy()
    found = (merged["accuracy"], merged["nll"])
    problem = merged_model_problem(found, initial["nll"], labels, shared_start)
    if problem is not None:
        raise ImplausibleAggregateError(refusal(problem))


def secure_round_text(result: SecureResult) -> str:
    """What the SecAgg+ round did, for the run's log: the sum, its rounds and bytes."""
    return (
        f"SecAgg+: the server received only the sum of {len(result.num_examples)} masked client "
        f"models, in {result.rounds} message rounds, {result.bytes_sent / 1e6:.2f} MB sent by "
        f"the clients; every merged value within {result.error_bound:.1e} of the clear average"
    )


def add_temperature_rounds(columns: dict[str, Any], fitted: SecureTemperature) -> dict[str, Any]:
    """The round columns with the secure temperature's rounds, bytes and seconds added."""
    return {
        **columns,
        "rounds": columns["rounds"] + fitted.message_rounds,
        "bytes_sent_by_clients": columns["bytes_sent_by_clients"] + fitted.bytes_sent,
        "round_seconds": columns["round_seconds"] + fitted.seconds,
    }
