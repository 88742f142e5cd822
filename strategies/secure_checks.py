r"""What the server checks of a SecAgg+ round, where it cannot screen the clients one by one.

Under SecAgg+ the server never holds a client's arrays, only their unmasked weighted mean, so
the reply screen (:mod:`fedlmc.strategies.screening`) cannot drop a bad client by name. What
the server can check without seeing a client is checked once the round is unmasked, and an
implausible aggregate refuses the round: :class:`ImplausibleAggregateError`, one line saying
what failed and what the user can do. No client is named: none can be.

**The weights** (:func:`weight_problem`). Client :math:`i` sends its example count
:math:`n_i` in the clear (the legacy ``FitRes``) and its share
:math:`q_i = \mathrm{round}(Q\, n_i / M)` inside its masked vector; the server unmasks
:math:`q = \sum_i q_i \bmod 2^{32}` and divides the sum by it (Flower keeps it to itself:
:func:`recording_total_share` records it). An honest client has :math:`1 \le n_i \le M`
(:math:`M` = ``max_weight``, the size of the training pool), so the clear counts sum to at
most :math:`N M`, and :math:`q` equals :math:`\sum_i \mathrm{round}(Q\, n_i / M)` of the
clear counts exactly. A count above :math:`M` (its arrays, scaled by a share above 1, are
clipped), a sum above :math:`N M`, or a masked total that disagrees with the clear counts
(a client that reported one count and weighted its vector by another) refuses the round.

**The aggregate** (:func:`aggregate_problem`). Every client checks its values lie in
:math:`[-c, c]` before it masks them, and a weighted mean of such values lies in
:math:`[-c, c]` too, up to the quantisation bound :math:`\varepsilon = 3 N c / (Q R)`
(:meth:`fedlmc.strategies.secure.SecureSettings.error_bound`, :math:`R = q/Q`). A non-finite
value, or one beyond :math:`c + \varepsilon`, refuses the round: a client sent NaN (Flower
quantises it to an integer far outside the range) or a share whose values wrapped around the
modulus.

**The merged model** (:func:`merged_model_problem`, where the server holds data: the server
split of a ``fedlmc`` run). A non-finite loss on it refuses the round; so does, when the
clients start from the server's initialisation (``init = "shared"``), a merged model no
better than that initial model on either count: an accuracy no better than always predicting
the split's most frequent class, at three standard errors (:math:`a \le p + 3\sqrt{p(1-p)/n}`,
:math:`p` that class's share, :math:`n` the split's size), **and** a loss at or above the
initial model's. Accuracy alone would refuse honest rounds: eight barely trained clients (a
16-unit MLP, one epoch) merged to 0.13 on the server split, below the 0.145 of a balanced split
of 400, but with a loss below the initial model's. A merge of independently initialised models
can honestly be at chance (eight independent clients average to 0.10), so it is not refused for
that. A constant inside the clipping range sent by one client (every value 8) passes the two
checks above and is refused here (accuracy 0.10, loss far above the initial model's); without
server data nothing can refuse it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from fedlmc.strategies.strategy_utils import ClientsFailedError

__all__ = [
    "ImplausibleAggregateError",
    "aggregate_problem",
    "chance_accuracy",
    "check_round",
    "merged_model_problem",
    "recording_total_share",
    "refusal",
    "weight_problem",
]

_RECORDING = threading.Lock()
"""One secure round's unmask stage at a time records Flower's total share."""


class ImplausibleAggregateError(ClientsFailedError):
    """A SecAgg+ round's unmasked aggregate is one no honest round gives: the round is refused
    (the clients failed it, not the configuration: the CLI exits 1)."""


@contextmanager
def recording_total_share(found: list[int]) -> Iterator[list[int]]:
    """While open, every SecAgg+ unmask stage of this process appends to ``found`` the unmasked
    total :math:`q` of the clients' quantised shares it divides the sum by. Flower 1.42's
    ``SecAggPlusWorkflow.unmask_stage`` keeps :math:`q` in a local variable, from its module's
    ``factor_extract``; that name is wrapped for the stage (a lock keeps two stages apart)."""
    from flwr.server.workflow.secure_aggregation import secaggplus_workflow as workflow

    original = workflow.factor_extract

    def recorded(parameters: list[np.ndarray]) -> tuple[Any, list[np.ndarray]]:
        factor, rest = original(parameters)
        found.append(int(factor))
        return factor, rest

    with _RECORDING:
        workflow.factor_extract = recorded
        try:
            yield found
        finally:
            workflow.factor_extract = original


def weight_problem(
    counts: Sequence[int], total_share: int | None, max_weight: float, levels: int, modulus: int
) -> str | None:
    """What is implausible about the clients' weights (see the module docstring), else ``None``:
    the clear ``counts``, the unmasked ``total_share`` :math:`q` (``None``: not recorded),
    ``max_weight`` :math:`M`, the quantisation range :math:`Q` (``levels``) and the modulus."""
    n = len(counts)
    if any(not math.isfinite(c) or c < 1 for c in counts):
        return f"a client reported {min(counts)} examples; allowed: at least 1"
    if sum(counts) > n * max_weight or max(counts) > max_weight:
        return (
            f"the {n} clients claim {sum(counts):.6g} examples in all, the largest claim "
            f"{max(counts):.6g}; allowed: at most max_weight = {max_weight:g} each "
            f"(N x max_weight = {n * max_weight:g} in all)"
        )
    expected = sum(round(c / max_weight * levels) for c in counts) % modulus
    if total_share is not None and int(total_share) != expected:
        return (
            f"the unmasked sum of the clients' shares is {total_share / levels:.6g}, the "
            f"clear example counts give {expected / levels:.6g}; allowed: equal (a client "
            "weighted its masked vector by another count than it reported)"
        )
    return None


def aggregate_problem(aggregate: Sequence[np.ndarray], clipping: float, bound: float) -> str | None:
    """What is implausible about the unmasked weighted mean ``aggregate``, else ``None``: a
    non-finite value, or one beyond the clipping range ``clipping`` by more than ``bound``."""
    for index, array in enumerate(aggregate):
        values = np.asarray(array, dtype=np.float64).reshape(-1)
        if not np.isfinite(values).all():
            return f"array {index} of the unmasked mean holds a non-finite value"
        largest = float(np.abs(values).max()) if values.size else 0.0
        if largest > clipping + bound:
            return (
                f"array {index} of the unmasked mean holds {largest:.6g}; allowed: |value| <= "
                f"the clipping range {clipping:g} + the quantisation bound {bound:.1e} (a "
                "mean of in-range values)"
            )
    return None


def check_round(found: Any) -> None:
    """:class:`ImplausibleAggregateError` when a :class:`fedlmc.strategies.secure.SecureRound`'s
    weights (:func:`weight_problem`) or aggregate (:func:`aggregate_problem`) are implausible."""
    settings = found.settings
    problem = weight_problem(
        found.num_examples,
        found.total_share,
        settings.max_weight,
        settings.quantization_range,
        settings.modulus_range,
    )
    if problem is None:
        bound = settings.error_bound(found.num_examples)
        problem = aggregate_problem(found.aggregate, settings.clipping_range, bound)
    if problem is not None:
        raise ImplausibleAggregateError(refusal(problem))


def refusal(problem: str) -> str:
    """The refusal's one line: the ``problem`` and what the user can do."""
    return (
        f"SecAgg+ round refused: {problem}; SecAgg+ hides which client sent it, so none can "
        "be dropped: run the cell again without that client (or without secure-aggregation, "
        "where each reply is screened and a bad one dropped by name)"
    )


def chance_accuracy(labels: Sequence[int] | np.ndarray) -> float:
    r"""The accuracy no better than chance on ``labels``: the most frequent class's share
    :math:`p` plus three standard errors, :math:`p + 3\sqrt{p(1-p)/n}`."""
    y = np.asarray(labels).reshape(-1)
    if not y.size:
        return 1.0
    p = float(np.bincount(y.astype(np.int64)).max()) / y.size
    return p + 3.0 * math.sqrt(p * (1.0 - p) / y.size)


def merged_model_problem(
    merged: tuple[float, float],
    initial_loss: float,
    labels: Sequence[int] | np.ndarray,
    shared_start: bool,
) -> str | None:
    """What is implausible about the ``merged`` model's ``(accuracy, mean loss)`` on the server
    split of ``labels``, else ``None``: a non-finite loss; with ``shared_start`` (the clients
    trained from the server's initialisation, whose loss there is ``initial_loss``), an
    accuracy at or below :func:`chance_accuracy` with a loss at or above the initial model's:
    no better than the model the clients started from, on either count."""
    accuracy, loss = merged
    if not math.isfinite(loss):
        return f"the merged model's loss on the server split is {loss}; allowed: finite"
    chance = chance_accuracy(labels)
    if shared_start and accuracy <= chance and loss >= initial_loss:
        return (
            f"the merged model's accuracy on the server split is {accuracy:.4f}, no better "
            f"than chance ({chance:.4f}: the most frequent class's share + 3 standard errors), "
            f"and its loss {loss:.4g} no better than the initial model's ({initial_loss:.4g}); "
            "allowed: better on either, for clients that start from the server's initialisation"
        )
    return None
