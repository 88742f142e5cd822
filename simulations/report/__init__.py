"""The report of a sweep's out dir: ``report.md`` (short), ``report_full.md``, the figures.

:mod:`~fedlmc.simulations.report.build` (``build_report``: reads the records, writes the
report), :mod:`~fedlmc.simulations.report.data` (the rows a table or figure reads),
:mod:`~fedlmc.simulations.report.summary` (``report.md``: one row per distinct quantity),
:mod:`~fedlmc.simulations.report.markdown` (every table and the convergence verdict),
:mod:`~fedlmc.simulations.report.training` (training curves), the plotting primitives
(:mod:`~fedlmc.simulations.report.plotting`), the per-layer figures
(:mod:`~fedlmc.simulations.report.layer_figures`) and every figure, declared once with
``@figure`` in :mod:`~fedlmc.simulations.report.figure_table` (drawings for width mixes and
initialisations in :mod:`~fedlmc.simulations.report.width_figures` and
:mod:`~fedlmc.simulations.report.init_figures`). It reads only the records
(:mod:`fedlmc.simulations.records`), never the sweep driver or the engine.
"""

from __future__ import annotations

from fedlmc._lazy import lazy_exports

_EXPORTS = {"build_report": "fedlmc.simulations.report.build"}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
