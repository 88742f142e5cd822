r"""How the study evaluates a merge method: its evaluation policy, registered against its name.

A merge method (:func:`fedlmc.merging.method_registry.register_method`) is its name, its align
function and its needs. What the study does with its merge is registered here, by name, with
:func:`register_evaluation` (optional: a method registered without it gets
:class:`Evaluation`'s defaults):

- ``on_path`` (``False`` for a merge that is no point on the path between the aligned clients,
  ``random_direction``, the robust rules, the task-vector methods: its barrier and path columns
  are NaN, :func:`fedlmc.study.merge.path_rule`);
- ``counterpart_of`` (for a ``mixed_widths`` method, the one-width method it stands in for in a
  run of clients of different widths, ``embed_average`` for ``average``: :func:`mixed_width_row`);
- ``columns`` (the results columns only it fills, :class:`fedlmc.columns.Column` rows of
  ``source = "row"``, from its ``Alignment.info``; an ``info`` key not declared here is an error
  when the study or a strategy reports it, :func:`check_info`; a permuting method declares
  :data:`fedlmc.merging.alignment_record.ALIGNMENT_COLUMNS`);
- ``server_sees`` (the least its rule needs the server to see, one of
  :data:`fedlmc.study.server_sees.SERVER_SEES`, every row's ``server_sees`` column; default
  ``each model``).

The built-in methods' policies are declared in :mod:`fedlmc.study.builtin_evaluations`, which
the registry loads once, before its first registration, look-up or listing. Imports no torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedlmc.columns import COMMON_COLUMNS, Column, check_unique
from fedlmc.merging.method_registry import METHODS, base_method
from fedlmc.registry import Registry
from fedlmc.study.server_sees import DEFAULT_SERVER_SEES, check_server_sees

__all__ = [
    "EVALUATIONS",
    "Evaluation",
    "check_info",
    "check_own_columns",
    "evaluation_of",
    "mixed_width_row",
    "register_evaluation",
]


@dataclass(frozen=True)
class Evaluation:
    """How the study evaluates a method's merge (see the module docstring)."""

    on_path: bool = True
    counterpart_of: str = ""
    columns: tuple[Column, ...] = ()
    server_sees: str = DEFAULT_SERVER_SEES


def _load_builtin_evaluations() -> None:
    """Register the built-in methods' policies (run once, before the first use)."""
    importlib.import_module("fedlmc.study.builtin_evaluations")


EVALUATIONS: Registry[Evaluation] = Registry("evaluation policy", load=_load_builtin_evaluations)


def register_evaluation(
    method: str,
    *,
    on_path: bool = True,
    counterpart_of: str = "",
    columns: Sequence[Column] = (),
    server_sees: str = DEFAULT_SERVER_SEES,
    replace: bool = False,
) -> Evaluation:
    """Register how the study evaluates the merge method ``method`` (see the module
    docstring); ``ValueError`` in one line for a column that is no new ``source = "row"``
    column or a ``server_sees`` outside the vocabulary."""
    check_server_sees(method, server_sees)
    check_own_columns(method, tuple(columns), replace=replace)
    entry = Evaluation(on_path, counterpart_of, tuple(columns), server_sees)
    return EVALUATIONS.add(method, entry, replace=replace)


def evaluation_of(method: str) -> Evaluation:
    """The evaluation policy of ``method`` (a ``_t`` row as its merge): its registration, else
    the defaults."""
    base = base_method(method)
    return EVALUATIONS.get(base) if base in EVALUATIONS else Evaluation()


def check_own_columns(method: str, columns: Sequence[Column], *, replace: bool = False) -> None:
    """A method's own columns must be :class:`Column` rows of ``source = "row"`` whose names are
    new: not a common column, not another registered method's different column."""
    taken = {c.name for c in COMMON_COLUMNS}
    others = {
        c.name: c
        for e in EVALUATIONS.names()
        if e in METHODS and not (replace and e == method)
        for c in EVALUATIONS.get(e).columns
    }
    for column in columns:
        if not isinstance(column, Column) or column.source != "row":
            what = column.name if isinstance(column, Column) else column
            raise ValueError(
                f"merge method {method!r}: column {what!r}; allowed: a "
                "fedlmc.columns.Column with source 'row'"
            )
        if column.name in taken or others.get(column.name, column) != column:
            raise ValueError(
                f"merge method {method!r}: column {column.name!r} is already declared; allowed: "
                "a new column name"
            )
    check_unique(columns)


def check_info(method: str, info: Mapping[str, Any]) -> None:
    """``ValueError`` when the merge of ``method`` reports an ``info`` key (a results column)
    its evaluation policy does not declare."""
    declared = {c.name for c in evaluation_of(method).columns}
    undeclared = sorted(set(info) - declared)
    if undeclared:
        raise ValueError(
            f"merge method {base_method(method)!r} reports column {undeclared[0]!r} it does not "
            "declare; allowed: the names in its register_evaluation(columns=...)"
        )


def mixed_width_row(method: str) -> str | None:
    """The row that stands for ``method`` in a run of clients of different widths: itself for a
    reference method or a ``mixed_widths`` merge; the mixed-width method registered
    ``counterpart_of`` its merge, with its ``_t`` kept (``"average_t"`` ->
    ``"embed_average_t"``); ``None`` when there is none."""
    base = base_method(method)
    if base not in METHODS or METHODS.get(base).needs.mixed_widths:
        return method
    twin = next(
        (
            m.name
            for m in METHODS
            if m.needs.mixed_widths and evaluation_of(m.name).counterpart_of == base
        ),
        None,
    )
    return None if twin is None else twin + method[len(base) :]
