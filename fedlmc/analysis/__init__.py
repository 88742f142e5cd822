"""Analysis: interpolation paths and barriers, and the LEWC / LLFC mechanism diagnostics.

- :mod:`fedlmc.analysis.paths`: :func:`interpolation_curve`, :func:`barriers`, :func:`merge_gap`.
- :mod:`fedlmc.analysis.diagnostics`: layerwise predictions of LEWC and LLFC and the sufficient
  conditions (reciprocal orthogonality, ReLU additivity, stable ranks, dead units, bias shares),
  and the checks that a high cosine is input-specific (centred and shuffled-input cosines, the
  common-mode share).
- :mod:`fedlmc.analysis.cosines`: the cosines of a layer's output with a prediction (raw, centred,
  at shuffled inputs) and its common-mode share.
- :mod:`fedlmc.analysis.shared_forwards`: a study's forward passes shared between its
  measurements (each distinct model evaluated once per input set).
- :mod:`fedlmc.analysis.spectral`: the largest singular value without a full SVD.
"""

from fedlmc._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["interpolation_curve", "barriers", "merge_gap", "lambda_grid"], ".paths"),
    **dict.fromkeys(
        ["layer_predictions", "lewc_cosine", "scaled_error", "reciprocal_orthogonality"]
        + ["relu_additivity_error", "stable_ranks", "dead_unit_fractions", "bias_shares"],
        ".diagnostics",
    ),
    **dict.fromkeys(
        ["mean_cosine", "centred_cosine", "shuffled_cosine", "common_mode_share"], ".cosines"
    ),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
