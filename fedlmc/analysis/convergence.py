r"""Did a client's training converge? Rules on its per-epoch training-loss curve.

For one client's curve :math:`L_1, \dots, L_E` (mean training loss of each epoch,
``training.csv``'s ``train_loss``), with the relative change
:math:`r_e = |L_e - L_{e-1}| / L_{e-1}` (:math:`e = 2..E`):

- **settled epoch** (:func:`settled_epoch`): the first epoch :math:`e \in 1..E-1` after which
  every change stays below :data:`SETTLE_TOLERANCE` (1 %): :math:`r_{e'} < 1\%` for every
  :math:`e' = e+1..E`. NaN when there is none (the last epoch still changed the loss by 1 % or
  more, or :math:`E = 1`): the loss had not settled within the run.
- **still falling** (:func:`last_epochs_drop`, :func:`still_falling`): the relative drop over the
  last :data:`FALLING_EPOCHS` (2) epochs, :math:`d = (L_{E-2} - L_E) / L_{E-2}`; the client has
  *not converged* when :math:`d >` :data:`FALLING_THRESHOLD` (5 %), i.e. the loss was still
  falling by more than about 2.5 % per epoch at the end. :math:`d` is NaN (not flagged) for
  curves of at most 2 epochs: the rule is defined (:func:`judged`) only for curves of at least
  :data:`MIN_JUDGED_EPOCHS` (3) epochs with finite, positive losses, and a curve it cannot
  judge is neither converged nor not converged.

Relative changes are undefined where a loss is 0 or not finite (NaN, never flagged). A
relative rule reads a curve that ends near zero loss strictly (0.02 -> 0.018 is a 10 % drop):
it asks whether more epochs would still have changed the loss, not whether they would change the
accuracy. :func:`curve_summary` applies the rules to every client curve of a training table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

SETTLE_TOLERANCE = 0.01
"""Largest relative change per epoch that counts as settled (1 %)."""
FALLING_EPOCHS = 2
"""Epochs at the end of a curve over which the drop is measured."""
FALLING_THRESHOLD = 0.05
"""Relative drop over the last :data:`FALLING_EPOCHS` epochs above which a client has not
converged (5 %)."""
MIN_JUDGED_EPOCHS = FALLING_EPOCHS + 1
"""Fewest epochs for which :func:`still_falling` is defined (3)."""


def relative_changes(losses: Sequence[float]) -> np.ndarray:
    r""":math:`r_e = |L_e - L_{e-1}| / L_{e-1}` for :math:`e = 2..E` (NaN where
    :math:`L_{e-1} \le 0` or a value is not finite)."""
    values = np.asarray(losses, dtype=float)
    previous, current = values[:-1], values[1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        change = np.abs(current - previous) / previous
    change[~(np.isfinite(change) & (previous > 0))] = np.nan
    return change


def settled_epoch(losses: Sequence[float], tolerance: float = SETTLE_TOLERANCE) -> float:
    """The first epoch (1-based) after which every relative change is below ``tolerance``
    (module docstring); NaN when there is none."""
    changes = relative_changes(losses)
    if len(changes) == 0 or np.isnan(changes).any():
        return math.nan
    settled = math.nan
    for e in range(len(changes), 0, -1):  # changes[e - 1] is r_{e+1}
        if not changes[e - 1] < tolerance:
            break
        settled = float(e)
    return settled


def last_epochs_drop(losses: Sequence[float], epochs: int = FALLING_EPOCHS) -> float:
    r""":math:`(L_{E-k} - L_E) / L_{E-k}` with :math:`k` = ``epochs`` (NaN for curves of at most
    ``epochs`` values or a non-positive / non-finite :math:`L_{E-k}`)."""
    values = np.asarray(losses, dtype=float)
    if len(values) <= epochs:
        return math.nan
    start, end = values[-1 - epochs], values[-1]
    if not (math.isfinite(start) and math.isfinite(end) and start > 0):
        return math.nan
    return float((start - end) / start)


def still_falling(losses: Sequence[float], threshold: float = FALLING_THRESHOLD) -> bool:
    """Whether the curve had not converged: :func:`last_epochs_drop` above ``threshold``."""
    drop = last_epochs_drop(losses)
    return bool(math.isfinite(drop) and drop > threshold)


def judged(losses: Sequence[float]) -> bool:
    """Whether the still-falling rule is defined for the curve (:func:`last_epochs_drop` is
    finite): at least :data:`MIN_JUDGED_EPOCHS` epochs, a finite positive start and end."""
    return math.isfinite(last_epochs_drop(losses))


def curve_summary(curves: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """One row per curve (``by`` identifies it, e.g. ``cell_id`` and ``client``; rows ordered by
    ``step`` within it): ``epochs``, ``final_train_loss``, ``settled_epoch``,
    ``last_epochs_drop``, ``judged`` (:func:`judged`: the rule is defined for it) and
    ``not_converged`` (:func:`still_falling`)."""
    rows = []
    for key, curve in curves.sort_values("step").groupby(list(by), sort=True, dropna=False):
        losses = pd.to_numeric(curve["train_loss"], errors="coerce").tolist()
        key = key if isinstance(key, tuple) else (key,)
        rows.append(
            {
                **dict(zip(by, key, strict=True)),
                "epochs": len(losses),
                "final_train_loss": losses[-1] if losses else math.nan,
                "settled_epoch": settled_epoch(losses),
                "last_epochs_drop": last_epochs_drop(losses),
                "judged": judged(losses),
                "not_converged": still_falling(losses),
            }
        )
    columns = [*by, "epochs", "final_train_loss", "settled_epoch", "last_epochs_drop", "judged"]
    return pd.DataFrame(rows, columns=[*columns, "not_converged"])
