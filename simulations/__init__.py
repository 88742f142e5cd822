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
neither Flower nor torch.
"""

from __future__ import annotations

from fedlmc._lazy import lazy_exports

_EXPORTS = {
    "run_federation": "fedlmc.simulations.runs.federation",
    "run_federation_outcome": "fedlmc.simulations.runs.federation",
    "run_sweep": "fedlmc.simulations.runs.sweep",
    "load_sweep_config": "fedlmc.simulations.config",
    "validate_run_config": "fedlmc.simulations.config",
    "load_merged": "fedlmc.simulations.runs.merged_file",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
