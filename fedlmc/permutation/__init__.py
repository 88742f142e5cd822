r"""Hidden-unit permutations of networks (the symmetry Git Re-Basin aligns).

A ReLU network computes the same function after its hidden units are reordered, provided every
tensor that touches those units is reordered consistently. A :class:`PermutationSpec` lists, for
each permutation group ``p`` (one set of interchangeable hidden units), the ``(key, axis)`` pairs
of the state dict that carry those units. Applying permutations ``{p: \pi_p}`` means

.. math:: W'[\ldots, i, \ldots] = W[\ldots, \pi_p(i), \ldots]

on every listed axis, i.e. ``W.index_select(axis, perm)``: new unit ``i`` is old unit ``perm[i]``.
For a dense layer ``h = relu(W_1 x + b_1)``, ``y = W_2 h`` this is ``W_1' = P W_1``,
``b_1' = P b_1``, ``W_2' = W_2 P^T`` and ``y`` is unchanged. Input and output axes are never
permuted. Keys without a permuted axis (``num_batches_tracked``, the classifier bias) are copied.

Each built-in model has a hand-written ``permutation_spec()`` method that walks its own
submodules with :func:`unit_axes` / :func:`fan_in_axes`. For any other model,
:func:`derive_spec` derives the spec from the model's ``torch.fx`` graph
(:mod:`fedlmc.permutation.tracing`), and :func:`check_spec` checks that a spec is a symmetry:
permuting every group leaves the model's outputs unchanged.

The package's modules:

- :mod:`fedlmc.permutation.spec`: :class:`PermutationSpec`, applying and checking it.
- :mod:`fedlmc.permutation.blocks`: block-structured groups (attention heads moved whole) and
  their exact joint assignment.
- :mod:`fedlmc.permutation.model_spec`: :func:`permutation_spec` of a model, own or derived.
- :mod:`fedlmc.permutation.tracing`: the derivation from a ``torch.fx`` graph.
- :mod:`fedlmc.permutation.matching`: weight matching, activation matching, MergeMany.
- :mod:`fedlmc.permutation.objective`: the weight-matching objective, its result type, checks.
- :mod:`fedlmc.permutation.coordinate_descent`: the optimised weight matching, its forward start.
- :mod:`fedlmc.permutation.cost_matrices`: its cost matrices, kept up to date incrementally.
- :mod:`fedlmc.permutation.reference_matching`: the textbook weight matching (Git Re-Basin's
  Algorithm 1, readable; the baseline of the tests and the benchmark).
- :mod:`fedlmc.permutation.assignment`: the warm-started linear-assignment solver.
- :mod:`fedlmc.permutation.chain`: the plain chain of a spec, where LEWC's depths are defined.
- :mod:`fedlmc.permutation.embed`: a narrow model embedded into a wider one, and sliced back.
"""

from fedlmc._lazy import lazy_exports

_EXPORTS = {
    "activation_matching": ".matching",
    "align_to_reference": ".matching",
    "apply_permutation": ".spec",
    "Axis": ".spec",
    "check_spec": ".spec",
    "checked_permutations": ".spec",
    "derive_layer_names": ".model_spec",
    "derive_spec": ".model_spec",
    "embed_state": ".embed",
    "EmbeddedState": ".embed",
    "example_args": ".spec",
    "fan_in_axes": ".spec",
    "identity_permutations": ".spec",
    "in_eval_mode": ".spec",
    "invert_permutation": ".spec",
    "merge_many": ".matching",
    "perm_sizes": ".spec",
    "permutation_spec": ".model_spec",
    "PermutationSpec": ".spec",
    "random_permutations": ".spec",
    "reference_permutations": ".matching",
    "reference_weight_matching": ".reference_matching",
    "restrict_spec": ".spec",
    "slice_state": ".embed",
    "spec_from_groups": ".spec",
    "SpecDerivationWarning": ".tracing",
    "StateDict": ".spec",
    "unit_axes": ".spec",
    "weight_matching": ".matching",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
