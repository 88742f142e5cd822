r"""A width-scalable Vision Transformer (Dosovitskiy et al. 2021), small enough for a CPU.

The image is cut into ``patch x patch`` patches (a ``Conv2d`` with kernel and stride ``patch``:
7 on 28x28 digits gives 16 patches), a learned class token is prepended and a learned position
embedding added; ``depth`` pre-norm blocks follow,

.. math::
    h \leftarrow h + \operatorname{MHA}(\operatorname{LN}_1(h)), \qquad
    h \leftarrow h + W_2\,\operatorname{GELU}(W_1 \operatorname{LN}_2(h)),

then a final LayerNorm and a linear head on the class token. Attention has explicit ``q``,
``k``, ``v`` and ``out`` projections (four ``nn.Linear``; ``nn.MultiheadAttention`` packs q, k and
v into one ``in_proj_weight``, whose rows a permutation spec would have to address in three
segments), and head :math:`h` computes
:math:`\operatorname{softmax}(Q_h K_h^\top / \sqrt{d})\, V_h` with
``F.scaled_dot_product_attention``.

**Width.** The embedding dimension is ``heads x head_dim`` and the MLP hidden size
``mlp_ratio`` times it. With ``grow_heads=True`` (the default, the rule of the ViT family:
ViT-Ti/S/B keep 64 dims per head and grow the head count) width scales the head count,
``scaled(heads, width)`` heads of ``head_dim`` dims; with ``grow_heads=False`` the head count
stays ``heads`` and width scales the head dimension, ``scaled(head_dim, width)``. Defaults:
4 heads of 8 dims (embedding 32, MLP 64) at width 1.

**Symmetries** (:meth:`ViT.permutation_spec`, :mod:`fedlmc.permutation.blocks`): one
permutation of the residual stream shared by the patch embedding, the class token, the
position embedding, every block's q/k/v inputs and out/fc2 outputs, every LayerNorm's affine
parameters and the head's inputs (a LayerNorm's mean and variance over the features do not
depend on their order, so it commutes with the permutation exactly); per block the MLP's
hidden units; and per block the heads, as whole heads, with the q/k dimensions of each head
permuted jointly (:math:`Q_h K_h^\top` is unchanged) and its v dimensions with the out
projection's columns. ``norm="none"`` replaces every LayerNorm by an identity.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlmc.models.sizes import vit_layout
from fedlmc.permutation.blocks import Blocks
from fedlmc.permutation.spec import Axis, PermutationSpec, fan_in_axes, spec_from_groups, unit_axes

__all__ = ["Attention", "TransformerBlock", "ViT"]

TOKEN_DIM = -1
"""The axis of a token tensor ``(N, T, D)`` that carries the units (activation matching)."""


def layer_norm(norm: str, dim: int) -> nn.Module:
    """``ln``: ``nn.LayerNorm(dim)``; ``none``: ``nn.Identity()``."""
    return nn.LayerNorm(dim) if norm == "ln" else nn.Identity()


class Attention(nn.Module):
    """Multi-head self-attention with explicit q, k, v and out projections."""

    def __init__(self, dim: int, heads: int, head_dim: int, bias: bool) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        self.q = nn.Linear(dim, inner, bias=bias)
        self.k = nn.Linear(dim, inner, bias=bias)
        self.v = nn.Linear(dim, inner, bias=bias)
        self.out = nn.Linear(inner, dim, bias=bias)

    def _split(self, x: Tensor) -> Tensor:
        """``(N, T, H * d)`` -> ``(N, H, T, d)``."""
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        mixed = F.scaled_dot_product_attention(q, k, v)  # (N, H, T, d)
        return self.out(mixed.transpose(1, 2).flatten(2))


class TransformerBlock(nn.Module):
    """A pre-norm block: ``h + attn(norm1(h))``, then ``h + fc2(act(fc1(norm2(h))))``; its
    output passes through ``out`` (an identity) so that a hook sees the block's output."""

    def __init__(
        self, dim: int, heads: int, head_dim: int, hidden: int, norm: str, bias: bool
    ) -> None:
        super().__init__()
        self.norm1 = layer_norm(norm, dim)
        self.attn = Attention(dim, heads, head_dim, bias)
        self.norm2 = layer_norm(norm, dim)
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim, bias=bias)
        self.out = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return self.out(x + self.fc2(self.act(self.fc1(self.norm2(x)))))


class ViT(nn.Module):
    """Patch embedding, class token, position embedding, ``depth`` pre-norm blocks, final
    LayerNorm, linear head on the class token (the module docstring has the widths)."""

    unit_dim = TOKEN_DIM
    """The axis of a layer output (``layer_names``: the blocks' outputs) that carries the units."""

    def __init__(
        self,
        width: float,
        num_classes: int,
        in_shape: tuple[int, int, int],
        norm: str,
        *,
        depth: int,
        heads: int,
        head_dim: int,
        grow_heads: bool,
        mlp_ratio: int,
        patch: int,
        bias: bool,
    ) -> None:
        super().__init__()
        layout = vit_layout(width, in_shape, heads, head_dim, grow_heads, mlp_ratio, patch)
        self.heads, self.head_dim, dim = layout.heads, layout.head_dim, layout.dim
        self.patch_embed = nn.Conv2d(in_shape[0], dim, patch, stride=patch, bias=bias)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, layout.tokens, dim))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.blocks = nn.ModuleList(
            TransformerBlock(dim, layout.heads, layout.head_dim, layout.hidden, norm, bias)
            for _ in range(depth)
        )
        self.norm = layer_norm(norm, dim)
        self.classifier = nn.Linear(dim, num_classes, bias=bias)
        self.layer_names = [f"blocks.{i}.out" for i in range(depth)] + ["classifier"]

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        h = torch.cat([cls, tokens], dim=1) + self.pos_embed
        for block in self.blocks:
            h = block(h)
        return self.classifier(self.norm(h)[:, 0])

    def permutation_spec(self) -> PermutationSpec:
        """The residual stream ``stream``, and per block ``blocks.i.mlp`` (the MLP's hidden
        units) and ``blocks.i.attn.qk`` / ``blocks.i.attn.vo`` (the heads' q/k and v/out
        dimensions), the last two block-structured: whole heads move together, one head
        permutation per block shared by both (:class:`~fedlmc.permutation.blocks.Blocks`)."""
        groups, activations = self._stream_and_mlp_groups()
        blocks: dict[str, Blocks] = {}
        for i, block in enumerate(self.blocks):
            prefix = f"blocks.{i}.attn"
            attn = block.attn
            groups[f"{prefix}.qk"] = unit_axes(f"{prefix}.q", attn.q) + unit_axes(
                f"{prefix}.k", attn.k
            )
            groups[f"{prefix}.vo"] = unit_axes(f"{prefix}.v", attn.v) + fan_in_axes(f"{prefix}.out")
            activations[f"{prefix}.qk"] = f"{prefix}.q"
            activations[f"{prefix}.vo"] = f"{prefix}.v"
            for member in ("qk", "vo"):
                blocks[f"{prefix}.{member}"] = Blocks(f"{prefix}.heads", self.head_dim)
        return spec_from_groups(
            groups,
            activations,
            self.state_dict(),
            blocks=blocks,
            activation_dims=dict.fromkeys(groups, TOKEN_DIM),
        )

    def _stream_and_mlp_groups(self) -> tuple[dict[str, list[Axis]], dict[str, str]]:
        """The residual stream's axes and each block's MLP group, with their activations."""
        stream: list[Axis] = unit_axes("patch_embed", self.patch_embed)
        stream += [("cls_token", 2), ("pos_embed", 2)]
        groups: dict[str, list[Axis]] = {"stream": stream}
        activations = {"stream": f"blocks.{len(self.blocks) - 1}.out"}
        for i, block in enumerate(self.blocks):
            prefix = f"blocks.{i}"
            stream += unit_axes(f"{prefix}.norm1", block.norm1)
            stream += [axis for name in "qkv" for axis in fan_in_axes(f"{prefix}.attn.{name}")]
            stream += unit_axes(f"{prefix}.attn.out", block.attn.out)
            stream += unit_axes(f"{prefix}.norm2", block.norm2)
            stream += fan_in_axes(f"{prefix}.fc1") + unit_axes(f"{prefix}.fc2", block.fc2)
            groups[f"{prefix}.mlp"] = unit_axes(f"{prefix}.fc1", block.fc1) + fan_in_axes(
                f"{prefix}.fc2"
            )
            activations[f"{prefix}.mlp"] = f"{prefix}.act"
        stream += unit_axes("norm", self.norm) + fan_in_axes("classifier")
        return groups, activations
