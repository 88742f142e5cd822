"""The federated temperature under SecAgg+ (:mod:`fedlmc.strategies.secure_temperature`): the
settings keep the modular sum exact for N clients, the pooled means of a round times the counts
are the clients' summed statistics (what the clear fit adds), and a fit's cost adds up its
rounds. The fit over Flower's SecAgg+ in a federation runs in ``test_secure.py``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedlmc.merging.calibrate import combine_temperature_statistics, temperature_statistics
from fedlmc.strategies.secure import SecureRound
from fedlmc.strategies.secure_temperature import (
    TEMPERATURE_CLIPPING,
    SecureTemperature,
    pooled_statistics,
    temperature_settings,
)


@pytest.mark.parametrize(
    ("clients", "q"), [(1, 2**30), (2, 2**30), (3, 2**29), (4, 2**29), (5, 2**28)]
)
def test_the_quantisation_range_leaves_room_for_n_clients_in_31_bits(clients, q):
    settings = temperature_settings(clients, max_weight=100.0)
    assert (
        settings.quantization_range == q and q * 2 ** math.ceil(math.log2(max(clients, 2))) == 2**31
    )
    assert settings.clipping_range == TEMPERATURE_CLIPPING and settings.max_weight == 100.0
    # the per-value error bound 3 N c / (Q sum r_i) shrinks as the clients hold more data
    assert settings.error_bound([100] * clients) < settings.error_bound([10] * clients)


def a_round(means: list[list[float]], counts: list[int], seconds: float) -> SecureRound:
    """A round whose aggregate is the exact count-weighted mean of the clients' means."""
    pooled = np.average(np.asarray(means), axis=0, weights=counts)
    settings = temperature_settings(len(counts), max(counts))
    return SecureRound(
        [pooled], settings, counts, [{}] * len(counts), [], bytes_sent=10, seconds=seconds
    )


def test_pooled_means_times_the_count_are_the_summed_statistics():
    generator = torch.Generator().manual_seed(0)
    clients = [
        (torch.randn(n, 5, generator=generator) * 3, torch.randint(0, 5, (n,), generator=generator))
        for n in (40, 25, 7)
    ]
    log_t = 0.3
    stats = [temperature_statistics(z, y, log_t) for z, y in clients]
    means = [[s.nll_sum / s.count, s.grad_sum / s.count, s.hess_sum / s.count] for s in stats]
    pooled = pooled_statistics(a_round(means, [s.count for s in stats], 0.5))
    clear = combine_temperature_statistics(stats)
    assert pooled.count == clear.count == 72
    for got, want in zip(
        (pooled.nll_sum, pooled.grad_sum, pooled.hess_sum),
        (clear.nll_sum, clear.grad_sum, clear.hess_sum),
        strict=True,
    ):
        assert got == pytest.approx(want, rel=1e-12)


def test_a_fit_costs_the_sum_of_its_rounds():
    rounds = [a_round([[1.0, 0.0, 1.0]], [10], s) for s in (0.25, 0.5)]
    fit = SecureTemperature(1.5, [{}, {}], rounds)
    assert fit.message_rounds == sum(r.rounds for r in rounds)
    assert fit.bytes_sent == 20 and fit.seconds == 0.75
    assert fit.error_bound == rounds[0].error_bound
    assert math.isnan(SecureTemperature(1.0, []).error_bound)
