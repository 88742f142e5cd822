r"""Differential privacy on the one-shot plain average, with Flower's own DP wrapper.

:func:`private_one_shot_average` builds Flower's Message-API ``FedAvg`` (every one of the
:math:`N` clients, one round) wrapped in ``DifferentialPrivacyServerSideFixedClipping``
(``flwr.serverapp.strategy``): each client's update :math:`\Delta_i = \theta_i - \theta_0`
relative to the arrays the server sent is clipped to norm :math:`C`,

.. math::

    \Delta_i \leftarrow \Delta_i \min\left(1, \frac{C}{\lVert \Delta_i \rVert_2}\right),

the clipped models are averaged, and Gaussian noise of standard deviation :math:`z C / N`
(:math:`z` the noise multiplier) is added to every value of the average. Clipping relative to
the server's arrays is meaningful only when every client starts from them: ``init = "shared"``.

:func:`one_round_epsilon` is the privacy budget Flower's RDP accountant gives one such release
(no sampling amplification: every client takes part); it needs Flower's optional
``dp-accounting`` dependency (``pip install "flwr[dp]"``) and returns ``None`` without it.

Flower 1.42 divides by the update's norm when it clips, so a client whose weights did not move
(a zero update) raises ``ZeroDivisionError`` there; :class:`ZeroSafeServerSideFixedClipping`
clips a zero update to itself (it is within every norm) and records what it received (replies,
bytes) for the run's round columns. Both wrappers draw Flower's noise (same standard
deviation) from their own seeded generator (:class:`SeededNoise`), not NumPy's global one.
With ``side = "client"`` the clipping happens on each client instead (Flower's
``DifferentialPrivacyClientSideFixedClipping`` sends the norm, Flower's ``fixedclipping_mod``
clips, :mod:`fedlmc.simulations.private.dp_client`) and the server only averages and adds the
noise: :class:`CountingClientSideFixedClipping`. The run config's ``dp`` key runs them
(:mod:`fedlmc.simulations.private.dp_server`); a notebook calls
``private_one_shot_average(...).start(grid=..., initial_arrays=..., num_rounds=1, ...)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from logging import WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)
from flwr.supercore import log
from flwr.supercore.differential_privacy import compute_stdv

from fedlmc.strategies.payload import ScreenError, check_record
from fedlmc.strategies.strategy_utils import plain_text

__all__ = [
    "CountingClientSideFixedClipping",
    "PayloadScreen",
    "ZeroSafeServerSideFixedClipping",
    "clip_update",
    "one_round_epsilon",
    "private_one_shot_average",
]


def clip_update(arrays: list[np.ndarray], sent: list[np.ndarray], norm: float) -> list:
    r"""``sent + (arrays - sent) * min(1, norm / ||arrays - sent||)``: the update clipped to
    L2 norm ``norm`` (Flower's FlatClip); a zero update is returned as it is. ``ValueError``
    for an update whose norm is not finite (a client's reply is untrusted)."""
    update = [np.subtract(a, s) for a, s in zip(arrays, sent, strict=True)]
    length = math.sqrt(sum(float(np.sum(np.square(u, dtype=np.float64))) for u in update))
    if not math.isfinite(length):
        raise ValueError(f"a client's update has norm {length}: allowed: a finite norm")
    scale = 1.0 if length == 0.0 else min(1.0, norm / length)
    triples = zip(arrays, sent, update, strict=True)
    return [np.asarray(s + u * scale, dtype=a.dtype) for a, s, u in triples]


class SeededNoise:
    """Flower's Gaussian noise of standard deviation :math:`z C / N` (``compute_stdv``) drawn
    from the wrapper's own generator (``noise_seed``) instead of NumPy's global one, so that
    a run's noise is reproducible and two runs in one process do not share draws."""

    noise_seed: int | None = None

    def _add_noise_to_aggregated_arrays(self, aggregated_arrays: ArrayRecord) -> ArrayRecord:
        rng = np.random.default_rng(self.noise_seed)
        std = compute_stdv(self.noise_multiplier, self.clipping_norm, self.num_sampled_clients)
        noisy = {
            key: Array(np.asarray(a + rng.normal(0.0, std, a.shape).astype(a.dtype)))
            for key, a in zip(
                aggregated_arrays.keys(), aggregated_arrays.to_numpy_ndarrays(), strict=True
            )
        }
        return ArrayRecord(noisy)


class PayloadScreen:
    """The payload screen (:mod:`fedlmc.strategies.payload`) in front of Flower's DP wrappers:
    a reply whose arrays are not exactly those the server sent (keys, and bytes against their
    labels and the sent shapes) is dropped before anything decodes it, logged and named in
    ``dropped`` (``node N: reason``); error replies are left out as Flower leaves them."""

    sent: ArrayRecord | None = None
    dropped: tuple[str, ...] = ()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config, grid):
        self.sent = arrays
        return super().configure_train(server_round, arrays, config, grid)

    def screened(self, replies: Iterable[Message]) -> list[Message]:
        """The replies without an error whose every ArrayRecord passes the payload screen."""
        sent = self.sent if self.sent is not None else getattr(self, "current_arrays", None)
        shapes = {k: tuple(a.shape) for k, a in (sent or {}).items()}
        kept, dropped = [], []
        for reply in replies:
            if reply.has_error():
                continue
            try:
                for record in reply.content.array_records.values():
                    if shapes and set(record.keys()) != set(shapes):
                        raise ScreenError("wrong arrays: not the keys the server sent")
                    check_record(record, shapes or None)
                kept.append(reply)
            except ScreenError as err:
                dropped.append(plain_text(f"node {reply.metadata.src_node_id}: {err}"))
                log(WARNING, "dp round: dropped reply from %s", dropped[-1])
        self.dropped = tuple(dropped)
        return kept


class ZeroSafeServerSideFixedClipping(
    PayloadScreen, SeededNoise, DifferentialPrivacyServerSideFixedClipping
):
    """Flower's server-side fixed clipping (no accountant) whose clipping accepts a zero
    update (:func:`clip_update`), then the wrapped strategy's average and Flower's noise.
    ``replies`` and ``bytes_received``: what the last round received."""

    server_sees = "each model"  # clipped on the server: every model arrives in the clear
    replies = 0
    bytes_received = 0

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies_list = self.screened(replies)
        _count_replies(self, replies_list)
        sent = self.current_arrays.to_numpy_ndarrays()
        for reply in replies_list:
            for name, record in reply.content.array_records.items():
                arrays = record.to_numpy_ndarrays()
                clipped = clip_update(arrays, sent, self.clipping_norm)
                reply.content[name] = ArrayRecord(
                    dict(zip(record.keys(), (Array(c) for c in clipped), strict=True))
                )
        arrays, metrics = self.strategy.aggregate_train(server_round, replies_list)
        if arrays:
            arrays = self._add_noise_to_aggregated_arrays(arrays)
        return arrays, metrics


def _count_replies(strategy, replies: list[Message]) -> None:
    """Set ``strategy.replies`` and ``strategy.bytes_received`` from the round's replies."""
    strategy.replies = len(replies)
    strategy.bytes_received = sum(
        a.nbytes
        for reply in replies
        for record in reply.content.array_records.values()
        for a in record.to_numpy_ndarrays()
    )


class CountingClientSideFixedClipping(
    PayloadScreen, SeededNoise, DifferentialPrivacyClientSideFixedClipping
):
    """Flower's client-side fixed clipping (no accountant: the clients clip, the server
    averages and adds Flower's noise), recording ``replies`` and ``bytes_received``."""

    server_sees = "each model"  # each clipped model arrives in the clear
    replies = 0
    bytes_received = 0

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies_list = self.screened(replies)
        _count_replies(self, replies_list)
        return super().aggregate_train(server_round, replies_list)


def private_one_shot_average(
    num_clients: int,
    noise_multiplier: float,
    clipping_norm: float,
    side: str = "server",
    noise_seed: int | None = None,
) -> ZeroSafeServerSideFixedClipping | CountingClientSideFixedClipping:
    """Flower's ``FedAvg`` over all ``num_clients`` nodes (training only) inside Flower's
    fixed-clipping DP wrapper of ``side`` ``"server"`` (zero-safe) or ``"client"`` (see the
    module docstring), its noise drawn from a generator seeded with ``noise_seed`` (None: fresh
    entropy). ``ValueError`` naming the value for a negative ``noise_multiplier``, a
    non-positive ``clipping_norm``, fewer than one client or another ``side``."""
    if side not in WRAPPERS:
        raise ValueError(f"side = {side!r}: allowed: {', '.join(WRAPPERS)}")
    if num_clients < 1:
        raise ValueError(f"num_clients = {num_clients}: allowed: at least 1")
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ValueError(f"noise multiplier {noise_multiplier}: allowed: a number >= 0")
    if not (math.isfinite(clipping_norm) and clipping_norm > 0):
        raise ValueError(f"clipping norm {clipping_norm}: allowed: a number > 0")
    average = FedAvg(
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=num_clients,
        min_evaluate_nodes=0,
        min_available_nodes=num_clients,
    )
    wrapper = WRAPPERS[side](average, noise_multiplier, clipping_norm, num_clients)
    wrapper.noise_seed = noise_seed
    return wrapper


WRAPPERS = {"server": ZeroSafeServerSideFixedClipping, "client": CountingClientSideFixedClipping}
"""The DP wrapper of each clipping side."""


def one_round_epsilon(noise_multiplier: float, num_clients: int, delta: float) -> float | None:
    r""":math:`\varepsilon` at ``delta`` of one release of the wrapper's Gaussian mechanism
    (noise multiplier :math:`z`, all ``num_clients`` clients, no sampling amplification, one
    client added or removed), from Flower's RDP accountant; ``None`` without Flower's optional
    ``dp-accounting`` dependency."""
    from flwr.serverapp import (
        GaussianPrivacyEvent,
        NeighboringRelation,
        PrivacyConfig,
        SamplingMethod,
    )

    try:
        from flwr.serverapp import RdpAccountant

        config = PrivacyConfig(
            target_delta=delta,
            population_size=num_clients,
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            sampling_method=SamplingMethod.NO_AMPLIFICATION,
        )
        accountant = RdpAccountant(config)
    except ImportError:
        return None
    accountant.compose(GaussianPrivacyEvent(noise_multiplier, num_clients, num_clients))
    return float(accountant.get_epsilon(delta))
