"""Typed configuration keys and their checks, shared by the run config and the report settings.

A :class:`Key` holds a type, a default, a one-line meaning and a check returning an error text
(``"allowed: ..."``) or ``None``; a run-config key also says whether it is a runtime key
(excluded from a cell's identity) and when it can affect a run (:class:`Rule`: elsewhere the
canonical config resets it to its default). :func:`check_value` coerces and checks one value and
raises :class:`ConfigError`, whose one-line message names the key, the value and what is
allowed.
Imports nothing heavy (no torch, scipy or pandas).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_INT",
    "Check",
    "ConfigError",
    "Key",
    "Range",
    "Rule",
    "at_least",
    "bounds_text",
    "check_value",
    "choice",
    "coerce",
    "did_you_mean",
    "fraction",
    "integers",
    "named",
    "numbers",
    "out_of_range",
    "shown",
]

Check = Callable[[Any], str | None]
MAX_INT = 2**63 - 1  # TOML integers are 64-bit; so are the seeds, counts and sizes they set
MAX_SHOWN = 40  # characters of a value shown in a message


def shown(value: Any) -> str:
    """``repr(value)``, cut to :data:`MAX_SHOWN` characters with its length when longer, so that
    a message about a 10,000-digit number or a 10,000-character name stays one short line."""
    return cut(repr(value))


def cut(text: str) -> str:
    """``text`` cut to :data:`MAX_SHOWN` characters with its length when longer."""
    if len(text) <= MAX_SHOWN:
        return text
    return f"{text[: MAX_SHOWN - 10]}...{text[-6:]} ({len(text)} characters)"


def out_of_range(key: str, value: Any, spec: Key | None) -> str:
    """The message for an integer beyond 64 bits: the key, the value cut short, and what
    ``spec``'s check allows (``allowed: a number > 0``) within the 64-bit range (a
    :class:`Range` states its own bounds)."""
    check = spec.check if spec is not None else None
    if isinstance(check, Range):
        return f"{key} = {cut(str(value))}: out of range; {check.allowed}"
    allowed = getattr(check, "allowed", None) or "allowed: an integer"
    return f"{key} = {cut(str(value))}: out of range; {allowed}, at most {MAX_INT} (64-bit)"


class ConfigError(ValueError):
    """An invalid configuration value; the one-line message names key, value and what is allowed."""


class ConfigErrors(ConfigError):
    """Several independent mistakes of one file, each a one-line :class:`ConfigError` message
    (``messages``), so that a file with three mistakes names all three."""

    def __init__(self, errors: Sequence[ConfigError]) -> None:
        self.messages = [m for err in errors for m in getattr(err, "messages", [str(err)])]
        super().__init__("; ".join(self.messages))


def collected(checks: Sequence[Callable[[], Any]]) -> list[Any]:
    """Each check's result (``None`` for one that failed), then :class:`ConfigErrors` naming
    every failure when more than one failed (the one :class:`ConfigError` itself when one did)."""
    results, errors = [], []
    for check in checks:
        try:
            results.append(check())
        except ConfigError as err:
            errors.append(err)
            results.append(None)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(errors)
    return results


@dataclass(frozen=True)
class Rule:
    """A function of a validated configuration with its text for the docs: a condition
    (``applies``) or the value a key stands for (``resolve``)."""

    text: str
    of: Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Key:
    """One configuration key: its type, default, meaning, and a check (error text or ``None``)."""

    type: type
    default: Any
    doc: str
    check: Check | None = None
    allowed: Callable[[], Sequence[str]] | None = None
    """For keys with named values: the allowed names (read when asked, e.g. from a registry)."""
    booleans: bool = False
    """A named key whose names include ``"true"``/``"false"``: TOML booleans are read as those."""
    comma_list: bool = False
    """A comma-separated list: a TOML list is read as its items joined by commas."""
    runtime: bool = False
    """Where or how a run executes, not what it computes: left out of a cell's identity."""
    applies: Rule | None = None
    """When the key can affect a run (``None``: always); elsewhere the canonical config resets
    it to its default, so cells differing only in it are one cell."""
    resolve: Rule | None = None
    """The value the key stands for in a cell's identity (e.g. ``auto`` -> the model's default)."""


def choice(allowed: Callable[[], Sequence[str]] | Sequence[str]) -> Check:
    """A check accepting the names of ``allowed`` (a sequence, or a function read at check time)."""

    def check(value: Any) -> str | None:
        names = allowed() if callable(allowed) else allowed
        return None if value in names else f"allowed: {', '.join(names)}"

    return check


def named(
    kind: type,
    default: str,
    doc: str,
    allowed: Callable[[], Sequence[str]] | Sequence[str],
    **fields: Any,
) -> Key:
    """A key whose value is one of ``allowed`` (a sequence, or a function read at check time,
    e.g. a registry's names); ``fields``: the other :class:`Key` fields (``runtime``, ...)."""
    names = allowed if callable(allowed) else (lambda: tuple(allowed))
    return Key(kind, default, doc, choice(names), names, **fields)


def at_least(low: float, *, strict: bool = False) -> Check:
    """A check accepting numbers ``>= low`` (``> low`` when ``strict``)."""

    text = f"allowed: a number {'>' if strict else '>='} {low}"

    def check(value: Any) -> str | None:
        ok = value > low if strict else value >= low
        return None if ok else text

    check.allowed = text  # type: ignore[attr-defined]
    return check


def bound_text(bound: float) -> str:
    """A bound as written in a range: ``100000``, ``0.5``, ``1e-06`` (no digit grouping: a comma
    separates the bounds)."""
    if isinstance(bound, int) or (float(bound).is_integer() and abs(bound) < 1e16):
        return str(int(bound))
    return f"{bound:g}"


@dataclass(frozen=True)
class Range:
    """The check of a numeric key: the range a real run could use, declared once (the key
    table's ``fedlmc keys`` column, the error message and the tests read it).

    Accepts ``low <= value <= high`` (``<`` at an ``open`` end); ``integer``: the key is an int
    (written ``1 .. 100000``, else ``(0, 10]``); ``why``: one phrase saying why a real run stays
    inside (empty where the bounds are the quantity's own, a share in [0, 1)); ``also``: a
    further check (``lambdas`` must be odd)."""

    low: float
    high: float
    why: str = ""
    integer: bool = False
    low_open: bool = False
    high_open: bool = False
    also: Check | None = None

    def __call__(self, value: Any) -> str | None:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        if not (above and below):
            return self.allowed
        return self.also(value) if self.also is not None else None

    @property
    def bounds(self) -> str:
        """``1 .. 100000`` (an integer key) or ``(0, 10]``."""
        low, high = bound_text(self.low), bound_text(self.high)
        if self.integer and not (self.low_open or self.high_open):
            return f"{low} .. {high}"
        return f"{'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"

    @property
    def allowed(self) -> str:
        """``allowed: an integer 1 .. 100000 (why)`` / ``allowed: a number in (0, 10] (why)``."""
        what = f"an integer {self.bounds}" if self.integer else f"a number in {self.bounds}"
        return f"allowed: {what}{f' ({self.why})' if self.why else ''}"


def integers(low: int, high: int, why: str = "", **fields: Any) -> Range:
    """The :class:`Range` of an int key: ``low .. high``."""
    return Range(low, high, why, True, **fields)


def numbers(
    low: float,
    high: float,
    why: str = "",
    *,
    low_open: bool = False,
    high_open: bool = False,
    also: Check | None = None,
) -> Range:
    """The :class:`Range` of a float key: ``[low, high]``, ``(`` / ``)`` at an open end;
    ``also``: a further check."""
    return Range(low, high, why, False, low_open, high_open, also)


def bounds_text(spec: Key) -> str | None:
    """``allowed: ...`` of a key whose check is a :class:`Range` (``fedlmc keys``), else
    ``None``."""
    return spec.check.allowed if isinstance(spec.check, Range) else None


fraction: Range = numbers(0.0, 1.0, high_open=True)
"""A check accepting numbers in [0, 1): a share."""


def did_you_mean(name: str, choices: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def coerce(key: str, value: Any, expected: type) -> Any:
    """``value`` as ``expected``: ints are accepted for floats; bools never count as numbers."""
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, expected) and not (expected is not bool and isinstance(value, bool)):
        return value
    raise ConfigError(f"{key} = {shown(value)}: expected {expected.__name__}")


def joined_list(key: str, value: Any) -> Any:
    """A list key's ``value``: a string as it is, a list (of names or numbers) joined by commas;
    anything else refused with what is allowed."""
    if isinstance(value, str):
        return value
    items = value if isinstance(value, list | tuple) else [value]
    if not isinstance(value, list | tuple) or not all(_list_item(item) for item in items):
        raise ConfigError(
            f"{key} = {shown(value)}: allowed: a comma-separated string or a list of names or "
            "numbers"
        )
    return ",".join(str(item) for item in items)


def _list_item(item: Any) -> bool:
    return isinstance(item, str | int | float) and not isinstance(item, bool)


def check_value(key: str, value: Any, schema: Mapping[str, Key], where: str = "") -> Any:
    """``value`` coerced to the type of ``schema[key]`` and checked (``where`` prefixes the key
    in messages, e.g. ``"grid."``); floats must be finite."""
    spec = schema[key]
    if spec.booleans and isinstance(value, bool):
        value = "true" if value else "false"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise ConfigError(out_of_range(f"{where}{key}", value, spec))
    if spec.comma_list:
        value = joined_list(f"{where}{key}", value)
    value = coerce(f"{where}{key}", value, spec.type)
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}{key} = {shown(value)}: allowed: a finite number")
    problem = spec.check(value) if spec.check else None
    if problem:
        raise ConfigError(f"{where}{key} = {shown(value)}: {problem}")
    return value
