"""The ``secure-aggregation`` run-config key: its values and the check of a cell that uses it.

``secure-aggregation = "secagg+"`` merges ``strategy = "average"``, or ``strategy =
"aligned"`` with a ``sum`` method that registers its ``sum_exponents`` (``align =
"average_lewc_bias"``, ``"embed_average"`` or ``"heterofl"``, which also registers
``divide_by_holders``: its clients add their holder masks to the sum), through Flower's SecAgg+
(:mod:`fedlmc.strategies.secure`), so the server obtains only the weighted sum of the
clients' (pre-scaled or embedded) arrays.
:func:`check_secure_aggregation` refuses, before any work, every cell whose merge needs more
than a sum (naming the method and what its rule needs the server to see,
:mod:`fedlmc.study.server_sees`), a ``sum`` rule not built securely (naming what it would
need, its secure form's ``note``) and the settings the secure path does not run. No Flower
import here: the run-config validation reads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedlmc.merging.method_registry import base_method
from fedlmc.simulations.config.schema import ConfigError
from fedlmc.simulations.config.values import ONE_SHOT_MODES, Mode
from fedlmc.study.server_sees import SECURE_SUM

__all__ = [
    "SECURE_MODES",
    "SECURE_OFF",
    "check_secure_aggregation",
    "is_secure",
    "secure_cells_in_flight",
    "secure_choices",
    "secure_methods",
]

SECURE_OFF = "off"
SECURE_MODES = (SECURE_OFF, "secagg+")
"""``off``: every client's arrays reach the server in the clear; ``secagg+``: Flower's SecAgg+
(the legacy ``SecAggPlusWorkflow`` and ``secaggplus_mod``)."""


def is_secure(config: Mapping[str, Any]) -> bool:
    """Whether the run merges under secure aggregation."""
    return config.get("secure-aggregation", SECURE_OFF) != SECURE_OFF


def secure_cells_in_flight(configs: Sequence[Mapping[str, Any]], wanted: int) -> int:
    """1 when any cell is secure, else ``wanted``: SecAgg+'s client state (keys, shares) lives
    in the node's ``context.state`` under one name, so two secure rounds must not interleave on
    a node."""
    return 1 if any(is_secure(c) for c in configs) else wanted


def secure_methods() -> tuple[str, ...]:
    """The merge methods secure aggregation runs, from the registries: ``server_sees = "sum"``
    with a secure form that computes it (:func:`fedlmc.strategies.secure_forms.runs_securely`)."""
    from fedlmc.merging.method_registry import METHODS
    from fedlmc.strategies.secure_forms import runs_securely

    return tuple(m.name for m in METHODS if runs_securely(m.name))


def secure_choices() -> str:
    """The cells a secure run allows, as the refusals say it."""
    aligned = [repr(m) for m in secure_methods() if m != "average"]
    return f"strategy = '{Mode.AVERAGE}'" + (
        f", or strategy = '{Mode.ALIGNED}' with align = {' / '.join(aligned)}" if aligned else ""
    )


def _needs_more_than_sum(method: str) -> str | None:
    """What ``method``'s rule needs the server to see when that is more than a sum, else None."""
    from fedlmc.study.rows import server_sees_of

    sees = server_sees_of(base_method(method))
    return None if sees == SECURE_SUM else sees


def _not_built(method: str) -> str | None:
    """Why the ``sum`` rule ``method`` does not run securely here (its secure form's ``note``),
    or None when it runs (or is no registered merge method: a reference row such as ``fedavg``)."""
    from fedlmc.merging.method_registry import METHODS
    from fedlmc.strategies.secure_forms import NOT_BUILT, runs_securely, secure_form

    if base_method(method) not in METHODS or runs_securely(method):
        return None
    return secure_form(method).note or NOT_BUILT


def _refuse_methods(config: Mapping[str, Any], mode: str, methods: Sequence[str]) -> None:
    strategy, allowed = config["strategy"], secure_choices()
    for method in methods:
        sees = _needs_more_than_sum(method)
        if sees is not None:
            raise ConfigError(
                f"secure-aggregation = {mode!r}: merge method {method!r} needs the server to "
                f"see {sees}, secure aggregation gives it only a sum; allowed: {allowed}"
            )
        missing = _not_built(method)
        if missing is not None:
            raise ConfigError(
                f"secure-aggregation = {mode!r}: merge method {method!r} is a sum, but fedlmc "
                f"does not run it securely yet: it needs {missing}; allowed: {allowed}"
            )
    if strategy not in ONE_SHOT_MODES:
        raise ConfigError(
            f"secure-aggregation = {mode!r} with strategy = {strategy!r}: allowed only with "
            f"{allowed} (one merge per secure round)"
        )


def check_secure_aggregation(config: Mapping[str, Any], methods: Sequence[str]) -> None:
    """A secure cell: ``strategy = "average"``, or ``"aligned"`` with a method of
    :func:`secure_methods` (the first of the cell's merge ``methods`` whose rule needs more
    than a sum, or is a sum not built securely, is named with what it would need; the widths
    check already refuses a one-width method for clients of different widths; ``num-clients``
    is at least 2) and no warm-up rounds (they average in the clear)."""
    if not is_secure(config):
        return
    mode = config["secure-aggregation"]
    _refuse_methods(config, mode, methods)
    if config["warmup-rounds"]:
        raise ConfigError(
            f"secure-aggregation = {mode!r} with warmup-rounds = {config['warmup-rounds']}: "
            "allowed: warmup-rounds = 0 (warm-up rounds average in the clear)"
        )
