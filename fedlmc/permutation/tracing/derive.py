"""From a walked graph to results: the spec's groups and the module carrying each group's units
(:func:`derive_spec`), and the cut nodes that give LEWC's layer outputs
(:func:`derive_layer_names`)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, fx, nn

from fedlmc.permutation.spec import (
    Axis,
    PermutationSpec,
    check_spec,
    example_args,
    in_eval_mode,
    spec_from_groups,
)
from fedlmc.permutation.tracing.axes import SpecDerivationWarning, TensorAxes
from fedlmc.permutation.tracing.operations import LAYER_KINDS, SHAPE_ONLY_KINDS
from fedlmc.permutation.tracing.recording import ModuleOutputs, _Recorder, trace
from fedlmc.permutation.tracing.walk import GraphWalk


@dataclass
class Analysis:
    """A traced model: graph, node outputs on the example input, union-find, module outputs."""

    model: nn.Module
    gm: fx.GraphModule
    values: dict[fx.Node, Any]
    walk: GraphWalk
    outputs: ModuleOutputs


def analyse(model: nn.Module, example_input: Tensor | tuple[Tensor, ...]) -> Analysis:
    """Trace ``model``, run the graph on ``example_input`` (eval mode, no grad) and walk it."""
    args = example_args(example_input)
    with in_eval_mode(model), torch.no_grad():
        gm = trace(model)
        recorder = _Recorder(gm)
        recorder.run(*args)
        walk = GraphWalk(model, gm, recorder.values)
        outputs = ModuleOutputs(model, args)
    return Analysis(model, gm, recorder.values, walk, outputs)


def derived_groups(
    walk: GraphWalk, declared: frozenset[Axis] = frozenset()
) -> tuple[dict[str, list[Axis]], dict[str, int]]:
    """Group name -> ``(key, axis)`` pairs, and group name -> union-find root.

    A class becomes a group when it holds at least one state-dict axis of size > 1, touches
    the data flow (an activation axis) and is not poisoned. A group is named after its first
    producer (the module whose output units it permutes). Poisoned classes holding a producer's
    units give a :class:`SpecDerivationWarning` unless every reason is expected (input/output)
    or every state-dict axis of the class is in ``declared`` (a group the caller declares).
    """
    classes = walk.classes
    slot_of = {element: key_axis for key_axis, element in walk.slots.items()}
    groups: dict[str, list[Axis]] = {}
    roots: dict[str, int] = {}
    for root, members in classes.classes().items():
        slots = [slot_of[e] for e in members if e in slot_of]
        units = list(dict.fromkeys(classes.unit[e] for e in members if e in classes.unit))
        active = any(classes.activation[e] for e in members)
        if not slots or not active or classes.size[root] < 2:
            continue
        reasons = [reason for e in members for reason in classes.reasons.get(e, [])]
        if reasons:
            loud = list(dict.fromkeys(text for text, is_loud in reasons if is_loud))
            if loud and units and not set(slots) <= declared:
                more = f" (and {len(loud) - 1} more reasons)" if len(loud) > 1 else ""
                warnings.warn(
                    f"derive_spec: the units of {', '.join(units[:3])} are not permuted "
                    f"(their group is dropped): {loud[0]}{more}",
                    SpecDerivationWarning,
                    stacklevel=3,
                )
            continue
        name = units[0] if units else slots[0][0]
        suffix = 1
        while name in groups:
            suffix += 1
            name = f"{units[0] if units else slots[0][0]}#{suffix}"
        groups[name] = [(alias, axis) for key, axis in slots for alias in walk.aliases[key]]
        roots[name] = root
    return groups, roots


def activation_modules(analysis: Analysis, roots: dict[str, int]) -> dict[str, str]:
    """Group -> a module whose output carries the group's units on dim 1.

    Among the graph nodes whose axis 1 is in the group and that a module's output matches
    (:class:`ModuleOutputs`), the last activation function (ReLU etc.) in graph order is
    preferred, else the last such node of any kind (a norm, a pooling, the producer itself).
    Groups whose units never sit on dim 1 of a module's output (e.g. features on the last axis
    of a ``(N, T, D)`` tensor) get no entry.
    """
    walk = analysis.walk
    wanted = {root: name for name, root in roots.items()}
    best: dict[str, tuple[bool, int, str]] = {}
    for position, node in enumerate(analysis.gm.graph.nodes):
        out = walk.out[node]
        if not isinstance(out, TensorAxes) or out.ndim < 2 or walk.kind[node] in ("param",):
            continue
        group = wanted.get(walk.classes.find(out.elems[1]))
        if group is None:
            continue
        module = analysis.outputs.name_of(node, analysis.values.get(node))
        if module is not None:
            rank = (walk.kind[node] == "activation", position, module)
            best[group] = max(best.get(group, rank), rank)
    return {group: best[group][2] for group in roots if group in best}


def derive_spec(
    model: nn.Module,
    example_input: Tensor | tuple[Tensor, ...],
    *,
    seed: int = 0,
    declared: PermutationSpec | None = None,
) -> PermutationSpec:
    """The permutation spec of ``model``, derived from its ``torch.fx`` graph and checked.

    ``example_input`` is one input batch (a tensor, or a tuple of the forward's positional
    arguments); use random values and a batch of 2 or more, so that no axis of the example
    has size 1 by accident. Groups are named after their first producer module (e.g.
    ``"layer1.0.conv1"``). ``declared``: groups the caller writes for what the derivation
    cannot follow (attention heads: :mod:`fedlmc.permutation.blocks`), added to the derived
    ones with their activation modules and block structure; the units they cover are dropped
    by the derivation without a warning, and a name or an axis both claim is a ``ValueError``.
    Before returning, one seeded random permutation per group is applied and the outputs on
    ``example_input`` must be unchanged (:func:`check_spec`).

    ``ValueError`` when the model cannot be traced or run (naming the module or node), or when
    the check fails (naming the group). Groups the derivation cannot permute safely are dropped
    with a :class:`SpecDerivationWarning` (see :mod:`fedlmc.permutation.tracing` for the rules).
    """
    analysis = analyse(model, example_input)
    declared = declared or PermutationSpec({}, {}, {})
    covered = frozenset(axis for axes in declared.perm_to_axes.values() for axis in axes)
    groups, roots = derived_groups(analysis.walk, covered)
    modules = activation_modules(analysis, roots)
    twice = sorted(set(groups) & set(declared.perm_to_axes))
    if twice:
        raise ValueError(f"declared group {twice[0]!r} is also a derived group's name")
    spec = spec_from_groups(
        {**groups, **declared.perm_to_axes},
        {**modules, **declared.activation_modules},
        model.state_dict(),
        blocks=declared.blocks,
        activation_dims=declared.activation_dims,
    )
    try:
        check_spec(model, spec, example_input, seed=seed)
    except ValueError as exc:
        raise ValueError(
            f"derive_spec built a wrong spec for {type(model).__name__} ({exc}); an operation "
            "on those units is not understood: write a permutation_spec() method"
        ) from exc
    return spec


# ----------------------------------------------------------------------------- layer names


def _data_edges(analysis: Analysis) -> list[tuple[fx.Node, fx.Node]]:
    """Edges that carry tensors between computing nodes (no parameters, no shape metadata)."""
    walk = analysis.walk
    edges = []
    for node in analysis.gm.graph.nodes:
        if node.op != "output" and walk.out[node] is None:
            continue
        for source in node.all_input_nodes:
            if walk.kind[source] not in ("param", "meta") and walk.out[source] is not None:
                edges.append((source, node))
    return edges


def _reachable(start: set[fx.Node], edges: dict[fx.Node, list[fx.Node]]) -> set[fx.Node]:
    seen, stack = set(start), list(start)
    while stack:
        for nxt in edges.get(stack.pop(), []):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def main_path(analysis: Analysis) -> set[fx.Node]:
    """Nodes on some data path from an input to the output (the output node excluded)."""
    nodes = list(analysis.gm.graph.nodes)
    forward: dict[fx.Node, list[fx.Node]] = {}
    backward: dict[fx.Node, list[fx.Node]] = {}
    for a, b in _data_edges(analysis):
        forward.setdefault(a, []).append(b)
        backward.setdefault(b, []).append(a)
    inputs = {node for node in nodes if node.op == "placeholder"}
    outputs = {node for node in nodes if node.op == "output"}
    return (_reachable(inputs, forward) & _reachable(outputs, backward)) - outputs


def cut_nodes(analysis: Analysis, main: set[fx.Node]) -> list[fx.Node]:
    """Nodes of ``main`` that every input-to-output path passes through, in graph order.

    The graph's node list is a topological order, so a node on the main path is a cut exactly
    when no data edge between main-path nodes jumps over it. Inside a residual block the
    shortcut edge jumps over the branch, so only the block's output (the addition and what
    follows it) is a cut.
    """
    nodes = list(analysis.gm.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    cover = [0] * (len(nodes) + 1)
    for a, b in _data_edges(analysis):
        if a in main and (b in main or b.op == "output"):
            cover[position[a] + 1] += 1
            cover[position[b]] -= 1
    running, cuts = 0, []
    for i, node in enumerate(nodes):
        running += cover[i]
        if node in main and running == 0:
            cuts.append(node)
    return cuts


def _layer_outputs(analysis: Analysis) -> list[fx.Node]:
    """For each layer after the first: the last cut before it, skipping pools and reshapes."""
    kind = analysis.walk.kind
    nodes = list(analysis.gm.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    main = main_path(analysis)
    cuts = cut_nodes(analysis, main)
    layers = [node for node in nodes if node in main and kind[node] in LAYER_KINDS]
    if not layers:
        raise ValueError("derive_layer_names found no Linear/Conv layer between input and output")
    first = position[layers[0]]
    selected: dict[fx.Node, None] = {}
    for layer in layers:
        before = [i for i, cut in enumerate(cuts) if position[cut] < position[layer]]
        if not before or position[cuts[before[-1]]] < first:
            continue
        i = before[-1]
        while kind[cuts[i]] in SHAPE_ONLY_KINDS and i > 0 and position[cuts[i - 1]] >= first:
            i -= 1
        selected[cuts[i]] = None
    return list(selected)


def derive_layer_names(model: nn.Module, example_input: Tensor | tuple[Tensor, ...]) -> list[str]:
    """Names of the modules whose outputs are the layer outputs ``f_1..f_L`` used by LEWC.

    Derived from the graph: the *cut* nodes (every input-to-output path passes through them)
    split the network into layers; for each Linear/Conv layer after the first, the last cut
    before it is the previous layer's output, skipping pooling, flatten and dropout back to
    the activation (a plain network: each hidden ReLU; a residual network: each block's output
    after the addition and its ReLU, not the ReLU inside the block). The last name is the
    module whose output is the model's output (the logits). A hidden output that no module
    called once returns (see :class:`ModuleOutputs`) is skipped with a warning.

    ``ValueError`` if the model cannot be traced or run, has no layer, or its output is not
    one tensor returned by a module.
    """
    analysis = analyse(model, example_input)
    output = next(node for node in analysis.gm.graph.nodes if node.op == "output")
    logits = output.args[0]
    if not isinstance(logits, fx.Node) or not isinstance(analysis.values.get(logits), Tensor):
        raise ValueError(
            f"the output of {type(model).__name__} is not one tensor; LEWC layer names need a "
            "model that returns its logits"
        )
    names = []
    for node in _layer_outputs(analysis):
        name = analysis.outputs.name_of(node, analysis.values[node])
        if name is None:
            warnings.warn(
                f"derive_layer_names: the layer output at node {node.name!r} is not the output "
                "of a module that runs once per forward; it is left out",
                SpecDerivationWarning,
                stacklevel=2,
            )
        elif name not in names:
            names.append(name)
    last = analysis.outputs.name_of(logits, analysis.values[logits])
    if last is None:
        raise ValueError(
            f"the output of {type(model).__name__} (node {logits.name!r}) is not the output of "
            "a module that runs once per forward; LEWC needs the module that returns the logits"
        )
    return names + [last] if last not in names else names
