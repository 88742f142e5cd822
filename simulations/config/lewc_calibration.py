"""``calibration = "lewc"``: the check of a cell that asks for LEWC's data-free temperature, and
the note a run prints when its clients share their start.

LEWC's temperature :math:`T = \\sum_i w_i^{\\,L}` (:mod:`fedlmc.merging.lewc_temperature`) is
defined for the plain average of norm-free plain chains: the ``average`` strategy on a bias-free
model, or ``aligned`` with ``align = "average_lewc_bias"`` (biases combined as LEWC's signal
is). :func:`check_lewc_calibration` refuses every other one-shot cell in one line, before any
work: another merge, a residual model, a norm layer, biases under the plain average, and
differential privacy (its noise changes the logits' scale, and it runs from a shared start).
A user's model factory is checked when the strategy is built, before any client trains.
From a shared initialisation the run goes on with :math:`T = 1` and says so
(:func:`lewc_note`). No torch or Flower import here: the run-config validation reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedlmc.merging.lewc_temperature import CALIBRATION, LEWC_MERGES, ONE_BASIN_NOTE
from fedlmc.models.registry import model_entry
from fedlmc.simulations.config.derived import align_method, resolved_bias, resolved_norm
from fedlmc.simulations.config.dp import is_dp
from fedlmc.simulations.config.schema import ConfigError
from fedlmc.simulations.config.values import ONE_SHOT_MODES, Mode

__all__ = ["check_lewc_calibration", "lewc_note", "uses_lewc"]

PLAIN = (
    f"strategy = '{Mode.AVERAGE}' with bias = false, or strategy = '{Mode.ALIGNED}' with align = "
)
"""The start of what a refusal allows."""


def uses_lewc(config: Mapping[str, Any]) -> bool:
    """Whether the run's temperature is LEWC's: ``calibration = "lewc"`` in a one-shot mode."""
    return config["strategy"] in ONE_SHOT_MODES and config["calibration"] == CALIBRATION


def merge_of(config: Mapping[str, Any]) -> str:
    """The one-shot merge: ``average``, or the ``align`` method of ``aligned``."""
    return align_method(config) if config["strategy"] == Mode.ALIGNED else "average"


def check_lewc_calibration(config: Mapping[str, Any]) -> None:
    """:class:`ConfigError` (one line: the bad value and what is allowed) for a cell whose
    LEWC temperature is undefined (module docstring); nothing for any other cell."""
    if not uses_lewc(config):
        return
    method, model, norm = merge_of(config), config["model"], resolved_norm(config)
    allowed = f"{PLAIN}'average_lewc_bias'"
    if method not in LEWC_MERGES:
        why = "LEWC predicts the logit scale of the plain average only"
        raise ConfigError(
            f"calibration = 'lewc' with align = {method!r}: {why}; allowed: {allowed}"
        )
    if model_entry(model).plain_chain is False:
        why = "residual blocks mix terms of different depth: no single exponent L"
        raise ConfigError(
            f"calibration = 'lewc' with model = {model!r}: {why}; allowed: a plain chain "
            "(mlp, vgg11 with norm = 'none')"
        )
    if norm != "none":
        why = "a norm layer rescales the merged activations, undoing LEWC's shrinkage"
        raise ConfigError(
            f"calibration = 'lewc' with norm = {norm!r}: {why}; allowed: norm = 'none'"
        )
    if method == "average" and resolved_bias(config) == "true":
        why = "plainly averaged biases keep their scale while LEWC's signal shrinks"
        raise ConfigError(
            f"calibration = 'lewc' with bias = true and the plain average: {why}; "
            f"allowed: {allowed}"
        )
    if is_dp(config):
        why = "its noise changes the logits' scale, and it runs from a shared start"
        raise ConfigError(
            f"calibration = 'lewc' with dp = {config['dp']!r}: {why}; allowed: dp = 'off', or "
            "calibration = 'server' or 'none'"
        )


def lewc_note(config: Mapping[str, Any]) -> str | None:
    """The line a run prints when its LEWC temperature is 1 because every client starts from the
    server's initialisation (``init = "shared"``); ``None`` otherwise."""
    return ONE_BASIN_NOTE if uses_lewc(config) and config["init"] == "shared" else None
