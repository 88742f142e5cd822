"""Study: one-shot merge methods compared on the clients of one round, as tidy result rows.

- :mod:`fedlmc.study.compare`: :func:`compare_methods`, the driver: one row per method.
- :mod:`fedlmc.study.context`: :class:`StudyContext`, the frozen settings every step reads.
- :mod:`fedlmc.study.model_rows`: a merged model's raw and ``_t`` rows, the one evaluator.
- :mod:`fedlmc.study.merge`: one merge and its post-merge pipeline (:class:`Merged`).
- :mod:`fedlmc.study.baseline`: the clients' predictions and the ensembles.
- :mod:`fedlmc.study.barriers`: the merge gap and the barriers of interpolation paths.
- :mod:`fedlmc.study.diagnostic_columns`: LEWC, LLFC and the mechanism columns.
- :mod:`fedlmc.study.rows`: the results-row schema.
- :mod:`fedlmc.study.flags`: a temperature at its fit's bound, an accuracy at chance.
"""

from fedlmc._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        ["compare_methods", "Comparison"] + ["check_methods", "study_context"],
        ".compare",
    ),
    "StudyContext": ".context",
    "merge_rows": ".model_rows",
    **dict.fromkeys(["merge_clients", "Merged"], ".merge"),
    "COLUMNS": ".rows",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
