"""The declaration of a results column: :class:`Column`, its kinds, sources, report sections.

The table of every column is :mod:`fedlmc.columns` (which re-exports these names); the column
families it assembles are :mod:`fedlmc.columns_metrics` and :mod:`fedlmc.columns_mechanism`.
Imports nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "KINDS",
    "METHOD_SCOPES",
    "REPORT_SECTIONS",
    "SOURCES",
    "Column",
    "check_unique",
]

KINDS = ("number", "text", "JSON")
"""``number``: a float or int (NaN where it does not apply); ``text``: a string (empty where it
does not apply); ``JSON``: a JSON list or matrix held as a string (empty where it does not)."""
SOURCES = ("row", "round", "server", "provenance")
"""``row``: every row (:func:`fedlmc.study.rows.empty_row`: the study's and the Flower server's);
``round``: added by the Flower server to every row of a federation; ``server``: added by the
Flower server to some rows of a federation; ``provenance``: added to every row of a
``results.csv`` the Flower server writes (versions and device)."""
METHOD_SCOPES = ("", "on_path", "template_shaped")
"""Which merge methods' rows a column fills (its cells aside): ``""`` every row its ``applies``
names; ``on_path``: a merge method registered ``on_path`` whose merge is a state dict of the
model (the path between the clients reaches it); ``template_shaped``: one whose merge is a state
dict of the model. The registry knows which methods those are; the text naming them is derived
from it (:func:`fedlmc.study.rows.column_applies`), never written here."""
REPORT_SECTIONS = (
    "merge gap",
    "barriers",
    "client paths",
    "agreement",
    "LEWC",
    "temperature",
    "mechanism",
)
"""The order of ``report.md``'s per-method mean tables: section by section, each section's
columns in table order."""


@dataclass(frozen=True)
class Column:
    """One results column (see the module docstring)."""

    name: str
    measures: str
    """What it measures, one line (the heading of its table in ``report.md``)."""
    applies: str
    """Which cells and methods get a value (elsewhere NaN or an empty string)."""
    definition: str
    """How it is computed (Markdown)."""
    kind: str = "number"
    source: str = "row"
    report_table: str = ""
    """The section of ``report.md``'s per-method mean tables (:data:`REPORT_SECTIONS`) the
    column is averaged in; empty: none."""
    methods: str = ""
    """Which merge methods' rows get a value (:data:`METHOD_SCOPES`); ``applies`` then says
    only which cells."""

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"column name {self.name!r}: allowed: a Python identifier")
        for field, value, allowed in (
            ("kind", self.kind, KINDS),
            ("source", self.source, SOURCES),
            ("report_table", self.report_table, ("", *REPORT_SECTIONS)),
            ("methods", self.methods, METHOD_SCOPES),
        ):
            if value not in allowed:
                raise ValueError(
                    f"column {self.name!r}: {field} = {value!r}; allowed: "
                    f"{', '.join(repr(a) for a in allowed)}"
                )

    @property
    def is_string(self) -> bool:
        """Whether the column holds text (``text`` and ``JSON`` kinds)."""
        return self.kind != "number"


def check_unique(columns: Iterable[Column]) -> None:
    """``ValueError`` naming the first column name declared twice."""
    seen: set[str] = set()
    for column in columns:
        if column.name in seen:
            raise ValueError(f"column {column.name!r} is declared twice")
        seen.add(column.name)
