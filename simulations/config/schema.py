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
    "Rule",
    "at_least",
    "check_value",
    "choice",
    "coerce",
    "did_you_mean",
    "fraction",
    "named",
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
    ``spec``'s check allows (``allowed: a number > 0``) within the 64-bit range."""
    text = getattr(spec.check, "allowed", None) if spec is not None else None
    allowed = text or "allowed: an integer"
    return f"{key} = {cut(str(value))}: out of range; {allowed}, at most {MAX_INT} (64-bit)"


class ConfigError(ValueError):
    """An invalid configuration value; the one-line message names key, value and what is allowed."""


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


def fraction(value: Any) -> str | None:
    """A check accepting numbers in [0, 1)."""
    return None if 0.0 <= value < 1.0 else fraction.allowed


fraction.allowed = "allowed: a number in [0, 1)"  # type: ignore[attr-defined]


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


def check_value(key: str, value: Any, schema: Mapping[str, Key], where: str = "") -> Any:
    """``value`` coerced to the type of ``schema[key]`` and checked (``where`` prefixes the key
    in messages, e.g. ``"grid."``); floats must be finite."""
    spec = schema[key]
    if spec.booleans and isinstance(value, bool):
        value = "true" if value else "false"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise ConfigError(out_of_range(f"{where}{key}", value, spec))
    value = coerce(f"{where}{key}", value, spec.type)
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}{key} = {shown(value)}: allowed: a finite number")
    problem = spec.check(value) if spec.check else None
    if problem:
        raise ConfigError(f"{where}{key} = {shown(value)}: {problem}")
    return value
