"""The line that says which clients a run merged: how many of them, and each one left out by
name (its node and partition, with the reason), from the round columns of its rows
(``clients_survived``, ``clients_failed``, ``clients_dropped_reasons``). ``fedlmc run``
prints it under its table and last; the ServerApp under ``flwr run`` logs it last."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

LEFT_OUT_COLUMNS = ("clients_failed", "clients_dropped_reasons")


def left_out_clients(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The texts naming the clients some row left out (failed, or dropped by the server's
    screen), each text once, in the order first met: ``node N (partition P): reason; ...``."""
    found: dict[str, None] = {}
    for row in rows:
        for column in LEFT_OUT_COLUMNS:
            text = row.get(column)
            if isinstance(text, str) and text:
                found[text] = None
    return list(found)


def clients_line(rows: Sequence[Mapping[str, Any]], num_clients: int) -> str | None:
    """``clients: 2 of 3 merged; dropped: node N (partition 1): ...`` (``none dropped`` when
    every client was merged); with rows that merged different numbers (a method that screened
    a client out), the range and the ``clients_survived`` column to read; ``None`` when the rows
    hold no ``clients_survived``."""
    merged = sorted(
        {int(r["clients_survived"]) for r in rows if _is_count(r.get("clients_survived"))}
    )
    if not merged:
        return None
    count = (
        str(merged[0])
        if len(merged) == 1
        else f"{merged[0]} to {merged[-1]} (per row: clients_survived)"
    )
    left_out = left_out_clients(rows)
    who = f"dropped: {'; '.join(left_out)}" if left_out else "none dropped"
    return f"clients: {count} of {num_clients} merged; {who}"


def _is_count(value: Any) -> bool:
    """Whether ``value`` is a client count (not missing, not NaN)."""
    try:
        return value is not None and float(value) == float(value)
    except (TypeError, ValueError):
        return False
