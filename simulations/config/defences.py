"""The run-config side of the robust aggregation rules and the client check: the keys' checks,
the refusal of a Krum cell with too few clients (before any work), the method options the
rules read, and the client check a cell resolves to (:mod:`fedlmc.merging.robust_rules`,
:mod:`fedlmc.strategies.robust`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedlmc.merging.robust_rules import check_krum, check_trim_fraction
from fedlmc.simulations.config.derived import selected_methods
from fedlmc.simulations.config.schema import ConfigError

KRUM_METHODS = ("krum", "multi_krum")
CLIENT_CHECK_VALUES = ("auto", "server-split", "copies", "off")
"""The run config's ``client-check``: ``auto`` is ``server-split`` for the partitions whose
clients' data are alike (:data:`ALIKE_PARTITIONS`) and ``copies`` for the others."""
ALIKE_PARTITIONS = ("iid", "full")
"""Partitions whose honest clients score alike on the server's split (the accuracy check's
premise, :mod:`fedlmc.strategies.robust`)."""


def trim_fraction_check(value: Any) -> str | None:
    """The ``trim-fraction`` key's check: a number in [0, 0.5)."""
    try:
        check_trim_fraction(value)
    except ValueError:
        return "allowed: a number in [0, 0.5)"
    return None


def uses_krum(config: Mapping[str, Any]) -> bool:
    """Whether ``krum`` or ``multi_krum`` runs in the cell."""
    return any(m in KRUM_METHODS for m in selected_methods(config))


def check_krum_cell(config: Mapping[str, Any]) -> None:
    """A cell running ``krum`` / ``multi_krum`` must have enough clients for every merge it
    accepts: ``min-clients >= 2 krum-byzantine + 3`` and, for ``multi_krum``, ``krum-select <=
    min-clients - krum-byzantine``; one line naming the keys otherwise."""
    methods = [m for m in selected_methods(config) if m in KRUM_METHODS]
    if not methods:
        return
    f, m, n = config["krum-byzantine"], config["krum-select"], config["min-clients"]
    select = m if "multi_krum" in methods else 1
    try:
        check_krum(n, f, select)
    except ValueError:
        if n < 2 * f + 3:
            raise ConfigError(
                f"merge method {methods[0]!r} with krum-byzantine = {f}: allowed only with "
                f"min-clients >= 2 x krum-byzantine + 3 = {2 * f + 3} (every merge it accepts "
                f"needs that many clients); got min-clients = {n}"
            ) from None
        raise ConfigError(
            f"krum-select = {m} with min-clients = {n} and krum-byzantine = {f}: allowed: 1 .. "
            f"{n - f} (min-clients - krum-byzantine)"
        ) from None


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
