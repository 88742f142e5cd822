r"""What a row's numbers say that a reader would otherwise miss: a temperature at an end of the
fit's range, an accuracy no better than guessing.

- ``temperature_at_bound``: the row's temperature :math:`T` is clamped to
  :math:`[T_{\min}, T_{\max}] = [10^{-3}, 10^{3}]` by the fit, ``lower`` or ``upper``
  (:func:`fedlmc.merging.temperature_bound.temperature_bound`; what each end means there): the
  range's end, not a fitted value. The sentence saying it is the one every path that fits a
  temperature says (:func:`fedlmc.merging.temperature_bound.bound_line`).
- ``at_chance``: with :math:`C` classes and :math:`n` test samples, a model that guesses has
  accuracy :math:`p_0 = 1/C` with binomial standard error :math:`\sqrt{p_0 (1 - p_0) / n}`; the
  row is flagged when

  .. math:: \mathrm{acc} \le p_0 + 2 \sqrt{p_0 (1 - p_0) / n}

  (10 classes, 1,000 test digits: at most 0.119).

:func:`flag_columns` computes both for a row, :func:`flag_lines` says them in words (the
``fedlmc run`` console, the ServerApp's log, ``report.md``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from fedlmc.merging.temperature_bound import T_MAX, T_MIN, bound_line, temperature_bound

__all__ = ["chance_threshold", "flag_columns", "flag_lines", "temperature_bound"]


def chance_threshold(num_classes: int, test_size: int) -> float:
    r""":math:`p_0 + 2\sqrt{p_0(1 - p_0)/n}` with :math:`p_0 = 1/C` (module docstring)."""
    p0 = 1.0 / num_classes
    return p0 + 2.0 * math.sqrt(p0 * (1.0 - p0) / test_size)


def flag_columns(row: Mapping[str, Any], num_classes: int, test_size: int) -> dict[str, Any]:
    """``temperature_at_bound`` and ``at_chance`` of ``row`` (its ``temperature`` and
    ``accuracy``); ``at_chance`` is NaN without a finite accuracy."""
    accuracy = row.get("accuracy", math.nan)
    finite = isinstance(accuracy, int | float) and math.isfinite(accuracy)
    threshold = chance_threshold(num_classes, test_size)
    return {
        "temperature_at_bound": temperature_bound(row.get("temperature", math.nan)),
        "at_chance": float(accuracy <= threshold) if finite else math.nan,
    }


def flag_lines(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """One sentence per flagged row: a temperature at a bound, an accuracy at chance."""
    lines = []
    for row in rows:
        method, bound = row.get("method", "?"), row.get("temperature_at_bound", "")
        if bound in ("lower", "upper"):  # the row's flag, said in the shared sentence
            lines.append(bound_line(method, T_MIN if bound == "lower" else T_MAX))
        if row.get("at_chance") == 1:
            lines.append(
                f"{method}: accuracy {row['accuracy']:.3f} is no better than guessing "
                "(within two standard errors of 1 / the number of classes)"
            )
    return lines
