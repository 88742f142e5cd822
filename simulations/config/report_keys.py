"""The ``[report]`` settings of a sweep file (read by :mod:`fedlmc.simulations.report.build`).

Kept apart from the report itself so that validating a sweep file imports no pandas or
matplotlib.
"""

from __future__ import annotations

from fedlmc.simulations.config.schema import Key, integers, named

__all__ = ["REPORT_SCHEMA"]

REPORT_SCHEMA: dict[str, Key] = {
    "title": Key(str, "", "report title (empty: the sweep name)"),
    "dpi": Key(int, 120, "figure resolution", integers(50, 1200, "print resolution")),
    "error-bars": named(str, "std", "spread drawn over seeds", ("std", "sem", "none")),
}
