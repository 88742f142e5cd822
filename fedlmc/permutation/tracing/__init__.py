r"""Derive a :class:`~fedlmc.permutation.PermutationSpec` and LEWC layer names from a model's graph.

The model is traced with ``torch.fx`` symbolic tracing and run once on an example input (eval
mode, no gradient) to learn every tensor's shape. Every axis of every tensor in the graph, and
every axis of every state-dict tensor, is an element of a union-find: two axes are joined when
the same hidden-unit permutation must act on both.

- *Producers* start a new set of units: Linear (output features), Conv (output channels),
  ConvTranspose, Embedding (embedding dimension); their output axis is joined with the weight's
  axis 0 (ConvTranspose: 1) and the bias. Their input axis is joined with the weight's axis 1
  (the *consumer* side).
- *Norms* carry the units and join their per-unit tensors (affine parameters, running
  statistics): BatchNorm, InstanceNorm, LayerNorm/RMSNorm over trailing axes, GroupNorm with one
  group or one group per channel. GroupNorm with ``1 < G < C`` groups computes statistics over
  blocks of channels, which a permutation does not preserve: the group ends there.
- Pointwise activations, dropout, identity, softmax over any axis, pooling, padding and
  upsampling (spatial axes only), reductions, permutes/transposes pass the units through.
  Broadcasting elementwise operations (``+``, ``*``, ``torch.where`` ...) join the axes of their
  operands, so a residual addition ties its two streams into one group.
- Reshapes pass an axis through when it maps onto one axis of the result (flatten of a map
  pooled to ``C x 1 x 1``). A reshape that merges a hidden axis with other axes of size > 1
  (flatten of a ``C x H x W`` map onto a Linear, where each channel owns ``H*W`` consecutive
  inputs) cannot be expressed by one permutation of the next layer's full input axis: the group
  ends there.
- Concatenation along a hidden axis would give the consumer an input axis made of segments,
  one permutation per segment; the spec format maps an axis to one group, so the concatenated
  groups end there. Concatenation along other axes joins the operands' other axes.
- Depthwise convolutions (``groups == in == out channels``) carry the units; other grouped
  convolutions end the group.
- Anything else (attention, matmul, unknown torch.nn modules, unknown functions or methods,
  indexing part of an axis) ends the groups of every tensor it touches, and its output axes are
  not permuted. The model's inputs and outputs are never permuted.

"Ending" a group drops every axis of its union-find class from the spec: the producers' units
are then not permuted at all, which is always correct (only less alignment). A
:class:`SpecDerivationWarning` names the producers and the reason when a hidden group is dropped
for any reason other than touching the model's input or output.

The derived spec is then checked: one seeded random permutation per group must leave the
model's outputs on the example input unchanged (:func:`fedlmc.permutation.check_spec`).

The code, by concern:

- :mod:`~fedlmc.permutation.tracing.axes`: the union-find of axes
  (:class:`~fedlmc.permutation.tracing.axes.AxisClasses`),
  :class:`~fedlmc.permutation.tracing.axes.TensorAxes`, :class:`SpecDerivationWarning`.
- :mod:`~fedlmc.permutation.tracing.operations`: the tables of supported modules, functions and
  tensor methods, and the handler kind of each.
- :mod:`~fedlmc.permutation.tracing.recording`: the ``torch.fx`` trace, the run that records
  every node's output, and :class:`~fedlmc.permutation.tracing.recording.ModuleOutputs` (which
  module returns a node's output).
- :mod:`~fedlmc.permutation.tracing.walk`: :class:`~fedlmc.permutation.tracing.walk.GraphWalk`, the
  walk over the graph's nodes (state, dispatch by node kind, inputs, outputs, unknown operations).
- :mod:`~fedlmc.permutation.tracing.shape_rules`: the rules of the operations that move, pool,
  reshape or join axes (activations, broadcasting, reshapes, permutes, reductions, cat ...).
- :mod:`~fedlmc.permutation.tracing.layer_rules`: the rules of the layers (Linear, Conv,
  Embedding) and norms (BatchNorm, LayerNorm, GroupNorm, PReLU ...).
- :mod:`~fedlmc.permutation.tracing.derive`: :func:`derive_spec` and :func:`derive_layer_names`.
"""

from fedlmc.permutation.tracing.axes import SpecDerivationWarning
from fedlmc.permutation.tracing.derive import derive_layer_names, derive_spec

# Re-exported for the tests, which patch the function table and check the reshape matcher.
from fedlmc.permutation.tracing.operations import FUNCTION_KINDS as FUNCTION_KINDS
from fedlmc.permutation.tracing.shape_rules import _reshape_runs as _reshape_runs

__all__ = ["SpecDerivationWarning", "derive_layer_names", "derive_spec"]
