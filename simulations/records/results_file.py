"""Reading a sweep's ``results.csv`` without trusting it; a sweep's out dir vs a run's.

:func:`read_results` validates every row against the schema before pandas sees it. The file is
read **line by line**: every physical line is one row (the writers never put a line end, or any
other control character, inside a field: :func:`plain_text`), so a damaged line never swallows
its neighbour. A line is bad when it does not parse on its own (an unclosed quote), when its
number of fields differs from the header's (junk), when it is the last line and the file does not
end with a line end (cut off mid-line: pandas always writes one), when a field holds a control
character (a NUL byte, a line end, an escape code), when its ``cell_id`` is not 12 hex digits or
its ``status`` not ``ok``/``failed``, or when it holds text in a numeric column (a numeric column
of :func:`fedlmc.study.rows.column_table` or a numeric run-config key). Bad lines are left out of
the table with a warning naming the file and the lines; with ``set_aside`` (a sweep about to run)
they are moved, exactly as they were, to ``results.rejected.csv`` beside it (appended, never
overwritten) and ``results.csv`` is rewritten without them. A column renamed since the file was
written (:data:`fedlmc.columns.RENAMED_COLUMNS`) is read under its new name.

A cell is done only when its rows are all there and valid (:func:`finished_cells`): its ``ok``
rows hold exactly the methods its config reports
(:func:`fedlmc.simulations.config.row_methods`), each once. A cell that lost a row (set aside,
cut off, deleted) or holds one twice is therefore run again, and its new rows replace the old
ones. :func:`read_results` warns when the sweep's ``config.json`` says a cell in the file lacks
rows, or holds one twice (named as duplicated, with its method: :func:`duplicated_rows`).

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
import stat
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedlmc.columns import RENAMED_COLUMNS
from fedlmc.io import atomic_write_csv
from fedlmc.simulations.config.config_file import file_kind
from fedlmc.simulations.config.schema import ConfigError, shown
from fedlmc.simulations.records.csv_lines import (
    CONTROL,
    Lines,
    bad_lines_warning,
    is_number,
    plain_text,
    set_aside,
    shown_field,
    split_lines,
)
from fedlmc.simulations.records.written_paths import check_csv_file, check_csv_kind
from fedlmc.study.rows import column_table

RESULTS = "results.csv"
CONFIG = "config.json"
RUN_FILES = (RESULTS, "training.csv")  # what a run's ServerApp writes in its out-dir
if TYPE_CHECKING:
    import pandas as pd
LEAD_COLUMNS = ("cell_id", "status", "error")
CELL_ID = re.compile(r"[0-9a-f]{12}")
NUMERIC_TYPES = (int, float)


def numeric_columns() -> tuple[str, ...]:
    """The results columns that hold numbers: those of :func:`fedlmc.study.rows.column_table`
    and the run-config keys of type int or float."""
    from fedlmc.simulations.config import run_schema

    keys = [name for name, key in run_schema().items() if key.type in NUMERIC_TYPES]
    return tuple(dict.fromkeys([*(c.name for c in column_table() if not c.is_string), *keys]))


def row_problem(values: Mapping[str, str], numeric: Sequence[str]) -> str | None:
    """Why a row of ``results.csv`` (``column -> field``) is bad, beyond what every line is
    checked for (:func:`fedlmc.simulations.records.csv_lines.split_lines`); ``None`` for a good
    row. ``numeric``: the numeric columns of the file (:func:`numeric_columns`)."""
    if not CELL_ID.fullmatch(values.get("cell_id", "")):
        return f"cell_id {shown_field(values.get('cell_id', ''))} is not 12 hex digits"
    if values.get("status") not in ("ok", "failed"):
        return f"status {shown_field(values.get('status', ''))}; allowed: ok, failed"
    for column in numeric:
        if column in values and not is_number(values[column]):
            return f"{column} = {shown_field(values[column])} is not a number"
    return None


def split_rows(path: Path) -> Lines:
    """The header, good rows and bad lines of the ``results.csv`` at ``path`` (module
    docstring); :class:`ConfigError` for a file of one ``fedlmc run``'s rows (no ``cell_id``)
    in a folder that is no sweep's."""
    numeric = numeric_columns()
    lines = split_lines(path, LEAD_COLUMNS, lambda values: row_problem(values, numeric))
    if lines.header is None and lines.bad and not sweep_methods(path.parent):
        raise ConfigError(
            f"results file {str(path)!r} has no cell_id column: it holds one fedlmc run's rows, "
            "not a sweep's; allowed: a sweep out dir"
        )
    return lines


def foreign_rows(lines: Lines, cells: Collection[str]) -> tuple[list[str], set[str]]:
    """Take the good rows of ``lines`` whose ``cell_id`` is not one of ``cells`` (another
    sweep's rows) out of them; ``(those rows as lines, their cell ids)``. Nothing when
    ``cells`` is empty (a folder whose ``config.json`` lists none)."""
    if lines.header is None or not cells:
        return [], set()
    at = lines.header.index("cell_id")
    foreign = [row for row in lines.good if row[at] not in cells]
    lines.good = [row for row in lines.good if row[at] in cells]
    return [csv_line(row) for row in foreign], {row[at] for row in foreign}


def csv_line(fields: Sequence[str]) -> str:
    """``fields`` as one CSV line (no line end), as the writers write it."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="").writerow(fields)
    return buffer.getvalue()


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
    return renamed_columns(frame)


def renamed_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each old column name of :data:`fedlmc.columns.RENAMED_COLUMNS` read as the
    column it is now (a file with both, from a sweep resumed after the rename: the new column's
    missing values taken from the old one's)."""
    for old, new in RENAMED_COLUMNS.items():
        if old in frame:
            values = frame.pop(old)
            frame[new] = frame[new].fillna(values) if new in frame else values
    return frame


def put_aside(path: Path, lines: Lines, *, set_aside_bad: bool, rerun: str = "") -> bool:
    """Take another sweep's rows (cells its folder's ``config.json`` does not hold) out of the
    good rows of ``lines`` (read from the sweep's CSV file at ``path``); name them and the bad
    lines in a warning each, and with ``set_aside_bad`` move both, as they were, to the file's
    rejected-lines file (``rerun``: what the warning adds then). Whether anything was moved
    (the caller then rewrites ``path`` without them)."""
    foreign, cells = foreign_rows(lines, sweep_methods(path.parent))
    if not (lines.bad or foreign):
        return False
    where = "left out"
    if set_aside_bad:
        target = set_aside(path, lines.header, [line for line, _ in lines.bad] + foreign)
        where = f"moved to {str(target)!r}"
    if lines.bad:
        bad_lines_warning(path, lines.bad, where + (rerun if set_aside_bad else ""))
    if foreign:
        print(
            f"fedlmc: warning: {len(foreign)} row(s) of {len(cells)} cell(s) not in this "
            f"sweep's {CONFIG} (another sweep's rows) in {str(path)!r} {where}",
            file=sys.stderr,
        )
    return set_aside_bad


def read_results(
    out_dir: str | os.PathLike, *, set_aside_bad: bool = False, check_cells: bool = True
) -> pd.DataFrame:
    """``out_dir/results.csv`` validated (module docstring); an empty frame when absent.
    ``set_aside_bad``: move the bad lines (and the rows of cells the sweep's ``config.json`` does
    not hold) to ``results.rejected.csv``; ``check_cells``: warn about cells that lack rows.

    Floats read back exactly (pandas writes the shortest round-trip repr and its default parser
    reads it back bit for bit); only empty cells and ``nan`` are missing values.
    """
    path = Path(out_dir) / RESULTS
    if not path.exists():
        return _frame(LEAD_COLUMNS, [])
    lines = split_rows(path)
    moved = put_aside(path, lines, set_aside_bad=set_aside_bad, rerun="; their cells run again")
    frame = _frame(lines.header or LEAD_COLUMNS, lines.good)
    if moved:
        atomic_write_csv(path, frame)  # what was moved out of it is in the rejected file
    if check_cells:
        warn_incomplete(path, frame, rerun=set_aside_bad)
    return frame


# ----------------------------------------------------------------------------- whole cells


def sweep_record_of(out_dir: str | os.PathLike) -> dict[str, Any]:
    """The sweep record in ``out_dir/config.json``; empty when there is none or it cannot be
    read (not JSON, not an object, nested too deep for the JSON reader)."""
    try:
        record = json.loads((Path(out_dir) / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def sweep_methods(out_dir: str | os.PathLike) -> dict[str, list[str]]:
    """Per cell of the sweep's ``config.json``, the methods of its rows
    (:func:`fedlmc.simulations.config.row_methods`); empty when there is no readable one."""
    from fedlmc.simulations.config import row_methods

    try:
        cells = sweep_record_of(out_dir).get("cells", [])
        return {c["cell_id"]: row_methods(c["config"]) for c in cells}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}


def finished_cells(
    results: pd.DataFrame, expected: Mapping[str, Sequence[str]], *, retry_failed: bool = True
) -> set[str]:
    """Cell ids that a rerun skips: those whose ``ok`` rows hold exactly the methods
    ``expected[cell_id]``, each once (a cell that lost a row is not done), plus the failed
    ones unless ``retry_failed``."""
    if results.empty:
        return set()
    done = set()
    for cid, rows in results.groupby("cell_id", sort=False):
        ok = rows[rows["status"] == "ok"]
        if len(ok) and len(ok) == len(rows) and cid in expected:
            methods = ok["method"].astype(str).tolist() if "method" in ok else []
            if sorted(methods) == sorted(expected[cid]):
                done.add(cid)
        elif not retry_failed and (rows["status"] == "failed").any():
            done.add(cid)
    return done


def incomplete_cells(results: pd.DataFrame, expected: Mapping[str, Sequence[str]]) -> list[str]:
    """Cells of ``expected`` with ``ok`` rows in ``results`` that are not all there."""
    ok = results[results["status"] == "ok"] if "status" in results else results.iloc[:0]
    present = [cid for cid in dict.fromkeys(ok["cell_id"]) if cid in expected]
    done = finished_cells(results, expected)
    return [cid for cid in present if cid not in done]


def duplicated_rows(results: pd.DataFrame, cells: Sequence[str]) -> dict[str, list[str]]:
    """Per cell of ``cells`` whose ``ok`` rows hold a method more than once: those methods
    (``cell_id -> [method, ...]``); cells without a duplicated row are left out."""
    if results.empty or "method" not in results:
        return {}
    ok = results[(results["status"] == "ok") & results["cell_id"].isin(list(cells))]
    twice = ok[ok.duplicated(["cell_id", "method"])]
    found: dict[str, list[str]] = {}
    for cid, method in zip(twice["cell_id"], twice["method"].astype(str), strict=True):
        found.setdefault(cid, []).append(method)
    return {cid: list(dict.fromkeys(methods)) for cid, methods in found.items()}


def _listed(items: Sequence[str]) -> str:
    """The first 5 of ``items``, comma-separated, `` ...`` after when there are more."""
    return f"{', '.join(items[:5])}{' ...' if len(items) > 5 else ''}"


def warn_incomplete(path: Path, results: pd.DataFrame, *, rerun: bool) -> None:
    """A warning naming the cells of ``path``'s sweep whose rows are not all there: those
    holding a row twice named with the duplicated method, those that lack one (or hold
    another method's) as lacking rows."""
    expected = sweep_methods(path.parent)
    incomplete = incomplete_cells(results, expected) if expected else []
    twice = duplicated_rows(results, incomplete)
    held = results[results["status"] == "ok"].groupby("cell_id")["method"] if twice else None
    missing = [
        cid
        for cid in incomplete
        if cid not in twice or set(expected[cid]) - set(held.get_group(cid).astype(str))
    ]
    if twice:
        what = "they run again" if rerun else "rerun the sweep to replace their rows"
        named = [f"{cid}: {', '.join(repr(m) for m in methods)}" for cid, methods in twice.items()]
        print(
            f"fedlmc: warning: {len(twice)} cell(s) in {str(path)!r} hold a duplicated row "
            f"({_listed(named)}); {what}",
            file=sys.stderr,
        )
    if missing:
        what = "they run again" if rerun else "rerun the sweep to complete them"
        print(
            f"fedlmc: warning: {len(missing)} cell(s) in {str(path)!r} lack rows "
            f"({_listed(missing)}); {what}",
            file=sys.stderr,
        )


# ----------------------------------------------------------------------------- out dirs


def out_dir_kind(out_dir: str | os.PathLike) -> str:
    """``"sweep"``, ``"run"`` or ``"empty"`` (module docstring)."""
    folder = Path(out_dir)
    if "cells" in sweep_record_of(folder):
        return "sweep"
    results = folder / RESULTS
    if results.is_file():
        return "sweep" if has_sweep_header(results) else "run"
    return "empty"


def has_sweep_header(path: Path) -> bool:
    """Whether some line of ``path`` is a sweep's header (it holds ``cell_id``, ``status`` and
    ``error``; junk lines or a byte order mark before it allowed)."""
    try:
        with path.open(encoding="utf-8-sig", errors="replace", newline="") as handle:
            for line in handle:
                try:
                    fields = next(csv.reader([line]), [])
                except csv.Error:
                    continue
                if set(LEAD_COLUMNS) <= set(fields):
                    return True
    except OSError:
        pass
    return False


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


def check_plain_path(path: str | os.PathLike, key: str) -> None:
    """:class:`ConfigError` when ``path`` holds a control character (a line end, an escape
    code): a folder or file of that name would be created, and every line naming it broken."""
    found = CONTROL.search(str(path))
    if found:
        raise ConfigError(
            f"{key} = {shown(str(path))} holds a control character ({found.group()!r}); "
            "allowed: a path of printable characters"
        )
    try:
        Path(path).expanduser()
    except RuntimeError:  # ~name of a user this machine does not have
        raise ConfigError(
            f"{key} = {str(path)!r}: no user {str(path)[1:].split('/')[0]!r} on this machine; "
            "allowed: ~/..., ~USER/... of an existing user, or a path without ~"
        ) from None


def check_writable_folder(path: str | os.PathLike, key: str) -> None:
    """:class:`ConfigError` unless ``path`` is (or can be created as) a writable folder and
    holds no control character (:func:`check_plain_path`)."""
    check_plain_path(path, key)
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        mode = os.stat(folder).st_mode
        what = "a file" if stat.S_ISREG(mode) else file_kind(mode)  # a device, a FIFO
        raise ConfigError(f"{key} = {str(path)!r} is {what}; allowed: a folder")
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{key} = {str(path)!r}: {str(existing)!r} is not writable")


def check_writable_file(path: str | os.PathLike, key: str) -> None:
    """:class:`ConfigError` unless ``path`` can be written: no control character in it
    (:func:`check_plain_path`), its folder exists and is writable and it is not a folder."""
    check_plain_path(path, key)
    file = Path(path).expanduser()
    parent = file.parent if str(file.parent) else Path(".")
    if file.is_dir():
        raise ConfigError(f"{key} = {str(path)!r} is a folder; allowed: a file path")
    if not parent.is_dir():
        what = f"{str(parent)!r} is not a folder"
        if not parent.exists():
            what = f"folder {str(parent)!r} does not exist"
        raise ConfigError(f"{key} = {str(path)!r}: {what}; allowed: a file in an existing folder")
    if not os.access(parent, os.W_OK | os.X_OK) or (file.exists() and not os.access(file, os.W_OK)):
        raise ConfigError(f"{key} = {str(path)!r} is not writable")


def check_csv_target(path: str | os.PathLike, out_dir: str | os.PathLike) -> None:
    """Before any work, and again under the lock of its folder: :class:`ConfigError` unless
    ``fedlmc run --csv path`` (the run's ``out-dir`` is ``out_dir``, empty for none) may write
    ``path``: it must be writable (:func:`check_writable_file`), not be a file the run's
    ServerApp writes itself (``results.csv``, ``training.csv`` of its ``out-dir``), and replace
    no rows another command wrote: a file holding a sweep's rows (a ``cell_id`` header, wherever
    it is), any file of a sweep's out dir, or any file of another run's out dir; and an existing
    file must be a regular file holding a ``fedlmc run --csv`` table of the same columns, which
    the rows are appended to (:mod:`fedlmc.simulations.records.written_paths`)."""
    check_plain_path(path, "--csv")
    file = Path(path).expanduser().resolve()
    own = Path(out_dir).expanduser().resolve() if out_dir else None
    if file.parent == own and file.name in RUN_FILES:
        raise ConfigError(
            f"--csv {str(path)!r}: the run writes it itself (the {file.name} of its out-dir); "
            "allowed: another file"
        )
    check_csv_kind(path)  # a link, a device, a FIFO, a folder: refused unopened
    check_writable_file(path, "--csv")
    if not file.is_file():
        return
    kind = out_dir_kind(file.parent)
    if has_sweep_header(file) or kind == "sweep":
        what = "holds a sweep's rows" if has_sweep_header(file) else "is a file of a sweep's"
        raise ConfigError(
            f"--csv {str(path)!r} {what} out dir {str(file.parent)!r}; a run's rows would "
            "replace what the sweep wrote; allowed: a new file, or one outside that folder"
        )
    if kind == "run" and file.parent != own:
        raise ConfigError(
            f"--csv {str(path)!r} is a file of a fedlmc run's out dir {str(file.parent)!r}; "
            "this run would replace what that run wrote; allowed: a new file, or its own out-dir"
        )
    check_csv_file(path)  # a regular file: only a run --csv table of the same columns


__all__ = [
    "check_csv_target",
    "check_writable_file",
    "finished_cells",
    "incomplete_cells",
    "plain_text",
    "check_writable_folder",
    "duplicated_rows",
    "out_dir_kind",
    "read_results",
    "refuse_mixing",
    "row_problem",
]
