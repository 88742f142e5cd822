"""The run-config side of the robust aggregation rules and the client check: the keys' checks,
the method options the rules read (a Krum cell with too few clients is its method's one
refusal, :func:`fedlmc.simulations.config.checks.check_merge_methods`, at these options), and
the client check a cell resolves to (:mod:`fedlmc.merging.robust.rules`,
:mod:`fedlmc.strategies.robust`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedlmc.merging.robust.rules import check_trim_fraction
from fedlmc.simulations.config.derived import selected_methods
from fedlmc.simulations.config.schema import Range

KRUM_METHODS = ("krum", "multi_krum")
CLIENT_CHECK_VALUES = ("auto", "server-split", "copies", "off")
"""The run config's ``client-check``: ``auto`` is ``server-split`` for the partitions whose
clients' data are alike (:data:`ALIKE_PARTITIONS`) and ``copies`` for the others."""
ALIKE_PARTITIONS = ("iid", "full")
"""Partitions whose honest clients score alike on the server's split (the accuracy check's
premise, :mod:`fedlmc.strategies.robust`)."""


def _trim_rule(value: Any) -> str | None:
    """The trimmed mean's own check
    (:func:`fedlmc.merging.robust.rules.check_trim_fraction`)."""
    try:
        check_trim_fraction(value)
    except ValueError as err:
        return str(err)
    return None


trim_fraction_check = Range(
    0.0, 0.5, "trimming half at each end leaves no client", high_open=True, also=_trim_rule
)
"""The ``trim-fraction`` key's check: a number in [0, 0.5) (and the rule's own check)."""


def uses_krum(config: Mapping[str, Any]) -> bool:
    """Whether ``krum`` or ``multi_krum`` runs in the cell."""
    return any(m in KRUM_METHODS for m in selected_methods(config))


def robust_method_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The robust rules' method options from the run config
    (:class:`fedlmc.merging.method_registry.MergeJob`'s ``options``)."""
    return {
        "trim_fraction": config["trim-fraction"],
        "krum_byzantine": config["krum-byzantine"],
        "krum_select": config["krum-select"],
    }


def client_check(config: Mapping[str, Any]) -> str:
    """The strategies' ``client_check`` of a cell: ``client-check``, with ``auto`` resolved by
    the partition (:data:`CLIENT_CHECK_VALUES`)."""
    value = config["client-check"]
    if value != "auto":
        return value
    return "server-split" if config["partition"] in ALIKE_PARTITIONS else "copies"
