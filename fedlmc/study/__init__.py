"""Study: one-shot merge methods compared on the clients of one round, as tidy result rows.

- :mod:`fedlmc.study.compare`: :func:`compare_methods` and the rows' computations.
- :mod:`fedlmc.study.rows`: the results-row schema.
"""

from fedlmc._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        ["compare_methods", "evaluate_methods", "evaluate_model_row", "Comparison"]
        + ["merge_clients", "check_methods", "Merged"],
        ".compare",
    ),
    "COLUMNS": ".rows",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
