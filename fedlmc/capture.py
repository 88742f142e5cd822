r"""Forward capture: hooks on named modules, batches without gradients, modes put back exactly.

Every measurement of a model's inner activations (the LEWC diagnostics, activation matching,
REPAIR's unit statistics, BatchNorm's input moments) is the same loop: register forward hooks
(or pre-hooks) on some named modules, run batches of inputs without gradients in eval or train
mode, remove the hooks, and put the model back as it was. :func:`forward_capture` is that loop's
frame, written once::

    with forward_capture(model, {"fc1": hook}, kind="output") as forward:
        for start in range(0, len(x), batch_size):
            forward(x[start : start + batch_size])

- ``hooks`` maps module names (``named_modules``) to hooks: ``hook(module, inputs, output)``
  for ``kind="output"`` (forward hooks), ``hook(module, inputs)`` for ``kind="input"`` (forward
  pre-hooks, which see a module's input).
- ``forward(batch)`` moves the batch to the model's device, runs the model under
  ``torch.no_grad()`` and returns its output; a hook may raise :class:`StopForward` to end the
  pass early (every module of interest has fired), and ``forward`` then returns ``None``.
- The whole model is in train mode (``training=True``) or eval mode inside the block. On exit,
  normal or by an exception, every hook is removed and *each* submodule gets back its own
  previous ``training`` flag (:func:`training_mode`), so a model with some submodules in train
  and others in eval mode (e.g. frozen BatchNorm layers) comes back exactly as it was.
  ``model.train(was_training)`` would not: it sets every submodule to the top-level flag.

Buffers the forward pass changes (BatchNorm's running statistics in train mode) are the
caller's to restore (:func:`fedlmc.merging.calibrate.bn_statistics` does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

import torch
from torch import Tensor, nn

from fedlmc.evaluation import model_device

HookKind = Literal["output", "input"]
"""``output``: forward hooks ``hook(module, inputs, output)``; ``input``: forward pre-hooks
``hook(module, inputs)``."""
Hook = Callable[..., Any]
Forward = Callable[[Tensor], Tensor | None]

__all__ = ["StopForward", "forward_capture", "linear_layers", "training_mode"]


class StopForward(Exception):
    """Raised by a hook to end the current forward pass (the rest of the model is not needed)."""


def linear_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Linear and Conv1d/2d/3d modules of ``model`` in ``named_modules`` order."""
    kinds = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    return {n: m for n, m in model.named_modules() if isinstance(m, kinds)}


@contextmanager
def training_mode(model: nn.Module, training: bool) -> Iterator[nn.Module]:
    """``model.train(training)`` inside the block; on exit (exceptions included) every submodule
    gets back its own previous ``training`` flag."""
    saved = [(module, module.training) for module in model.modules()]
    try:
        model.train(training)
        yield model
    finally:
        for module, flag in saved:
            module.training = flag


def _register(module: nn.Module, hook: Hook, kind: HookKind):
    if kind == "output":
        return module.register_forward_hook(hook)
    return module.register_forward_pre_hook(hook)


@contextmanager
def forward_capture(
    model: nn.Module,
    hooks: Mapping[str, Hook],
    *,
    kind: HookKind = "output",
    training: bool = False,
) -> Iterator[Forward]:
    """Hooks on the named modules of ``model`` and a ``forward(batch)`` that runs it without
    gradients in train (``training=True``) or eval mode; see the module docstring.

    ``ValueError`` naming a module of ``hooks`` that ``model`` does not have, or a bad ``kind``.
    """
    if kind not in ("output", "input"):
        raise ValueError(f"kind must be 'output' or 'input', got {kind!r}")
    modules = dict(model.named_modules())
    missing = [name for name in hooks if name not in modules]
    if missing:
        raise ValueError(f"module {missing[0]!r} not found in the model")
    handles = []
    try:
        for name, hook in hooks.items():
            handles.append(_register(modules[name], hook, kind))
        device = model_device(model)

        def forward(batch: Tensor) -> Tensor | None:
            try:
                with torch.no_grad():
                    return model(batch.to(device))
            except StopForward:
                return None

        with training_mode(model, training):
            yield forward
    finally:
        for handle in handles:
            handle.remove()
