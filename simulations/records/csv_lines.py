"""A CSV file of fedlmc's read **line by line**, without trusting it: ``results.csv`` and
``training.csv`` share this reader.

Every physical line is one row (the writers never put a line end, or any other control
character, inside a field: :func:`plain_text`), so a damaged line never swallows its neighbour.
:func:`split_lines` finds the header, the first line that parses and holds the file's required
columns (a UTF-8 byte order mark before it is read as such, not as a character of its first
column), and sorts every other line into good rows and bad lines, each bad line with its reason:

- before the header (junk written above it);
- not UTF-8 text;
- the last line of a file that does not end with a line end (cut off mid-line: the writers
  always end a file with one);
- an unclosed quote (the line does not parse on its own);
- a number of fields other than the header's (junk, an extra field);
- a field holding a control character (a NUL byte, a line end, an escape code);
- whatever the file's own check says of the row (:data:`RowCheck`: a ``cell_id`` that is not 12
  hex digits, text in a numeric column, ...).

Bad lines are left out with one warning naming the file and the lines
(:func:`bad_lines_warning`); a writer about to rewrite the file first moves them, byte for byte,
to its rejected-lines file (``results.rejected.csv``, ``training.rejected.csv``: :func:`set_aside`,
appended, never overwritten), so that nothing read is ever lost.
"""

from __future__ import annotations

import csv
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedlmc.simulations.config.schema import ConfigError

__all__ = [
    "CONTROL",
    "Lines",
    "RowCheck",
    "bad_lines_warning",
    "is_number",
    "plain_text",
    "rejected_path",
    "set_aside",
    "shown_field",
    "split_lines",
]

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0 and C1 control characters, DEL
NOT_UTF8 = re.compile(r"[\udc80-\udcff]")  # bytes kept by errors="surrogateescape"
BOM = "\ufeff"  # a UTF-8 byte order mark, as spreadsheet programs write one
SHOWN_REASONS = 5  # bad lines named in a warning

RowCheck = Callable[[Mapping[str, str]], str | None]
"""A file's own check of one row (``column -> field``, the field count already right): why the
row is bad, or ``None``."""


def plain_text(value: object) -> object:
    """``value`` with every control character (a line end, a NUL byte, an escape code) replaced
    by a space when it is a string (the writers' half of the one-line-per-row rule)."""
    return CONTROL.sub(" ", value) if isinstance(value, str) else value


def is_number(text: str) -> bool:
    """Whether a field holds a number (or nothing: a missing value)."""
    if text == "":
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def shown_field(text: str) -> str:
    """A field as a warning shows it: its first 20 characters."""
    return repr(text[:20] + ("..." if len(text) > 20 else ""))


@dataclass
class Lines:
    """What :func:`split_lines` read: the header (``None`` when no line is one), the good rows
    (their fields) and the bad lines (the line as it was, its reason)."""

    header: list[str] | None
    good: list[list[str]] = field(default_factory=list)
    bad: list[tuple[str, str]] = field(default_factory=list)


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
        raise ConfigError(f"file {str(path)!r}: cannot read it ({err})") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the end of the last line
    text = [line.decode("utf-8", errors="surrogateescape").removesuffix("\r") for line in lines]
    return data.endswith(b"\n"), text


def line_problem(
    line: str, header: Sequence[str], check: RowCheck, *, cut_off: bool
) -> tuple[list[str] | None, str | None]:
    """``(fields, why the line is bad or None)`` of one line after the header (module
    docstring; ``cut_off``: the line is the last of a file without a final line end)."""
    row = parse_line(line)
    if NOT_UTF8.search(line):
        return row, "not UTF-8 text"
    if cut_off:
        return row, "cut off (the file does not end with a line end)"
    if row is None:
        return None, "an unclosed quote"
    if len(row) != len(header):
        return row, f"{len(row)} fields where the header has {len(header)}"
    values = dict(zip(header, row, strict=True))
    for column, text in values.items():
        found = CONTROL.search(text)
        if found:
            shown = repr(found.group())
            return row, f"{column} holds a control character ({shown}); allowed: plain text"
    return row, check(values)


def split_lines(path: Path, required: Sequence[str], check: RowCheck) -> Lines:
    """The header, good rows and bad lines of the CSV file at ``path`` (module docstring): the
    header is the first line holding every column of ``required``; ``check`` is the file's own
    check of a row."""
    ends_well, lines = read_lines(path)
    if lines:
        lines[0] = lines[0].removeprefix(BOM)
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    last = numbered[-1][0] if numbered else 0
    found = Lines(header=None)
    for number, line in numbered:
        if found.header is None:
            fields = parse_line(line)
            if fields is not None and set(required) <= set(fields) and not NOT_UTF8.search(line):
                found.header = fields
            else:
                found.bad.append((line, f"line {number}: before the header"))
            continue
        row, problem = line_problem(
            line, found.header, check, cut_off=number == last and not ends_well
        )
        if problem is None:
            found.good.append(row)
        else:
            found.bad.append((line, f"line {number}: {problem}"))
    return found


def rejected_path(path: Path) -> Path:
    """Where the bad lines of ``path`` go: ``results.csv`` -> ``results.rejected.csv``."""
    return path.with_name(f"{path.stem}.rejected{path.suffix}")


def set_aside(path: Path, header: Sequence[str] | None, lines: Sequence[str]) -> Path:
    """Append the bad ``lines``, byte for byte as they were, to :func:`rejected_path` of
    ``path`` (the header first when the file is new and ``path`` has one)."""
    target = rejected_path(path)
    new = not target.exists() and header is not None
    head = (",".join(header) + "\n").encode("utf-8") if new else b""
    body = b"".join(line.encode("utf-8", errors="surrogateescape") + b"\n" for line in lines)
    with target.open("ab") as handle:
        handle.write(head + body)
        handle.flush()
        os.fsync(handle.fileno())
    return target


def bad_lines_warning(path: Path, bad: Sequence[tuple[str, str]], where: str) -> None:
    """One warning line on stderr naming ``path``, how many lines were bad, where they went
    (``where``) and the first reasons."""
    reasons = "; ".join(reason for _, reason in bad[:SHOWN_REASONS])
    more = f" (and {len(bad) - SHOWN_REASONS} more)" if len(bad) > SHOWN_REASONS else ""
    print(
        f"fedlmc: warning: {len(bad)} bad row(s) in {str(path)!r} {where}: {reasons}{more}",
        file=sys.stderr,
    )
