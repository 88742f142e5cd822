r"""The one-shot plain average under Flower's secure aggregation (SecAgg+).

Flower 1.42 offers SecAgg+ only on its legacy path: :class:`flwr.server.workflow.SecAggPlusWorkflow`
inside a :class:`flwr.server.workflow.DefaultWorkflow`, driven by a
:class:`flwr.server.LegacyContext` holding a legacy ``flwr.server.strategy`` strategy, and
``flwr.client.mod.secaggplus_mod`` on the clients. :func:`secure_average` runs one such round
on any Grid: the clients train, mask their quantised weights and the server unmasks only their
sum. The legacy strategy :class:`SumOnlyFedAvg` is what the workflow hands the result to; it
records everything its ``aggregate_fit`` receives, so a test can check that it never held one
client's arrays.

**What SecAgg+ computes.** Client :math:`i` with :math:`n_i` examples scales its arrays by
:math:`r_i = \mathrm{round}(Q\, n_i / M) / Q` (:math:`M` = ``max_weight``), quantises every value
:math:`x` to the integer :math:`\lfloor (x + c)\, Q / (2c) \rceil` (stochastic rounding,
:math:`c` = ``clipping_range``, :math:`Q` = ``quantization_range``), masks and sends it; the
server's unmasked sum, dequantised and divided by :math:`\sum_i r_i`, is

.. math::

    \hat\theta = \frac{\sum_i r_i \theta_i}{\sum_i r_i} + \varepsilon, \qquad
    |\varepsilon| \le \frac{3 N c}{Q \sum_i r_i}

per value (:meth:`SecureSettings.error_bound`): each client's quantisation is off by less than
one step :math:`2c/Q`, and replacing :math:`r_i` by :math:`n_i / M` moves a weight by at most
:math:`1/(2Q)`, a value by at most :math:`2c` times that. That is the clear plain average
:math:`\sum_i n_i \theta_i / \sum_i n_i` within the bound.

**Rules with a power of the weights** (``average_lewc_bias``: layer :math:`l`'s bias
:math:`\sum_i w_i^{\,l} b^{(i)}_l`): :func:`secure_average` with the rule's per-key
``exponents`` :math:`e_k` (:mod:`fedlmc.merging.sum_form`). Each client pre-scales key
:math:`k` by its own share :math:`r_i^{\,e_k}` (:meth:`SecureSettings.share`, the ratio SecAgg+
itself applies) and the server post-scales the mean by :math:`(\sum_j r_j)^{-e_k}`, from the
example counts Flower's legacy results carry in the clear; the bound of a key grows with the
post-scale (:meth:`SecureSettings.exponent_error_bound`). **HeteroFL** (``heterofl``: each
entry averaged over the clients holding it): the clients send their held values and their
holder masks times :math:`c` in the same round (masks in :math:`[0, c]`, inside the range), and
the server divides the first mean by the second (:func:`holder_divided`,
:meth:`SecureSettings.holder_error_bound`).

**The settings rule** (:func:`secure_settings`, before any work): :math:`Q = 2^{22}` and a
modulus of :math:`2^{32}` (Flower's defaults); :math:`M` = the size of the clients' training
pool (no client has more examples); :math:`c` = the smallest power of two at least
:data:`HEADROOM` times the largest absolute value of the initial model's floating-point
arrays, and at least :data:`MIN_CLIPPING_RANGE` (Flower's default, 8), unless the run fixes it.
A value outside :math:`[-c, c]` is **never clipped**: the initial model is checked on the
server before the round, and each client checks its trained weights before it masks them
(:func:`check_in_range`), refusing with the key and the value. Only floating-point arrays are
aggregated (:func:`float_keys`); integer buffers such as BatchNorm's ``num_batches_tracked``
keep the initial model's value (the clear average takes their maximum; the merged model's
BatchNorm statistics are re-estimated anyway). Every client shares its key with every other
(``num_shares`` = 1.0, all :math:`N`) and any majority can unmask (``reconstruction_threshold`` =
:math:`\lfloor N/2 \rfloor + 1`, at least 2).

**What the server checks** (:mod:`fedlmc.strategies.secure_checks`): it never sees a client,
so after the unmask stage it checks the clients' clear example counts against ``max_weight``,
the unmasked total of their shares against those counts, and the unmasked mean's finiteness and
range, and refuses an implausible round (:func:`secure_round`), never merging it.

**A client that drops out** (:func:`secure_round`). Every stage waits at most ``timeout``
seconds (Flower's default waits forever); a node that sends no good reply (an error of its
own, the SuperLink's "Node Unavailable" once its heartbeats stopped, or nothing in time) is
recorded in :attr:`SecureRound.dropped` with the stage it missed. Dropped in the
masked-vector stage (after it shared its keys), SecAgg+ removes its pairwise masks from the
survivors' shares of its key and the aggregate is the weighted average of the survivors,
while at least ``reconstruction_threshold`` of them remain; dropped in the unmask stage, its
masked vector is already in the sum. Fewer survivors than the threshold, or a node dropped
before its key shares reached the others (setup or share-keys stage: Flower 1.42's survivors
then fail the unmask stage asking for shares they never received), give no aggregate:
:class:`SecureAggregationError` names the stage, the threshold and every dropped node.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import Context, RecordDict
from flwr.common import FitIns, FitRes, Parameters, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import LegacyContext, ServerConfig
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

from fedlmc.strategies.secure_checks import check_round, recording_total_share
from fedlmc.strategies.secure_grid import WatchingGrid, failure_text

__all__ = [
    "CLIPPING_KEY",
    "HEADROOM",
    "MAX_WEIGHT_KEY",
    "MERGE_KEY",
    "MIN_CLIPPING_RANGE",
    "QUANTIZATION_RANGE",
    "OutOfRangeError",
    "SecureAggregationError",
    "SecureResult",
    "SecureRound",
    "SecureSettings",
    "SumOnlyFedAvg",
    "check_in_range",
    "dropped_text",
    "float_keys",
    "from_secure_arrays",
    "holder_divided",
    "secure_arrays",
    "secure_average",
    "secure_round",
    "secure_settings",
]

QUANTIZATION_RANGE = 2**22
MODULUS_RANGE = 2**32
MIN_CLIPPING_RANGE = 8.0
HEADROOM = 4.0
CLIPPING_KEY = "secagg-clip"
MAX_WEIGHT_KEY = "secagg-max-weight"
MERGE_KEY = "secagg-merge"
"""Fit-config entries a secure round adds for the clients' own checks (not run-config keys)."""
SECURE_MESSAGE_ROUNDS = 4
"""SecAgg+'s message rounds with the clients: setup, key sharing, masked vectors, unmasking."""

StateDict = dict[str, torch.Tensor]


class OutOfRangeError(ValueError):
    """A value lies outside SecAgg+'s clipping range (it would be clipped silently)."""


class SecureAggregationError(RuntimeError):
    """The secure round produced no aggregate (too few clients answered to unmask)."""


@dataclass(frozen=True)
class SecureSettings:
    """SecAgg+'s clipping range :math:`c`, quantisation range :math:`Q`, modulus and
    ``max_weight`` :math:`M` (see the module docstring). A merge rule with per-key weight
    exponents (:mod:`fedlmc.merging.sum_form`) uses :meth:`share` and
    :meth:`exponent_error_bound`."""

    clipping_range: float
    max_weight: float
    quantization_range: int = QUANTIZATION_RANGE
    modulus_range: int = MODULUS_RANGE

    @property
    def step(self) -> float:
        """One quantisation level, :math:`2c/Q`."""
        return 2.0 * self.clipping_range / self.quantization_range

    def error_bound(self, num_examples: Sequence[int]) -> float:
        r""":math:`3 N c / (Q \sum_i r_i)`, :math:`r_i = n_i / M`: the largest difference of a
        securely aggregated value from the clear weighted average."""
        ratio_sum = sum(n / self.max_weight for n in num_examples)
        n = len(num_examples)
        return 3.0 * n * self.clipping_range / (self.quantization_range * ratio_sum)

    def share(self, num_examples: int) -> float:
        r""":math:`r_i = \mathrm{round}(Q\, n_i / M) / Q`: the weight SecAgg+ itself gives a
        client of ``num_examples`` (``secaggplus_mod``'s ``dq_ratio``), the share a client
        pre-scales by (:func:`fedlmc.merging.sum_form.client_scaled`)."""
        return round(num_examples / self.max_weight * self.quantization_range) / (
            self.quantization_range
        )

    def exponent_error_bound(self, num_examples: Sequence[int], exponent: int) -> float:
        """:func:`fedlmc.merging.sum_form.error_bound` of a value of weight exponent
        ``exponent`` for this round's clients (``exponent`` 0: :meth:`error_bound`)."""
        from fedlmc.merging.sum_form import error_bound

        total = sum(self.share(n) for n in num_examples)
        c, q = self.clipping_range, self.quantization_range
        return error_bound(exponent, len(num_examples), c, q, total)

    def holder_error_bound(self, num_examples: Sequence[int]) -> float:
        """:func:`fedlmc.merging.sum_form.holder_error_bound` of a holder-divided value
        (``heterofl``) for this round's clients (the smallest share decides)."""
        from fedlmc.merging.sum_form import holder_error_bound

        smallest = min(self.share(n) for n in num_examples)
        c, q = self.clipping_range, self.quantization_range
        return holder_error_bound(len(num_examples), c, q, smallest)

    def shares(self, num_clients: int) -> tuple[float, int]:
        """``(num_shares, reconstruction_threshold)``: ``1.0`` (Flower's float form: every
        sampled client; an integer must exceed 2) and a majority, at least 2."""
        return 1.0, max(2, num_clients // 2 + 1)


def float_keys(state: Mapping[str, torch.Tensor]) -> list[str]:
    """The keys of the floating-point arrays of ``state``, in order: what SecAgg+ sums."""
    return [k for k, v in state.items() if v.is_floating_point()]


def largest_value(state: Mapping[str, torch.Tensor]) -> tuple[str, float]:
    """``(key, value)`` of the floating-point value of ``state`` largest in absolute value (a
    non-finite one first), the value with its sign."""
    found, size = ("", 0.0), 0.0
    for key in float_keys(state):
        flat = state[key].detach().reshape(-1)
        if not flat.numel():
            continue
        bad = ~torch.isfinite(flat)
        if bool(bad.any()):
            return key, float(flat[bad][0])
        index = int(flat.abs().argmax())
        if abs(float(flat[index])) > size:
            found, size = (key, float(flat[index])), abs(float(flat[index]))
    return found


def check_in_range(state: Mapping[str, torch.Tensor], clipping_range: float, who: str) -> None:
    """:class:`OutOfRangeError` naming ``who``, the key and the value when a floating-point
    value of ``state`` lies outside :math:`[-c, c]` (or is not finite)."""
    key, value = largest_value(state)
    if not math.isfinite(value) or abs(value) > clipping_range:
        raise OutOfRangeError(
            f"{who}: {key!r} holds {value:.6g}, outside SecAgg+'s clipping range "
            f"[-{clipping_range:g}, {clipping_range:g}]; allowed: |value| <= {clipping_range:g} "
            "(set secagg-clipping-range to a larger power of two)"
        )


def clipping_rule(initial: Mapping[str, torch.Tensor]) -> float:
    """The smallest power of two at least ``HEADROOM`` times the initial model's largest
    absolute value, and at least :data:`MIN_CLIPPING_RANGE`."""
    check_in_range(initial, math.inf, "the initial model")  # finite
    _, value = largest_value(initial)
    needed = max(HEADROOM * abs(value), MIN_CLIPPING_RANGE)
    return float(2.0 ** math.ceil(math.log2(needed)))


def secure_settings(
    initial: Mapping[str, torch.Tensor], max_weight: int, clipping_range: float = 0.0
) -> SecureSettings:
    """The settings of the module docstring's rule (``clipping_range`` > 0 fixes :math:`c`);
    the initial model is checked to lie in range (:func:`check_in_range`) before any work."""
    if max_weight < 1:
        raise ValueError(f"max_weight = {max_weight}: allowed: at least 1 example")
    c = float(clipping_range) if clipping_range > 0 else clipping_rule(initial)
    check_in_range(initial, c, "the initial model")
    return SecureSettings(c, float(max_weight))


def secure_arrays(state: Mapping[str, torch.Tensor]) -> list[np.ndarray]:
    """The floating-point arrays of ``state`` as float64 NumPy arrays, in :func:`float_keys`
    order (float64 keeps Flower's quantisation exact to a level)."""
    return [state[k].detach().cpu().to(torch.float64).numpy() for k in float_keys(state)]


def from_secure_arrays(
    template: Mapping[str, torch.Tensor], arrays: Sequence[np.ndarray]
) -> StateDict:
    """A state dict shaped like ``template``: its floating-point entries from ``arrays`` (in
    :func:`float_keys` order, cast to the template's dtypes), the others the template's own."""
    keys = float_keys(template)
    if len(arrays) != len(keys):
        raise ValueError(f"got {len(arrays)} aggregated arrays for {len(keys)} float keys")
    state = {k: v.detach().cpu().clone() for k, v in template.items()}
    for key, array in zip(keys, arrays, strict=True):
        value = torch.as_tensor(np.asarray(array)).to(state[key].dtype)
        if tuple(value.shape) != tuple(state[key].shape):
            raise ValueError(f"aggregated {key!r} has shape {tuple(value.shape)}")
        state[key] = value
    return state


class SumOnlyFedAvg(FedAvg):
    """The legacy strategy the SecAgg+ workflow drives: samples ``num_clients`` nodes (the
    lowest node ids), sends them ``fit_config`` and the initial parameters, and returns the
    aggregate the workflow hands it. ``received`` keeps every parameter list its
    ``aggregate_fit`` received (SecAgg+ gives each result the same unmasked aggregate),
    ``num_examples`` and ``metrics`` each result's counts and metrics, ``failures`` the
    failures' text."""

    server_sees = "sum"
    """What the strategy receives of the clients (:mod:`fedlmc.study.server_sees`)."""

    def __init__(
        self, num_clients: int, initial: Parameters, fit_config: Mapping[str, Any]
    ) -> None:
        super().__init__(
            fraction_fit=1.0,
            fraction_evaluate=0.0,
            min_fit_clients=num_clients,
            min_evaluate_clients=0,
            min_available_clients=num_clients,
            initial_parameters=initial,
            on_fit_config_fn=lambda _round: dict(fit_config),
        )
        self.num_clients = num_clients
        self.fit_config = dict(fit_config)
        self.received: list[list[np.ndarray]] = []
        self.num_examples: list[int] = []
        self.metrics: list[dict[str, Any]] = []
        self.failures: list[str] = []

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """The ``num_clients`` connected nodes with the lowest node ids (as the clear round
        chooses them), never more: ``FedAvg``'s ``fraction_fit = 1.0`` would take every
        connected node. Waits for ``num_clients`` nodes as ``FedAvg`` does; asks for the count
        first because Flower's legacy workflow registers the grid's nodes only inside
        ``num_available``/``all``/``sample`` (or every 5 s), never inside ``wait_for``."""
        client_manager.num_available()
        client_manager.wait_for(self.num_clients)
        proxies = sorted(client_manager.all().values(), key=lambda proxy: proxy.node_id)
        fit_ins = FitIns(parameters, dict(self.fit_config))
        return [(proxy, fit_ins) for proxy in proxies[: self.num_clients]]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Any]]:
        self.failures += [str(f) for f in failures]
        for _, fit_res in results:
            self.received.append(parameters_to_ndarrays(fit_res.parameters))
            self.num_examples.append(int(fit_res.num_examples))
            self.metrics.append(dict(fit_res.metrics))
        if not results:
            return None, {}
        return results[0][1].parameters, {}

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list:
        """No evaluation round: the server evaluates the merge on its own data."""
        return []


class _RecordingSecAggPlus(SecAggPlusWorkflow):
    """SecAgg+ that keeps the reasons of the failures it met (the workflow itself drops them)
    and every node that gave no good reply, ``{node id: "SecAgg+ stage 'S': reason"}`` at the
    first stage it missed: in ``dropped`` before its masked vector reached the sum, in
    ``unmask_missed`` after (the grid it runs on is a :class:`WatchingGrid`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failures: list[str] = []
        self.dropped: dict[int, str] = {}
        self.unmask_missed: dict[int, str] = {}
        self.halted_at = ""
        self.total_shares: list[int] = []  # the unmasked total share (recording_total_share)

    def _recorded(self, stage: str, step: Any, grid: Any, context: Any, state: Any) -> bool:
        grid.unanswered = {}
        done = step(grid, context, state)
        self.failures += [failure_text(f) for f in state.failures[len(self.failures) :]]
        missed = self.unmask_missed if stage == "unmask" else self.dropped
        for node, reason in grid.unanswered.items():
            if node not in self.dropped:
                missed.setdefault(node, f"SecAgg+ stage {stage!r}: {reason}")
        if not done and not self.halted_at:
            self.halted_at = stage
        return done

    def setup_stage(self, grid, context, state) -> bool:
        return self._recorded("setup", super().setup_stage, grid, context, state)

    def share_keys_stage(self, grid, context, state) -> bool:
        return self._recorded("share keys", super().share_keys_stage, grid, context, state)

    def collect_masked_vectors_stage(self, grid, context, state) -> bool:
        step = super().collect_masked_vectors_stage
        return self._recorded("masked vectors", step, grid, context, state)

    def unmask_stage(self, grid, context, state) -> bool:
        with recording_total_share(self.total_shares):
            return self._recorded("unmask", super().unmask_stage, grid, context, state)


def dropped_text(dropped: Mapping[int, str]) -> str:
    """``"node N: SecAgg+ stage 'S': reason; ..."`` on one line, in node order."""
    return "; ".join(f"node {node}: {dropped[node]}" for node in sorted(dropped))


@dataclass
class SecureRound:
    """What one SecAgg+ round gave: the unmasked weighted average of what the clients sent,
    their example counts and metrics, what the strategy received, the failures, the nodes
    dropped before their masked vector reached the sum (``{node id: "SecAgg+ stage 'S':
    reason"}``, :func:`dropped_text`), those whose vector is in the sum but whose unmasking
    shares did not arrive (``unmask_missed``, same form), the unmasked total of the clients'
    quantised shares (:func:`~fedlmc.strategies.secure_checks.recording_total_share`) and the
    cost (message rounds, bytes the clients sent, wall seconds)."""

    aggregate: list[np.ndarray]
    settings: SecureSettings
    num_examples: list[int]
    metrics: list[dict[str, Any]]
    received: list[list[np.ndarray]]
    failures: list[str] = field(default_factory=list)
    dropped: dict[int, str] = field(default_factory=dict)
    unmask_missed: dict[int, str] = field(default_factory=dict)
    total_share: int | None = None
    rounds: int = SECURE_MESSAGE_ROUNDS
    bytes_sent: int = 0
    seconds: float = 0.0

    @property
    def error_bound(self) -> float:
        """:meth:`SecureSettings.error_bound` for this round's clients."""
        return self.settings.error_bound(self.num_examples)


@dataclass
class SecureResult(SecureRound):
    """A secure merge: the round, the merged state (the initial model's keys) and the rule's
    weight exponents per key (:mod:`fedlmc.merging.sum_form`; empty: the plain average)."""

    merged_state: StateDict = field(default_factory=dict)
    exponents: dict[str, int] = field(default_factory=dict)
    divided_by_holders: bool = False

    @property
    def error_bound(self) -> float:
        """The largest :meth:`SecureSettings.exponent_error_bound` over the rule's exponents
        (:meth:`SecureSettings.holder_error_bound` for a holder-divided merge)."""
        if self.divided_by_holders:
            return self.settings.holder_error_bound(self.num_examples)
        powers = set(self.exponents.values()) or {0}
        return max(self.settings.exponent_error_bound(self.num_examples, e) for e in powers)


def secure_round(
    grid: Any,
    sent: Sequence[np.ndarray],
    num_clients: int,
    fit_config: Mapping[str, Any],
    settings: SecureSettings,
    timeout: float | None = None,
) -> SecureRound:
    """One SecAgg+ round on ``grid``: every one of ``num_clients`` nodes receives the arrays
    ``sent`` and ``fit_config`` (its secure handler reads what to compute from it) and the
    server obtains the weighted average of the clients' answers.
    :class:`SecureAggregationError` naming the stage and the failures when the round yields
    no aggregate; :class:`~fedlmc.strategies.secure_checks.ImplausibleAggregateError` when its
    weights or aggregate are implausible (:func:`~fedlmc.strategies.secure_checks.check_round`)."""
    start = time.perf_counter()
    strategy = SumOnlyFedAvg(num_clients, ndarrays_to_parameters(list(sent)), fit_config)
    context = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={})
    legacy = LegacyContext(context, ServerConfig(num_rounds=1, round_timeout=timeout), strategy)
    num_shares, threshold = settings.shares(num_clients)
    secagg = _RecordingSecAggPlus(
        num_shares=num_shares,
        reconstruction_threshold=threshold,
        max_weight=settings.max_weight,
        clipping_range=settings.clipping_range,
        quantization_range=settings.quantization_range,
        modulus_range=settings.modulus_range,
        timeout=timeout,
    )
    watching = WatchingGrid(grid)
    DefaultWorkflow(fit_workflow=secagg)(watching, legacy)
    if not strategy.received:
        missed = secagg.dropped | secagg.unmask_missed
        reasons = "; ".join(dict.fromkeys(secagg.failures + strategy.failures)) or "none given"
        raise SecureAggregationError(
            f"SecAgg+ halted at its {secagg.halted_at or 'last'} stage with no aggregate "
            f"(need {threshold} of {num_clients} clients to unmask; "
            f"{num_clients - len(missed)} remained); dropped: {dropped_text(missed) or 'none'}; "
            f"failures: {reasons}"
        )
    found = SecureRound(
        strategy.received[0],
        settings,
        strategy.num_examples,
        strategy.metrics,
        strategy.received,
        failures=secagg.failures + strategy.failures,
        bytes_sent=watching.bytes_received,
        dropped=dict(secagg.dropped),
        unmask_missed=dict(secagg.unmask_missed),
        total_share=secagg.total_shares[-1] if secagg.total_shares else None,
        seconds=time.perf_counter() - start,
    )
    check_round(found)
    return found


def secure_average(
    grid: Any,
    initial: Mapping[str, torch.Tensor],
    num_clients: int,
    fit_config: Mapping[str, Any],
    settings: SecureSettings,
    timeout: float | None = None,
    exponents: Mapping[str, int] | None = None,
    divide_by_holders: bool = False,
) -> SecureResult:
    """The secure merge: a :func:`secure_round` in which every client trains from ``initial``
    (all its arrays, in order) and answers its floating-point arrays, each key pre-scaled by
    its share to the power ``exponents[key]`` (none: the plain average); the weighted mean,
    with ``initial``'s keys (:func:`from_secure_arrays`), post-scaled by the summed shares of
    the clients in it to the power ``-exponents[key]``
    (:func:`fedlmc.merging.sum_form.server_rescaled`). With ``divide_by_holders`` the clients
    answer their held values then their holder masks (twice the arrays) and the mean of the
    first is divided by that of the second (:func:`holder_divided`)."""
    from fedlmc.merging.sum_form import server_rescaled

    sent = [v.detach().cpu().numpy() for v in initial.values()]
    found = secure_round(grid, sent, num_clients, fit_config, settings, timeout)
    aggregate = found.aggregate
    if divide_by_holders:
        aggregate = holder_divided(initial, aggregate, settings, found.num_examples)
    mean = from_secure_arrays(initial, aggregate)
    powers = {k: int(e) for k, e in (exponents or {}).items() if e}
    total = sum(settings.share(n) for n in found.num_examples)
    merged = server_rescaled(mean, powers, total) if powers else mean
    held = {"divided_by_holders": divide_by_holders}
    return SecureResult(**vars(found), merged_state=merged, exponents=powers, **held)


def holder_divided(
    initial: Mapping[str, torch.Tensor],
    aggregate: Sequence[np.ndarray],
    settings: SecureSettings,
    num_examples: Sequence[int],
) -> list[np.ndarray]:
    r"""The secure means of the held values (the first half of ``aggregate``) divided by those
    of the holder masks (the second half, sent times :math:`c`), in float64: the empty-slot
    value where the mask mean is at most :math:`r/(2S)` (:math:`r` the smallest share,
    :math:`S` their sum; :func:`fedlmc.merging.sum_form.divided_by_holders`)."""
    from fedlmc.merging.sum_form import divided_by_holders

    keys = float_keys(initial)
    n = len(keys)
    if len(aggregate) != 2 * n:
        raise ValueError(f"got {len(aggregate)} aggregated arrays for 2 x {len(keys)} float keys")
    as64 = [torch.as_tensor(np.asarray(a, dtype=np.float64)) for a in aggregate]
    halves = [dict(zip(keys, as64[:n], strict=True)), dict(zip(keys, as64[n:], strict=True))]
    shares = [settings.share(n) for n in num_examples]
    threshold = min(shares) / (2 * sum(shares))
    merged = divided_by_holders(*halves, settings.clipping_range, threshold)
    return [merged[k].numpy() for k in keys]
