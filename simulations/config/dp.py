"""The differential-privacy run-config keys (``dp``, ``dp-noise-multiplier``,
``dp-clipping-norm``): their values and the check of a cell that uses them.

``dp = "server-fixed"`` merges ``strategy = "average"`` through Flower's
``DifferentialPrivacyServerSideFixedClipping`` (:mod:`fedlmc.strategies.private`): each
client's update relative to the server's arrays is clipped to ``dp-clipping-norm`` on the
server (``dp = "client-fixed"``: on the client, by Flower's ``fixedclipping_mod``, with
``DifferentialPrivacyClientSideFixedClipping`` on the server), and Gaussian noise of standard
deviation ``dp-noise-multiplier * dp-clipping-norm / N`` is added to their average. The
update is relative to the arrays the server sent, so DP needs every client to start from them
(``init = "shared"``). No Flower import here: the run-config validation reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedlmc.simulations.config.schema import ConfigError
from fedlmc.simulations.config.values import Mode

__all__ = ["CLIENT_FIXED", "DP_DELTA", "DP_MODES", "DP_OFF", "check_dp", "is_dp"]

DP_OFF = "off"
CLIENT_FIXED = "client-fixed"
DP_MODES = (DP_OFF, "server-fixed", CLIENT_FIXED)
"""``off``: no noise, no clipping; ``server-fixed``: Flower's server-side fixed clipping and
Gaussian noise on the one-shot average; ``client-fixed``: each client clips its own update
(Flower's ``fixedclipping_mod``), the server adds the same noise
(``DifferentialPrivacyClientSideFixedClipping``)."""

DP_DELTA = 1e-5
"""The delta at which a DP row's ``dp_epsilon`` is given."""


def is_dp(config: Mapping[str, Any]) -> bool:
    """Whether the run merges under differential privacy."""
    return config.get("dp", DP_OFF) != DP_OFF


def check_dp(config: Mapping[str, Any]) -> None:
    """A DP cell: ``strategy = "average"``, ``init = "shared"``, no secure aggregation, no
    warm-up rounds and no federated calibration (each would send the clients' arrays or
    losses to the server outside the DP release); ``dp-clipping-norm > 0`` and
    ``dp-noise-multiplier >= 0`` are the keys' own checks."""
    if not is_dp(config):
        return
    mode = config["dp"]
    needs = {
        "strategy": (Mode.AVERAGE.value, "the one merge fedlmc runs under DP"),
        "init": ("shared", "clipping acts on the update from the server's arrays"),
        "secure-aggregation": ("off", "DP under SecAgg+ is not built"),
        "warmup-rounds": (0, "warm-up rounds average in the clear"),
    }
    for key, (allowed, why) in needs.items():
        if config[key] != allowed:
            raise ConfigError(
                f"dp = {mode!r} with {key} = {config[key]!r}: allowed only with "
                f"{key} = {allowed!r} ({why})"
            )
    if config["calibration"] == "federated":
        raise ConfigError(
            f"dp = {mode!r} with calibration = 'federated': allowed: calibration = 'server' "
            "or 'none' (federated calibration sends each client's losses outside the DP release)"
        )
