"""Supervised training of one classifier on in-memory tensors.

The data ``(x, y)`` are moved to the training device once. Each epoch draws a permutation of
the sample indices from a ``torch.Generator`` seeded with ``seed`` (one generator per call, on the
training device, consumed in order: epoch ``e`` uses the ``e``-th permutation, then the crop/flip
draws of its batches) and takes mini-batches by row selection, ``x[perm[k * B : (k + 1) * B]]``;
no DataLoader, no per-sample Python work.

The loss is the mean cross-entropy of a batch; the optimiser minimises it plus weight decay
(``weight_decay * ||theta||^2 / 2`` as the optimiser's own decoupled/coupled term). Learning-rate
schedules are stepped once per batch over ``epochs * batches_per_epoch`` steps:

- ``"onecycle"``: ``torch.optim.lr_scheduler.OneCycleLR(max_lr=lr)`` (warm-up then cosine
  annealing; momentum is *not* cycled, so the ``momentum`` argument is what SGD uses),
- ``"cosine"``: ``lr * (1 + cos(pi * t / T)) / 2``,
- ``"constant"``: ``lr``.

Last partial batch: kept, except when it has a single sample and the model contains BatchNorm
(BatchNorm cannot normalise one sample in training mode); then it is dropped for that epoch.

Non-finite losses: each batch loss is kept as a device tensor (no host sync); every
:data:`CHECK_EVERY` steps and at the end of each epoch the unchecked ones are checked at once.
A NaN/inf raises :class:`NonFiniteLossError` naming the epoch, the first bad batch and its value,
so the weights are never returned after a non-finite loss (at most ``CHECK_EVERY - 1`` further
steps run before the error; the model passed in is then left in that state).

``amp=True`` runs forward passes under bf16 autocast on CUDA; on the CPU it is a no-op.

Held-out loss (``held_out = (x_h, y_h)``, e.g. a client's calibration share): after every
epoch, the mean cross-entropy over the ``n_h`` held-out samples of the model as it stands, in
eval mode (BatchNorm running statistics, no augmentation, no gradient), in batches of
:data:`HELD_OUT_BATCH`; the model goes back to train mode. It draws no random number and touches
no weight or running statistic, so the training run is bit-identical with or without it; its
time is kept apart (``held_out_seconds``, not in ``seconds``). Cost per epoch: one forward pass
over ``n_h`` samples, i.e. about ``n_h / (3 n)`` of a training epoch over ``n`` samples.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from fedlmc.data.augment import apply_augment, check_augment
from fedlmc.evaluation import resolve_device

Data = tuple[Tensor, Tensor]

OPTIMIZERS: tuple[str, ...] = ("sgd", "adam", "adamw")
SCHEDULES: tuple[str, ...] = ("onecycle", "cosine", "constant")
CHECK_EVERY = 32
"""Steps between two checks of the loss for NaN/inf (each check is one host-device sync)."""
HELD_OUT_BATCH = 1024
"""Samples per forward pass of the per-epoch held-out loss."""


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite."""


@dataclass
class TrainHistory:
    """Per-epoch mean training loss and accuracy (on the augmented training batches), wall-clock
    ``seconds`` of the whole run and the number of ``samples`` processed (all epochs); with
    held-out data, ``held_out_loss`` per epoch (module docstring; empty without) and the
    ``held_out_seconds`` it took (not part of ``seconds``)."""

    loss: list[float]
    accuracy: list[float]
    seconds: float
    samples: int
    held_out_loss: list[float] = field(default_factory=list)
    held_out_seconds: float = 0.0


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def needs_two_samples(model: nn.Module) -> bool:
    """True when ``model`` has a BatchNorm layer, which cannot train on a batch of one sample."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


def _check_arguments(
    data: Data,
    epochs: int,
    lr: float,
    weight_decay: float,
    batch_size: int,
    optimizer: str,
    momentum: float,
    schedule: str,
    augment: str | None,
) -> None:
    checks = [
        (_is_int(epochs) and epochs >= 1, f"epochs must be an integer >= 1, got {epochs!r}"),
        (_is_real(lr) and 0 < lr < math.inf, f"lr must be a finite number > 0, got {lr!r}"),
        (
            _is_real(weight_decay) and 0 <= weight_decay < math.inf,
            f"weight_decay must be a finite number >= 0, got {weight_decay!r}",
        ),
        (
            _is_int(batch_size) and batch_size >= 1,
            f"batch_size must be an integer >= 1, got {batch_size!r}",
        ),
        (optimizer in OPTIMIZERS, f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}"),
        (_is_real(momentum) and 0 <= momentum < 1, f"momentum must be in [0, 1), got {momentum!r}"),
        (schedule in SCHEDULES, f"schedule must be one of {SCHEDULES}, got {schedule!r}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    check_augment(augment)
    x, y = data
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(
            f"data must be (x, y) with the same non-zero length, got {len(x)} and {len(y)}"
        )


def make_optimizer(
    model: nn.Module, name: str, lr: float, weight_decay: float, momentum: float
) -> torch.optim.Optimizer:
    """SGD (heavy-ball ``momentum``, no Nesterov), Adam or AdamW with the optimiser's weight decay.

    ``momentum`` is used by SGD only; Adam/AdamW keep their default betas. The fused
    implementation is used where torch has one for the parameters' device and dtype."""
    classes = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    options: dict = {"lr": lr, "weight_decay": weight_decay}
    if name == "sgd":
        options["momentum"] = momentum
    params = list(model.parameters())
    try:  # one fused kernel per step (CPU and CUDA): ~3x cheaper than the per-tensor loop
        return classes[name](params, fused=True, **options)
    except (RuntimeError, TypeError, ValueError):  # device, dtype or torch version without it
        return classes[name](params, **options)


def make_schedule(
    optimizer: torch.optim.Optimizer, name: str, lr: float, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The per-batch learning-rate schedule ``name`` over ``total_steps`` (``None``: constant)."""
    if name == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=lr, total_steps=total_steps, cycle_momentum=False
        )
    if name == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    return None


def batch_slices(n: int, batch_size: int, drop_single: bool) -> list[slice]:
    """Slices of ``range(n)`` of length ``batch_size``; a last batch of one sample is dropped
    when ``drop_single`` (BatchNorm models), any other partial last batch is kept."""
    slices = [slice(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]
    if drop_single and len(slices) > 1 and slices[-1].stop - slices[-1].start < 2:
        slices.pop()
    return slices


def _raise_if_non_finite(losses: list[Tensor], start: int, epoch: int) -> None:
    """Check the batch losses ``losses[start:]`` (one host sync); raise on the first NaN/inf."""
    if start >= len(losses):
        return
    window = torch.stack(losses[start:])
    finite = torch.isfinite(window)
    if bool(finite.all()):
        return
    first = int((~finite).nonzero()[0, 0])
    raise NonFiniteLossError(
        f"non-finite training loss {float(window[first])} at epoch {epoch}, batch {start + first}"
    )


def _autocast(device: torch.device, amp: bool) -> contextlib.AbstractContextManager:
    if amp and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_model(
    model: nn.Module,
    data: Data,
    *,
    epochs: int,
    lr: float,
    weight_decay: float,
    batch_size: int,
    optimizer: str = "sgd",
    momentum: float = 0.9,
    schedule: str = "onecycle",
    seed: int = 0,
    device: str | torch.device | None = None,
    augment: str | None = None,
    amp: bool = False,
    progress: bool = False,
    held_out: Data | None = None,
) -> tuple[nn.Module, TrainHistory]:
    """Train ``model`` in place on ``data = (x, y)`` by mini-batch cross-entropy minimisation.

    Returns the same model object on the training device, in eval mode, with its
    :class:`TrainHistory`. Deterministic on the CPU for a given ``seed`` and initial weights.
    ``held_out``: data whose loss is measured after every epoch (module docstring).
    ``progress``: a tqdm bar over the epochs (elapsed time, time left, the last epoch's loss
    and accuracy; a notebook widget under Jupyter), gone when training ends.
    """
    _check_arguments(
        data, epochs, lr, weight_decay, batch_size, optimizer, momentum, schedule, augment
    )
    device = resolve_device(device)
    model.to(device).train()
    x = data[0].to(device, non_blocking=True)
    y = data[1].to(device, dtype=torch.long, non_blocking=True)
    batchnorm = needs_two_samples(model)
    if batchnorm and len(x) < 2:
        raise ValueError(f"a BatchNorm model needs at least 2 training samples, got {len(x)}")
    slices = batch_slices(len(x), batch_size, drop_single=batchnorm)
    samples_per_epoch = slices[-1].stop
    opt = make_optimizer(model, optimizer, lr, weight_decay, momentum)
    sched = make_schedule(opt, schedule, lr, epochs * len(slices))
    generator = torch.Generator(device=device).manual_seed(seed)
    history = TrainHistory(loss=[], accuracy=[], seconds=0.0, samples=0)
    start = time.perf_counter()
    bar = tqdm(range(epochs), desc="train", unit="epoch", disable=not progress, leave=False)
    for epoch in bar:
        loss, accuracy = _train_epoch(
            model, x, y, slices, opt, sched, generator, augment, _autocast(device, amp), epoch
        )
        history.loss.append(loss)
        history.accuracy.append(accuracy)
        history.samples += samples_per_epoch
        if held_out is not None:
            tick = time.perf_counter()
            history.held_out_loss.append(mean_loss(model, held_out, _autocast(device, amp)))
            history.held_out_seconds += time.perf_counter() - tick
        bar.set_postfix(loss=f"{loss:.4f}", acc=f"{accuracy:.3f}")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    history.seconds = time.perf_counter() - start - history.held_out_seconds
    return model.eval(), history


@torch.no_grad()
def mean_loss(
    model: nn.Module, data: Data, autocast: contextlib.AbstractContextManager | None = None
) -> float:
    """Mean cross-entropy of ``model`` (eval mode) on ``data``, in batches of
    :data:`HELD_OUT_BATCH`; the model's train/eval mode is restored afterwards."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    x, y = data
    total = torch.zeros((), dtype=torch.float64, device=device)
    with autocast or contextlib.nullcontext():
        for i in range(0, len(x), HELD_OUT_BATCH):
            xb = x[i : i + HELD_OUT_BATCH].to(device, non_blocking=True)
            yb = y[i : i + HELD_OUT_BATCH].to(device, dtype=torch.long, non_blocking=True)
            logits = model(xb).float()
            total += F.cross_entropy(logits, yb, reduction="sum").double()
    model.train(was_training)
    return float(total) / max(len(y), 1)


def _train_epoch(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    slices: list[slice],
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler | None,
    generator: torch.Generator,
    augment: str | None,
    autocast: contextlib.AbstractContextManager,
    epoch: int,
) -> tuple[float, float]:
    """One pass over a fresh permutation; returns (mean loss, accuracy) over the samples seen."""
    perm = torch.randperm(len(x), generator=generator, device=x.device)
    losses: list[Tensor] = []
    predictions: list[Tensor] = []
    for k, s in enumerate(slices):
        idx = perm[s]
        # index_select copies whole rows; x[idx] goes through the generic advanced-indexing kernel
        # and is several times slower on the CPU for image batches.
        xb = apply_augment(augment, x.index_select(0, idx), generator)
        with autocast:
            logits = model(xb)
        loss = F.cross_entropy(logits.float(), y.index_select(0, idx))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.detach())
        predictions.append(logits.detach().argmax(dim=1))
        if (k + 1) % CHECK_EVERY == 0:
            _raise_if_non_finite(losses, k + 1 - CHECK_EVERY, epoch)
    _raise_if_non_finite(losses, len(losses) - len(losses) % CHECK_EVERY, epoch)
    seen = slices[-1].stop
    sizes = torch.tensor([s.stop - s.start for s in slices], device=x.device)
    loss_sum = (torch.stack(losses) * sizes).sum()
    correct = torch.cat(predictions).eq(y.index_select(0, perm[:seen])).sum()
    return float(loss_sum) / seen, float(correct) / seen
