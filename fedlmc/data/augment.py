"""Batched data augmentation as tensor operations on whole batches (no per-sample Python loop).

``crop_flip`` is the standard CIFAR augmentation: zero-pad each image by ``p`` pixels on every
side, cut a random ``H x W`` window at offset ``(dy, dx)`` with ``dy, dx`` uniform in
``{0, ..., 2p}``, then mirror it horizontally with probability 1/2. For sample ``b``:

.. math:: \\mathrm{out}[b, c, i, j] = \\mathrm{pad}(x)[b, c, dy_b + i, dx_b + j'], \\quad
          j' = W - 1 - j \\text{ if flipped else } j

so crop and flip are a single ``torch.gather`` from the padded batch (flattened over pixels;
about 3x faster on the CPU than the equivalent four-tensor advanced indexing). Randomness comes
only from the ``torch.Generator`` passed in, so a seeded generator gives the same augmented batch
every time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

AUGMENTATIONS: tuple[str, ...] = ("crop_flip",)


def check_augment(name: str | None) -> None:
    """Raise ``ValueError`` unless ``name`` is ``None`` or one of :data:`AUGMENTATIONS`."""
    if name is not None and name not in AUGMENTATIONS:
        raise ValueError(f"augment must be None or one of {AUGMENTATIONS}, got {name!r}")


def crop_flip_at(x: Tensor, dy: Tensor, dx: Tensor, flip: Tensor, padding: int = 4) -> Tensor:
    """Crop ``x`` (B, C, H, W) zero-padded by ``padding`` at per-sample offsets ``dy``, ``dx`` (B,)
    in ``[0, 2 * padding]`` and mirror horizontally the samples where ``flip`` (B,) is true."""
    if x.dim() != 4:
        raise ValueError(f"crop_flip needs a (B, C, H, W) batch, got shape {tuple(x.shape)}")
    b, c, h, w = x.shape
    padded_w = w + 2 * padding
    padded = F.pad(x, (padding, padding, padding, padding)).flatten(2)  # (B, C, H'W')
    device = x.device
    i = torch.arange(h, device=device)
    j = torch.arange(w, device=device)
    rows = dy.to(device)[:, None] + i  # (B, H)
    cols = dx.to(device)[:, None] + torch.where(flip.to(device)[:, None], (w - 1) - j, j)  # (B, W)
    flat = (rows[:, :, None] * padded_w + cols[:, None, :]).reshape(b, 1, h * w)
    # one gather along the flattened pixels, shared by all channels
    return padded.gather(2, flat.expand(b, c, h * w)).view(b, c, h, w)


def crop_flip(x: Tensor, generator: torch.Generator | None = None, padding: int = 4) -> Tensor:
    """Random ``padding``-pixel zero-padded crop and random horizontal flip of every image in ``x``.

    ``generator`` must live on ``x.device`` (``None`` uses the global generator).
    """
    n = x.shape[0]
    offsets = torch.randint(0, 2 * padding + 1, (2, n), generator=generator, device=x.device)
    flip = torch.randint(0, 2, (n,), generator=generator, device=x.device).bool()
    return crop_flip_at(x, offsets[0], offsets[1], flip, padding)


def apply_augment(name: str | None, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Apply the augmentation called ``name`` to the batch ``x`` (``None``: return ``x``)."""
    check_augment(name)
    if name is None:
        return x
    return crop_flip(x, generator)
