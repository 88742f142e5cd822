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

Not wired to the run config yet: a notebook or a ServerApp calls
``private_one_shot_average(...).start(grid=..., initial_arrays=..., num_rounds=1, ...)``.
"""

from __future__ import annotations

import math

from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

__all__ = ["one_round_epsilon", "private_one_shot_average"]


def private_one_shot_average(
    num_clients: int, noise_multiplier: float, clipping_norm: float
) -> DifferentialPrivacyServerSideFixedClipping:
    """Flower's ``FedAvg`` over all ``num_clients`` nodes (training only) inside Flower's
    server-side fixed-clipping DP wrapper (see the module docstring). ``ValueError`` naming
    the value for a negative ``noise_multiplier``, a non-positive ``clipping_norm`` or fewer
    than one client."""
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
    wrapper = DifferentialPrivacyServerSideFixedClipping(
        average, noise_multiplier, clipping_norm, num_clients
    )
    wrapper.server_sees = "each model"  # clipped on the server: every model arrives in the clear
    return wrapper


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
