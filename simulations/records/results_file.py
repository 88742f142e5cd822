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
overwritten) and ``results.csv`` is rewritten without them.

A cell is done only when its rows are all there and valid (:func:`finished_cells`): its ``ok``
rows hold exactly the methods its config reports
(:func:`fedlmc.simulations.config.row_methods`), each once. A cell that lost a row (set aside,
cut off, deleted) or holds one twice is therefore run again, and its new rows replace the old
ones. :func:`read_results` warns when the sweep's ``config.json`` says a cell in the file lacks
rows.

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedlmc.io import atomic_write_csv
from fedlmc.simulations.config.schema import ConfigError
from fedlmc.study.rows import column_table

RESULTS = "results.csv"
REJECTED = "results.rejected.csv"
CONFIG = "config.json"
if TYPE_CHECKING:
    import pandas as pd
LEAD_COLUMNS = ("cell_id", "status", "error")
CELL_ID = re.compile(r"[0-9a-f]{12}")
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0 and C1 control characters, DEL
NOT_UTF8 = re.compile(r"[\udc80-\udcff]")  # bytes kept by errors="surrogateescape"
NUMERIC_TYPES = (int, float)


def numeric_columns() -> tuple[str, ...]:
    """The results columns that hold numbers: those of :func:`fedlmc.study.rows.column_table`
    and the run-config keys of type int or float."""
    from fedlmc.simulations.config import run_schema

    keys = [name for name, key in run_schema().items() if key.type in NUMERIC_TYPES]
    return tuple(dict.fromkeys([*(c.name for c in column_table() if not c.is_string), *keys]))


def plain_text(value: object) -> object:
    """``value`` with every control character (a line end, a NUL byte, an escape code) replaced
    by a space when it is a string (the writers' half of the one-line-per-row rule)."""
    return CONTROL.sub(" ", value) if isinstance(value, str) else value


def _is_number(text: str) -> bool:
    if text == "":
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def _shown(text: str) -> str:
    return repr(text[:20] + ("..." if len(text) > 20 else ""))


def row_problem(
    row: Sequence[str],
    header: Sequence[str],
    *,
    last: bool,
    cut_off: bool,
    numeric: Sequence[str] | None = None,
) -> str | None:
    """Why ``row`` (fields as read) does not fit ``header``; ``None`` for a good row.
    ``numeric``: the numeric columns (default :func:`numeric_columns`)."""
    if len(row) != len(header):
        return f"{len(row)} fields where the header has {len(header)}"
    if last and cut_off:
        return "cut off (the file does not end with a line end)"
    values = dict(zip(header, row, strict=True))
    for column, text in values.items():
        found = CONTROL.search(text)
        if found:
            return f"{column} holds a control character ({found.group()!r}); allowed: plain text"
    if not CELL_ID.fullmatch(values.get("cell_id", "")):
        return f"cell_id {_shown(values.get('cell_id', ''))} is not 12 hex digits"
    if values.get("status") not in ("ok", "failed"):
        return f"status {_shown(values.get('status', ''))}; allowed: ok, failed"
    for column in numeric_columns() if numeric is None else numeric:
        if column in values and not _is_number(values[column]):
            return f"{column} = {_shown(values[column])} is not a number"
    return None


def parse_line(line: str) -> list[str] | None:
    """The fields of one physical line of a CSV file; ``None`` when the line does not parse on
    its own (an unclosed quote)."""
    try:
        return next(csv.reader([line], strict=True), [])
    except csv.Error:
        return None


def read_lines(path: Path) -> tuple[bool, list[str]]:
    """``(ends with a line end, physical lines)`` of ``path``; each line decoded as UTF-8 on its
    own (bytes that are not UTF-8 kept as surrogates, :data:`NOT_UTF8`, so that one bad byte
    spoils one line only), a trailing carriage return dropped."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"results file {str(path)!r}: cannot read it ({err})") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the end of the last line
    text = [line.decode("utf-8", errors="surrogateescape").removesuffix("\r") for line in lines]
    return data.endswith(b"\n"), text


def split_rows(path: Path) -> tuple[list[str], list[list[str]], list[tuple[str, str]]]:
    """``(header, good rows, [(bad line, reason)])`` of the CSV file at ``path``, read line by
    line (module docstring); a bad line is kept exactly as it was in the file."""
    ends_well, lines = read_lines(path)
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    if not numbered:
        return list(LEAD_COLUMNS), [], []
    header = parse_line(numbered[0][1]) or []
    if "cell_id" not in header:
        raise ConfigError(
            f"results file {str(path)!r} has no cell_id column: it holds one fedlmc run's rows, "
            "not a sweep's; allowed: a sweep out dir"
        )
    cut_off = not ends_well
    last = numbered[-1][0]
    numeric = [c for c in numeric_columns() if c in header]
    good, bad = [], []
    for number, line in numbered[1:]:
        row = parse_line(line)
        if NOT_UTF8.search(line):
            problem = "not UTF-8 text"
        elif row is None:
            problem = "an unclosed quote"
        else:
            problem = row_problem(
                row, header, last=number == last, cut_off=cut_off, numeric=numeric
            )
        if problem is None:
            good.append(row)
        else:
            bad.append((line, f"line {number}: {problem}"))
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


def set_aside(path: Path, header: Sequence[str], lines: Sequence[str]) -> Path:
    """Append the bad ``lines``, byte for byte as they were, to ``results.rejected.csv`` beside
    ``path`` (the header first when the file is new)."""
    target = path.with_name(REJECTED)
    head = b"" if target.exists() else (",".join(header) + "\n").encode("utf-8")
    body = b"".join(line.encode("utf-8", errors="surrogateescape") + b"\n" for line in lines)
    with target.open("ab") as handle:
        handle.write(head + body)
        handle.flush()
        os.fsync(handle.fileno())
    return target


def read_results(
    out_dir: str | os.PathLike, *, set_aside_bad: bool = False, check_cells: bool = True
) -> pd.DataFrame:
    """``out_dir/results.csv`` validated (module docstring); an empty frame when absent.
    ``set_aside_bad``: move the bad lines to ``results.rejected.csv``; ``check_cells``: warn
    about cells that lack rows.

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
            target = set_aside(path, header, [line for line, _ in bad])
            atomic_write_csv(path, frame)
            where = f"moved to {str(target)!r}; their cells run again"
        else:
            where = "left out"
        print(
            f"fedlmc: warning: {len(bad)} bad row(s) in {str(path)!r} {where}: {reasons}{more}",
            file=sys.stderr,
        )
    if check_cells:
        warn_incomplete(path, frame, rerun=set_aside_bad)
    return frame


# ----------------------------------------------------------------------------- whole cells


def sweep_methods(out_dir: str | os.PathLike) -> dict[str, list[str]]:
    """Per cell of the sweep's ``config.json``, the methods of its rows
    (:func:`fedlmc.simulations.config.row_methods`); empty when there is no readable one."""
    from fedlmc.simulations.config import row_methods

    try:
        record = json.loads((Path(out_dir) / CONFIG).read_text(encoding="utf-8"))
        return {c["cell_id"]: row_methods(c["config"]) for c in record.get("cells", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
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


def warn_incomplete(path: Path, results: pd.DataFrame, *, rerun: bool) -> None:
    """A warning naming the cells of ``path``'s sweep whose rows are not all there."""
    expected = sweep_methods(path.parent)
    missing = incomplete_cells(results, expected) if expected else []
    if missing:
        what = "they run again" if rerun else "rerun the sweep to complete them"
        print(
            f"fedlmc: warning: {len(missing)} cell(s) in {str(path)!r} lack rows "
            f"({', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}); {what}",
            file=sys.stderr,
        )


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
    "finished_cells",
    "incomplete_cells",
    "plain_text",
    "check_writable_folder",
    "out_dir_kind",
    "read_results",
    "refuse_mixing",
    "row_problem",
]
