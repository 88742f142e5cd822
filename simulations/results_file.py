"""Reading a sweep's ``results.csv`` without trusting it; a sweep's out dir vs a run's.

:func:`read_results` validates every row against the schema before pandas sees it: a row is bad
when its number of fields differs from the header's (a junk row, an unclosed quote), when it is
the last row and the file does not end with a line end (cut off mid-line: pandas always writes
one), when its ``cell_id`` is not 12 hex digits or its ``status`` not ``ok``/``failed``, or when
an ``ok`` row holds text in a numeric column of :func:`fedlmc.study.rows.column_table`. Bad rows are
left out of the table with a warning naming the file and the rows; with ``set_aside`` (a sweep about
to run) they are moved to ``results.rejected.csv`` beside it (appended, never overwritten) and
``results.csv`` is rewritten without them, so their cells run again.

:func:`out_dir_kind` says what a folder holds: ``"sweep"`` (a ``config.json`` with cells, or a
``results.csv`` with a ``cell_id`` column), ``"run"`` (a ``results.csv`` of ``fedlmc run`` / the
ServerApp: no ``cell_id``), or ``"empty"``; :func:`refuse_mixing` refuses to write one kind's
results into the other's folder (either would overwrite or corrupt the other's ``results.csv``).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedlmc.io import atomic_write_csv
from fedlmc.simulations.schema import ConfigError
from fedlmc.study.rows import column_table

RESULTS = "results.csv"
REJECTED = "results.rejected.csv"
CONFIG = "config.json"
if TYPE_CHECKING:
    import pandas as pd
LEAD_COLUMNS = ("cell_id", "status", "error")
CELL_ID = re.compile(r"[0-9a-f]{12}")


def numeric_columns() -> tuple[str, ...]:
    """The results columns that hold numbers (:func:`fedlmc.study.rows.column_table`)."""
    return tuple(c.name for c in column_table() if not c.is_string)


def _is_number(text: str) -> bool:
    if text == "":
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def row_problem(
    row: Sequence[str], header: Sequence[str], *, last: bool, cut_off: bool
) -> str | None:
    """Why ``row`` (fields as read) does not fit ``header``; ``None`` for a good row."""
    if len(row) != len(header):
        return f"{len(row)} fields where the header has {len(header)}"
    if last and cut_off:
        return "cut off (the file does not end with a line end)"
    values = dict(zip(header, row, strict=True))
    if not CELL_ID.fullmatch(values.get("cell_id", "")):
        return f"cell_id {values.get('cell_id', '')[:20]!r} is not 12 hex digits"
    if values.get("status") not in ("ok", "failed"):
        return f"status {values.get('status', '')[:20]!r}; allowed: ok, failed"
    if values["status"] == "ok":
        for column in numeric_columns():
            if column in values and not _is_number(values[column]):
                return f"{column} = {values[column][:20]!r} is not a number"
    return None


def split_rows(path: Path) -> tuple[list[str], list[list[str]], list[tuple[list[str], str]]]:
    """``(header, good rows, [(bad row, reason)])`` of the CSV file at ``path``."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"results file {str(path)!r}: cannot read it ({err})") from None
    try:
        records = [r for r in csv.reader(io.StringIO(text)) if r]
    except csv.Error as err:
        raise ConfigError(f"results file {str(path)!r}: malformed CSV: {err}") from None
    if not records:
        return list(LEAD_COLUMNS), [], []
    header, rows = records[0], records[1:]
    if "cell_id" not in header:
        raise ConfigError(
            f"results file {str(path)!r} has no cell_id column: it holds one fedlmc run's rows, "
            "not a sweep's; allowed: a sweep out dir"
        )
    cut_off = not text.endswith("\n")
    good, bad = [], []
    for index, row in enumerate(rows):
        problem = row_problem(row, header, last=index == len(rows) - 1, cut_off=cut_off)
        if problem is None:
            good.append(row)
        else:
            bad.append((row, f"row {index + 2}: {problem}"))
    return header, good, bad


def _frame(header: Sequence[str], rows: Sequence[Sequence[str]]) -> pd.DataFrame:
    import pandas as pd

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    buffer.seek(0)
    frame = pd.read_csv(
        buffer,
        keep_default_na=False,
        na_values=["", "nan", "NaN"],
        dtype={name: str for name in LEAD_COLUMNS},  # an id like "1234e5678901" stays text
    )
    for name in LEAD_COLUMNS:
        if name not in frame:
            frame[name] = ""
        frame[name] = frame[name].fillna("")
    return frame


def set_aside(path: Path, header: Sequence[str], bad: Sequence[Sequence[str]]) -> Path:
    """Append ``bad`` rows to ``results.rejected.csv`` beside ``path`` (header first when new)."""
    target = path.with_name(REJECTED)
    new = not target.exists()
    with target.open("a", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        if new:
            writer.writerow(header)
        writer.writerows(bad)
    return target


def read_results(out_dir: str | os.PathLike, *, set_aside_bad: bool = False) -> pd.DataFrame:
    """``out_dir/results.csv`` validated (module docstring); an empty frame when absent.

    Floats read back exactly (pandas writes the shortest round-trip repr and its default parser
    reads it back bit for bit); only empty cells and ``nan`` are missing values.
    """
    path = Path(out_dir) / RESULTS
    if not path.exists():
        return _frame(LEAD_COLUMNS, [])
    header, good, bad = split_rows(path)
    frame = _frame(header, good)
    if bad:
        reasons = "; ".join(reason for _, reason in bad[:5])
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        if set_aside_bad:
            target = set_aside(path, header, [row for row, _ in bad])
            atomic_write_csv(path, frame)
            where = f"moved to {str(target)!r}; their cells run again"
        else:
            where = "left out"
        print(
            f"fedlmc: warning: {len(bad)} bad row(s) in {str(path)!r} {where}: {reasons}{more}",
            file=sys.stderr,
        )
    return frame


# ----------------------------------------------------------------------------- out dirs


def out_dir_kind(out_dir: str | os.PathLike) -> str:
    """``"sweep"``, ``"run"`` or ``"empty"`` (module docstring)."""
    folder = Path(out_dir)
    config = folder / CONFIG
    if config.is_file():
        try:
            if "cells" in json.loads(config.read_text()):
                return "sweep"
        except (OSError, ValueError):
            pass
    results = folder / RESULTS
    if results.is_file():
        try:
            with results.open(encoding="utf-8") as handle:
                header = next(csv.reader(handle), [])
        except (OSError, UnicodeDecodeError, csv.Error):
            header = []
        return "sweep" if "cell_id" in header else "run"
    return "empty"


def refuse_mixing(out_dir: str | os.PathLike, writer: str) -> None:
    """:class:`ConfigError` when ``writer`` (``"run"`` or ``"sweep"``) would write into a
    folder holding the other kind's results."""
    kind = out_dir_kind(out_dir)
    if kind not in ("empty", writer):
        what = "a sweep's results" if kind == "sweep" else "the results of a fedlmc run"
        raise ConfigError(
            f"out dir {str(out_dir)!r} holds {what} (results.csv); a {writer} would overwrite "
            f"or corrupt them; allowed: an empty folder or one holding a {writer}'s results"
        )


def check_writable_folder(path: str | os.PathLike, key: str) -> None:
    """:class:`ConfigError` unless ``path`` is (or can be created as) a writable folder."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{key} = {str(path)!r} is a file; allowed: a folder")
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{key} = {str(path)!r}: {str(existing)!r} is not writable")


def check_writable_file(path: str | os.PathLike, key: str) -> None:
    """:class:`ConfigError` unless ``path`` can be written: its folder exists and is writable
    and it is not a folder."""
    file = Path(path).expanduser()
    parent = file.parent if str(file.parent) else Path(".")
    if file.is_dir():
        raise ConfigError(f"{key} = {str(path)!r} is a folder; allowed: a file path")
    if not parent.is_dir():
        raise ConfigError(f"{key} = {str(path)!r}: folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (file.exists() and not os.access(file, os.W_OK)):
        raise ConfigError(f"{key} = {str(path)!r} is not writable")


__all__ = [
    "check_writable_file",
    "check_writable_folder",
    "out_dir_kind",
    "read_results",
    "refuse_mixing",
    "row_problem",
]
