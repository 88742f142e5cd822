"""Evaluation of classifiers: accuracy, negative log-likelihood and calibration error.

All functions work on logits computed in batches without gradients. A temperature ``T``
rescales logits as ``softmax(z / T)``; it changes NLL and calibration, never the argmax.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Data = tuple[Tensor, Tensor]


def default_device() -> torch.device:
    """CUDA when available, CPU otherwise."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` means :func:`default_device`; anything else is passed to ``torch.device``."""
    return default_device() if device is None else torch.device(device)


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (else first buffer); the CPU for an empty one."""
    tensor = next(model.parameters(), None)
    if tensor is None:
        tensor = next(model.buffers(), None)
    return tensor.device if tensor is not None else torch.device("cpu")


@torch.no_grad()
def predict_logits(
    model: nn.Module,
    x: Tensor,
    *,
    batch_size: int = 1024,
    device: str | torch.device | None = None,
) -> Tensor:
    """Logits of ``model`` on ``x`` in eval mode, in batches; returned on the CPU as float32.

    The model is moved to ``device`` (default: the device of its parameters) and left in eval mode.
    """
    device = model_device(model) if device is None else torch.device(device)
    model.to(device).eval()
    chunks = [
        model(x[i : i + batch_size].to(device, non_blocking=True)).float().cpu()
        for i in range(0, len(x), batch_size)
    ]
    return torch.cat(chunks) if chunks else torch.empty(0)


def expected_calibration_error(probs: Tensor, labels: Tensor, n_bins: int = 15) -> float:
    r"""Expected calibration error with ``n_bins`` equal-width confidence bins.

    .. math:: \mathrm{ECE} = \sum_b \frac{|B_b|}{n} \, |\mathrm{acc}(B_b) - \mathrm{conf}(B_b)|

    where the confidence of a sample is its largest predicted probability.
    """
    confidence, prediction = probs.max(dim=1)
    correct = prediction.eq(labels).double()
    bins = torch.clamp((confidence.double() * n_bins).long(), max=n_bins - 1)
    conf_sum = torch.bincount(bins, weights=confidence.double(), minlength=n_bins)
    acc_sum = torch.bincount(bins, weights=correct, minlength=n_bins)
    return float((conf_sum - acc_sum).abs().sum() / max(len(labels), 1))


def metrics_from_logits(
    logits: Tensor, labels: Tensor, temperature: float = 1.0
) -> dict[str, float]:
    """``accuracy``, mean ``nll`` and ``ece`` (15 bins) of ``softmax(logits / temperature)``."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits = logits.double() / temperature
    labels = labels.long()
    log_probs = F.log_softmax(logits, dim=1)
    return {
        "accuracy": float(log_probs.argmax(dim=1).eq(labels).double().mean()),
        "nll": float(F.nll_loss(log_probs, labels)),
        "ece": expected_calibration_error(log_probs.exp(), labels),
    }


def metrics_from_probs(probs: Tensor, labels: Tensor) -> dict[str, float]:
    """``accuracy``, ``nll`` and ``ece`` of predicted class probabilities (e.g. an ensemble)."""
    probs = probs.double()
    labels = labels.long()
    nll = -torch.log(probs.gather(1, labels[:, None]).clamp_min(1e-300)).mean()
    return {
        "accuracy": float(probs.argmax(dim=1).eq(labels).double().mean()),
        "nll": float(nll),
        "ece": expected_calibration_error(probs, labels),
    }


def evaluate(
    model: nn.Module,
    data: Data,
    temperature: float = 1.0,
    *,
    batch_size: int = 1024,
    device: str | torch.device | None = None,
) -> dict[str, float]:
    """Accuracy, mean NLL and 15-bin ECE of ``model`` on ``data = (x, y)`` at ``temperature``."""
    x, y = data
    return metrics_from_logits(
        predict_logits(model, x, batch_size=batch_size, device=device), y, temperature
    )


def ensemble_probs(
    logits: list[Tensor],
    weights: list[float] | None = None,
    temperatures: list[float] | None = None,
) -> Tensor:
    r"""Weighted mean of the members' softmax outputs, each at its own temperature:
    :math:`\sum_i w_i \, \mathrm{softmax}(z_i / T_i)`, the weights normalised to sum to 1
    (default :math:`w_i = 1/N`, the equal-weight ensemble), :math:`T_i = 1` by default."""
    if not logits:
        raise ValueError("ensemble_probs needs at least one member, got none")
    w = torch.full((len(logits),), 1.0 / len(logits), dtype=torch.float64)
    if weights is not None:
        w = torch.as_tensor(weights, dtype=torch.float64)
        if len(w) != len(logits) or bool((w < 0).any()) or not float(w.sum()) > 0:
            raise ValueError(
                f"ensemble weights must be {len(logits)} members' non-negative numbers with a "
                f"positive sum, got {list(weights)}"
            )
        w = w / w.sum()
    t = [1.0] * len(logits) if temperatures is None else [float(v) for v in temperatures]
    if len(t) != len(logits) or not all(math.isfinite(v) and v > 0 for v in t):
        raise ValueError(
            f"ensemble temperatures must be {len(logits)} members' finite positive numbers, "
            f"got {list(temperatures or [])}"
        )
    return sum(
        wi * F.softmax(z.double() / ti, dim=1) for wi, ti, z in zip(w, t, logits, strict=True)
    )
