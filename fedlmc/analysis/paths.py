r"""Linear-mode-connectivity metrics: interpolation curves, barriers and merge gaps.

Along the path :math:`\theta(\lambda) = \lambda\theta_a + (1-\lambda)\theta_b` (``lam = 1`` is
model a) the loss barrier is the largest excess of the path's loss over the straight line between
the endpoints,

.. math:: B_{\mathrm{loss}} = \max_\lambda \; L(\lambda) - [\lambda L(1) + (1-\lambda) L(0)],

and the accuracy barrier the largest shortfall of accuracy below that line,
:math:`B_{\mathrm{acc}} = \max_\lambda [\lambda A(1) + (1-\lambda) A(0)] - A(\lambda)`.
Both are >= 0 on a grid that contains the endpoints; positive means the path is worse than the line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from torch import Tensor, nn

from fedlmc.averaging import interpolate, load_state
from fedlmc.evaluation import metrics_from_logits, predict_logits, resolve_device
from fedlmc.merging.calibrate import fit_temperature, has_batchnorm, reset_bn_stats
from fedlmc.merging.repair import repair

Data = tuple[Tensor, Tensor]
PathRule = Callable[[Mapping[str, Tensor], Mapping[str, Tensor], float], dict[str, Tensor]]
CURVE_COLUMNS = ("lam", "accuracy", "nll", "ece", "temperature", "nll_calibrated", "ece_calibrated")
CLIENT_PATHS_MAX_CLIENTS = 16  # client -> merge paths on at most this many clients per merge


def path_clients(count: int, cap: int = CLIENT_PATHS_MAX_CLIENTS) -> list[int]:
    r"""The clients whose paths to the merge are evaluated: all ``count`` up to ``cap``, else
    ``cap`` evenly spaced partition indices :math:`\mathrm{round}(k (N-1) / (\mathrm{cap}-1))`,
    :math:`k = 0 \dots \mathrm{cap}-1` (the first and the last client included). Each path costs
    ``lambdas`` evaluations of the test split, so the cap keeps this diagnostic's cost bounded
    in N instead of growing with every client the merge reads."""
    if count <= cap:
        return list(range(count))
    if cap < 2:
        raise ValueError(f"path_clients: cap {cap}; allowed: at least 2")
    return [round(k * (count - 1) / (cap - 1)) for k in range(cap)]


def lambda_grid(lambdas: int | Sequence[float]) -> list[float]:
    """``lambdas`` evenly spaced points in [0, 1] (both ends included) or the given values."""
    if isinstance(lambdas, int):
        if lambdas < 2:
            raise ValueError(f"lambdas must be >= 2 grid points, got {lambdas}")
        return [float(v) for v in np.linspace(0.0, 1.0, lambdas)]
    values = [float(v) for v in lambdas]
    if not values:
        raise ValueError("lambdas must not be empty")
    return values


def point_metrics(
    model: nn.Module,
    test: Data,
    calibration: Data | None = None,
    *,
    batch_size: int = 1024,
) -> dict[str, float]:
    """Raw metrics on ``test`` and, with ``calibration``, metrics at the temperature fitted there.

    Without ``calibration`` the temperature is 1 and the calibrated columns equal the raw ones.
    """
    x, y = test
    logits = predict_logits(model, x, batch_size=batch_size)
    temperature = 1.0
    if calibration is not None:
        cal_logits = predict_logits(model, calibration[0], batch_size=batch_size)
        temperature = fit_temperature(cal_logits, calibration[1])
    return logit_point_metrics(logits, y, temperature)


def logit_point_metrics(
    logits: Tensor, labels: Tensor, temperature: float = 1.0
) -> dict[str, float]:
    """:func:`point_metrics` of a model's test ``logits`` and the ``temperature`` fitted for it
    (1: the calibrated columns equal the raw ones)."""
    raw = metrics_from_logits(logits, labels)
    calibrated = metrics_from_logits(logits, labels, temperature) if temperature != 1.0 else raw
    return {
        "accuracy": raw["accuracy"],
        "nll": raw["nll"],
        "ece": raw["ece"],
        "temperature": temperature,
        "nll_calibrated": calibrated["nll"],
        "ece_calibrated": calibrated["ece"],
    }


def interpolation_curve(
    model: nn.Module,
    sd_a: Mapping[str, Tensor],
    sd_b: Mapping[str, Tensor],
    test: Data,
    *,
    lambdas: int | Sequence[float] = 25,
    calibration: Data | None = None,
    bn_data: Tensor | Data | None = None,
    repair_data: Tensor | None = None,
    batch_size: int = 1024,
    device: str | None = None,
    path: PathRule | None = None,
    point: Callable[[nn.Module], Mapping[str, float]] | None = None,
) -> pd.DataFrame:
    r"""Metrics of :math:`\theta(\lambda) = \lambda\theta_a + (1-\lambda)\theta_b` along a grid.

    ``path(sd_a, sd_b, lam)`` replaces the linear interpolation where a merge method combines
    weights by its own rule (e.g. depth-weighted biases, :mod:`fedlmc.permutation.chain`); it must
    give the endpoints at ``lam = 1`` and ``lam = 0``.

    ``model`` is a template (never modified); at each ``lam`` a copy is loaded with the
    interpolated weights, BN statistics are re-estimated on ``bn_data`` if given and the model has
    BatchNorm, every interior point of a model without BatchNorm is repaired on the inputs
    ``repair_data`` if given (:func:`fedlmc.merging.repair.repair` with endpoint weights
    ``lam, 1 - lam``: the path REPAIR reports barriers on), and the temperature is refitted on
    ``calibration = (x, y)`` if given (otherwise ``temperature = 1`` and the ``*_calibrated``
    columns equal the raw ones). ``point(model)`` replaces :func:`point_metrics` on ``test`` and
    ``calibration`` where a caller has the same metrics already (a model it evaluated before:
    :meth:`fedlmc.study.context.StudyContext.predict`); it receives each point's finished model.

    Returns a DataFrame with columns ``lam, accuracy, nll, ece, temperature, nll_calibrated,
    ece_calibrated``, one row per ``lam`` in the given order.
    """
    target = resolve_device(device)
    endpoints = None
    if repair_data is not None and not has_batchnorm(model):
        endpoints = [load_state(model, sd).to(target).eval() for sd in (sd_a, sd_b)]
    state_at = interpolate if path is None else path
    rows = []
    for lam in lambda_grid(lambdas):
        merged = load_state(model, state_at(sd_a, sd_b, lam)).to(target)
        if bn_data is not None and has_batchnorm(merged):
            reset_bn_stats(merged, bn_data)
        elif endpoints is not None and 0.0 < lam < 1.0:
            merged = repair(merged.eval(), endpoints, [lam, 1.0 - lam], repair_data)
        if point is None:
            found = point_metrics(merged, test, calibration, batch_size=batch_size)
        else:
            found = point(merged)
        rows.append({"lam": lam, **found})
    return pd.DataFrame(rows, columns=list(CURVE_COLUMNS))


def _endpoint(curve: pd.DataFrame, lam: float, column: str) -> float:
    match = curve.loc[np.isclose(curve["lam"].to_numpy(dtype=float), lam, rtol=0, atol=1e-12)]
    if match.empty:
        raise ValueError(f"curve has no row at lam={lam}; barriers need both endpoints 0 and 1")
    return float(match[column].iloc[0])


def _excess(curve: pd.DataFrame, column: str, sign: float) -> tuple[np.ndarray, np.ndarray]:
    """``sign * (value(lam) - line(lam))`` with line the chord between lam=0 and lam=1."""
    lam = curve["lam"].to_numpy(dtype=float)
    at0, at1 = _endpoint(curve, 0.0, column), _endpoint(curve, 1.0, column)
    line = lam * at1 + (1.0 - lam) * at0
    return lam, sign * (curve[column].to_numpy(dtype=float) - line)


def barriers(curve: pd.DataFrame) -> dict[str, float]:
    r"""Loss, calibrated-loss and accuracy barriers of an interpolation curve.

    For a column :math:`v` the excess is
    :math:`e(\lambda) = v(\lambda) - [\lambda v(1) + (1-\lambda) v(0)]` (negated for accuracy).
    For each barrier ``B`` in ``loss_barrier`` (column ``nll``), ``loss_barrier_calibrated``
    (``nll_calibrated``, left out if the column is absent) and ``accuracy_barrier``
    (``accuracy``) the dict holds ``B`` = max of the excess over the grid (>= 0 since the grid
    contains the endpoints), ``B_lam`` = the ``lam`` where it is attained (the first, if tied)
    and ``B_at_half`` = the excess at :math:`\lambda = 1/2` (linearly interpolated between grid
    points if 1/2 is not on the grid), the quantity reported in the paper's Table 1.
    """
    curve = curve.sort_values("lam", kind="stable").reset_index(drop=True)
    result: dict[str, float] = {}
    for name, column, sign in (
        ("loss_barrier", "nll", 1.0),
        ("loss_barrier_calibrated", "nll_calibrated", 1.0),
        ("accuracy_barrier", "accuracy", -1.0),
    ):
        if column not in curve and column == "nll_calibrated":
            continue
        lam, excess = _excess(curve, column, sign)
        best = int(np.argmax(excess))
        result[name] = float(excess[best])
        result[f"{name}_lam"] = float(lam[best])
        result[f"{name}_at_half"] = float(np.interp(0.5, lam, excess))
    return result


def merge_gap(endpoint_metrics: Sequence[Mapping[str, float]], merged: Mapping[str, float]) -> dict:
    r"""Gap between a merged model and the mean of its N endpoints (positive = merged is worse).

    ``accuracy_gap`` :math:`= \overline{A}_{\mathrm{end}} - A_{\mathrm{merged}}`,
    ``loss_gap`` :math:`= L_{\mathrm{merged}} - \overline{L}_{\mathrm{end}}` (``nll``), and
    ``loss_gap_calibrated`` from ``nll_calibrated`` when every dict has it. The endpoint means are
    returned too (``endpoint_accuracy``, ``endpoint_nll``, ``endpoint_nll_calibrated``).
    """
    if not endpoint_metrics:
        raise ValueError("merge_gap needs at least one endpoint, got none")
    everyone = [*endpoint_metrics, merged]
    for key in ("accuracy", "nll"):
        if any(key not in m for m in everyone):
            raise ValueError(f"every metrics dict needs key {key!r}")
    mean_acc = float(np.mean([m["accuracy"] for m in endpoint_metrics]))
    mean_nll = float(np.mean([m["nll"] for m in endpoint_metrics]))
    gap = {
        "endpoint_accuracy": mean_acc,
        "endpoint_nll": mean_nll,
        "accuracy_gap": mean_acc - float(merged["accuracy"]),
        "loss_gap": float(merged["nll"]) - mean_nll,
    }
    if all("nll_calibrated" in m for m in everyone):
        mean_cal = float(np.mean([m["nll_calibrated"] for m in endpoint_metrics]))
        gap["endpoint_nll_calibrated"] = mean_cal
        gap["loss_gap_calibrated"] = float(merged["nll_calibrated"]) - mean_cal
    return gap


def lewc_temperature_path(curve: pd.DataFrame, depth: int) -> list[float]:
    r"""LEWC's prediction of the fitted temperature at each ``lam`` of a two-model ``curve``.

    LEWC says the logits of :math:`\theta(\lambda)` for a bias-free chain of :math:`L` layers are
    :math:`z(\lambda) \approx \lambda^L z_a + (1-\lambda)^L z_b`. Write each endpoint's logits as
    its fitted temperature times calibrated logits, :math:`z_a = T_a u_a`, :math:`z_b = T_b u_b`;
    where the calibrated logits agree (:math:`u_a \approx u_b`, as
    ``lewc_temperature_ratio`` assumes too), the fitted temperature is the logits' scale:

    .. math:: \hat T(\lambda) = \lambda^L \, T(1) + (1-\lambda)^L \, T(0),

    with :math:`T(1), T(0)` the curve's own fits at its endpoints (``lam = 1`` is model a).
    It equals the endpoints' fits there and, when they agree (:math:`T(0) = T(1) = T`), is
    :math:`(\lambda^L + (1-\lambda)^L)\,T` (:math:`2^{1-L} T` at 1/2). Returned in the curve's
    row order, in temperature units (not a ratio).
    """
    if depth < 1:
        raise ValueError(f"lewc_temperature_path: depth {depth}; allowed: an integer >= 1")
    at_one, at_zero = _endpoint(curve, 1.0, "temperature"), _endpoint(curve, 0.0, "temperature")
    lam = curve["lam"].to_numpy(dtype=float)
    return [float(v) for v in lam**depth * at_one + (1.0 - lam) ** depth * at_zero]
