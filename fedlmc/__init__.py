"""fedlmc: one-shot merging of independently trained client models and linear mode connectivity.

The science, one subpackage per concept; none of them imports Flower:

- :mod:`fedlmc.data`: data sets, held-out splits, client partitions.
- :mod:`fedlmc.models`: width-scalable classifiers and their registry.
- :mod:`fedlmc.train`, :mod:`fedlmc.evaluation`: training and the metrics of a classifier.
- :mod:`fedlmc.averaging`: weighted averages and interpolation of state dicts.
- :mod:`fedlmc.permutation`: hidden-unit permutations, their derivation from a model's graph,
  weight and activation matching, the assignment solver, MergeMany, plain chains.
- :mod:`fedlmc.merging`: the merge-method registry, temperature, BatchNorm statistics, REPAIR.
- :mod:`fedlmc.analysis`: interpolation paths, barriers, LEWC and LLFC diagnostics.
- :mod:`fedlmc.study`: merge methods compared on one round's clients, the results columns.

The Flower layer installs under this package too: :mod:`fedlmc.strategies` (server strategies for
any ServerApp) and :mod:`fedlmc.simulations` (ClientApp, ServerApp, sweeps, reports, CLI). Their
source folders, ``strategies/`` and ``simulations/``, sit beside ``fedlmc/``; in a source tree or
a Flower app bundle :mod:`fedlmc._app_folders` mounts them under this package.

The main functions are importable from here, e.g. ``from fedlmc import build_model,
weight_matching, merge_states``; nothing heavy is imported until one is used.
"""

from fedlmc._app_folders import mount_app_folders
from fedlmc._lazy import lazy_exports

__version__ = "0.1.0"

mount_app_folders(__path__)

_EXPORTS = {
    "build_model": "fedlmc.models.classifiers",
    "register_model": "fedlmc.models.registry",
    "load_dataset": "fedlmc.data.loading",
    "from_arrays": "fedlmc.data.loading",
    "partition": "fedlmc.data.partitions",
    "train_model": "fedlmc.train",
    "evaluate": "fedlmc.evaluation",
    "predict_logits": "fedlmc.evaluation",
    "average": "fedlmc.averaging",
    "interpolate": "fedlmc.averaging",
    "load_state": "fedlmc.averaging",
    "PermutationSpec": "fedlmc.permutation",
    "permutation_spec": "fedlmc.permutation",
    "apply_permutation": "fedlmc.permutation",
    "derive_spec": "fedlmc.permutation",
    "weight_matching": "fedlmc.permutation.matching",
    "activation_matching": "fedlmc.permutation.matching",
    "merge_many": "fedlmc.permutation.matching",
    "register_method": "fedlmc.merging.method_registry",
    "merge_states": "fedlmc.merging.methods",
    "fit_temperature": "fedlmc.merging.calibrate",
    "reset_bn_stats": "fedlmc.merging.calibrate",
    "repair": "fedlmc.merging.repair",
    "interpolation_curve": "fedlmc.analysis.paths",
    "barriers": "fedlmc.analysis.paths",
    "layer_predictions": "fedlmc.analysis.diagnostics",
    "compare_methods": "fedlmc.study.compare",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
