r"""A temperature at an end of the fit's range, said in one line wherever a temperature is fitted.

The fit (:func:`fedlmc.merging.calibrate.fit_temperature`, and the federated fit) clamps
:math:`T` to :math:`[T_{\min}, T_{\max}] = [10^{-3}, 10^{3}]`. At :math:`T_{\min}` (``lower``)
the NLL still fell as :math:`T \to 0`: every calibration sample is classified correctly with a
margin. At :math:`T_{\max}` (``upper``) the logits carry no usable information and the NLL is
least at near-uniform predictions. Either way :math:`T` is the range's end, not a fitted value.

:func:`temperature_bound` says which end, :func:`bound_line` says it in one sentence. Every path
that fits a temperature says that sentence: the study's rows (the ``temperature_at_bound``
column; :func:`fedlmc.study.flags.flag_lines` for ``fedlmc run``, the ServerApp's log and
``report.md``, the secure and DP servers' rows included), the strategies' log
(:func:`fedlmc.strategies.strategy_utils.log_temperature_bound`) and the library's calibration
call (:func:`fedlmc.merging.post_merge.calibrate`, a :class:`TemperatureAtBoundWarning`).

The bounds are declared here (:mod:`fedlmc.merging.calibrate` imports them); this module
imports no torch.
"""

from __future__ import annotations

import math
import warnings

__all__ = [
    "T_MAX",
    "T_MIN",
    "TemperatureAtBoundWarning",
    "bound_line",
    "temperature_bound",
    "warn_at_bound",
]

T_MIN = 1e-3
"""The fit's lower bound."""
T_MAX = 1e3
"""The fit's upper bound."""


class TemperatureAtBoundWarning(RuntimeWarning):
    """A fitted temperature is an end of the fit's range, not a fitted value."""


def temperature_bound(temperature: float) -> str:
    """``"lower"``, ``"upper"`` or ``""``: whether ``temperature`` is an end of the fit's range
    (to float rounding)."""
    if not (isinstance(temperature, int | float) and math.isfinite(temperature)):
        return ""
    if math.isclose(temperature, T_MIN, rel_tol=1e-6):
        return "lower"
    if math.isclose(temperature, T_MAX, rel_tol=1e-6):
        return "upper"
    return ""


def bound_line(what: str, temperature: float) -> str:
    """One sentence saying that ``what``'s temperature is an end of the fit's range and what
    that means; ``""`` when it is not."""
    bound = temperature_bound(temperature)
    if bound == "lower":
        return (
            f"{what}: the temperature is the fit's lower bound {T_MIN:g}: the merged model "
            "classifies the calibration data correctly with a margin, so no finite T is best"
        )
    if bound == "upper":
        return (
            f"{what}: the temperature is the fit's upper bound {T_MAX:g}: its logits carry "
            "no usable information about the labels (near-uniform predictions fit best)"
        )
    return ""


def warn_at_bound(what: str, temperature: float, stacklevel: int = 2) -> None:
    """A :class:`TemperatureAtBoundWarning` with :func:`bound_line`'s sentence when
    ``temperature`` is an end of the fit's range; nothing otherwise."""
    line = bound_line(what, temperature)
    if line:
        warnings.warn(line, TemperatureAtBoundWarning, stacklevel=stacklevel + 1)
