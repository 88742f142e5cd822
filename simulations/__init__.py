"""The Flower side of fedlmc: the Flower app, the sweep engine, the run drivers, the records, the
report and the command line.

Layout (imports go one way, lowest first; ``tests/project/test_code_shape.py`` enforces it):

- :mod:`~fedlmc.simulations.config`: the run and sweep configuration (keys, values, checks, sweep
  files, cell identity); no Flower, no torch;
- :mod:`~fedlmc.simulations.records`: what a run writes (``results.csv``, ``training.csv``,
  provenance, the out-dir lock) and tells its user;
- the Flower app, Flower's template names: :mod:`~fedlmc.simulations.task` (model and data of a
  run config), :mod:`~fedlmc.simulations.private` (its secure-aggregation pieces),
  :mod:`~fedlmc.simulations.client_app`, :mod:`~fedlmc.simulations.server_app`;
- :mod:`~fedlmc.simulations.engine`: the Ray/Flower machinery behind one ``run_cells``;
- :mod:`~fedlmc.simulations.runs`: one federation, a sweep, reading a saved merge back;
- :mod:`~fedlmc.simulations.report` and :mod:`~fedlmc.simulations.tracking`: what reads the
  records (the report, TensorBoard and MLflow);
- :mod:`~fedlmc.simulations.cli`: the ``fedlmc`` command.

``fedlmc.simulations.run_federation`` (and ``run_sweep``, ``load_sweep_config``, ...) are
imported on first use, so that ``import fedlmc.simulations`` (and validating a sweep file) loads
neither Flower nor torch. The flat module paths of releases up to 0.1
(``fedlmc.simulations.sweep``, ``fedlmc.simulations.slots``,
``fedlmc.simulations.report_data``, ...) still import, with a ``DeprecationWarning`` naming the new
path (:data:`MOVED`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

from fedlmc._lazy import lazy_exports

_EXPORTS = {
    "run_federation": "fedlmc.simulations.runs.federation",
    "run_federation_outcome": "fedlmc.simulations.runs.federation",
    "run_sweep": "fedlmc.simulations.runs.sweep",
    "load_sweep_config": "fedlmc.simulations.config",
    "validate_run_config": "fedlmc.simulations.config",
    "load_merged": "fedlmc.simulations.runs.merged_file",
}

MOVED = {
    f"fedlmc.simulations.{old}": f"fedlmc.simulations.{new}"
    for old, new in {
        "schema": "config.schema",
        "report_schema": "config.report_keys",
        "registry_tables": "config.tables",
        "threads": "config.threads",
        "out_dir_lock": "records.out_dir_lock",
        "results_file": "records.results_file",
        "training_file": "records.training_file",
        "provenance": "records.provenance",
        "progress": "records.progress",
        "merged_file": "runs.merged_file",
        "federation": "runs.federation",
        "sweep": "runs.sweep",
        "slots": "engine.slots",
        "grid_view": "engine.grid_view",
        "ray_runtime": "engine.ray_runtime",
        "log_filters": "engine.log_filters",
        "exit_workaround": "engine.exit_workaround",
        "compat": "engine.compat",
        "stop_signals": "engine.stop_signals",
        "sweep_server": "engine.sweep_server",
        "report_data": "report.data",
        "report_markdown": "report.markdown",
        "report_training": "report.training",
        "figures": "report.plotting",
        "figure_table": "report.figure_table",
        "width_figures": "report.width_figures",
        "init_figures": "report.init_figures",
    }.items()
}
"""Old module path -> new one. ``fedlmc.simulations.config``, ``.engine`` and ``.report`` kept
their names as packages (``run_cells``, ``build_report`` and every config name still import from
them)."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old path of :data:`MOVED` as the module at its new path, with a warning."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module at the new path is already executed."""


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
