"""Merging: the merge-method registry and the steps after the average (the core, this folder's
modules), and the methods of the field, the published baselines and the robust rules (its
folders).

- :mod:`fedlmc.merging.methods`: :func:`merge_states`, the merge entry.
- :mod:`fedlmc.merging.merge_result`: :class:`MergeResult`, the one result of a merge every path
  produces, and its pipeline (merge, post-merge, calibration).
- :mod:`fedlmc.merging.method_registry`: the registry of methods (:func:`register_method`, the
  look-ups, each method's refusal, methods named by import path); it registers the built-in
  modules' methods itself at its first use.
- :mod:`fedlmc.merging.merge_job`: :class:`MergeJob` and :class:`Alignment`, what a method
  receives and returns.
- :mod:`fedlmc.merging.builtin_methods`: the built-in one-shot methods (plain average, weight /
  activation matching, MergeMany, controls, ``auto``, mixed widths).
- :mod:`fedlmc.merging.calibrate`: softmax temperature and BatchNorm statistics.
- :mod:`fedlmc.merging.repair`: REPAIR's renormalisation of merged units.
- :mod:`fedlmc.merging.clients`: clients in one process, for the methods that query them.
- :mod:`fedlmc.merging.widths`: merging clients of different widths (embedding, rectangular
  matching onto the widest client, HeteroFL's holder average, width weights).
- :mod:`fedlmc.merging.random_direction`: the flatness control ``random_direction`` (client 0
  moved by a seeded random direction as long as its step to the plain average).
- :mod:`fedlmc.merging.alignment_record`: what an alignment did (groups aligned, units moved)
  and the line flagging a method that aligned nothing.
- :mod:`fedlmc.merging.merge_result`, :mod:`fedlmc.merging.post_merge`,
  :mod:`fedlmc.merging.lewc_temperature`, :mod:`fedlmc.merging.temperature_bound`,
  :mod:`fedlmc.merging.request_facts`, :mod:`fedlmc.merging.sum_form`: the one merge result and
  its pipeline, the post-merge steps, LEWC's temperature, a temperature at its fit's bound, what
  a request says and the weighted-sum form the clear and secure sums share.

The merge methods beside the core, one folder each (a folder's docstring lists its modules):

- :mod:`fedlmc.merging.field`: the methods the model-merging field compares against (Fisher
  merging, RegMean, Task Arithmetic, TIES, DARE, OT fusion), registered with their options in
  :mod:`fedlmc.merging.field.field_methods`.
- :mod:`fedlmc.merging.baselines`: the published baselines (RESCALE, CCA Merge, Preserve-First
  Merging, a model of another architecture registered with ``builds_model``), registered in
  :mod:`fedlmc.merging.baselines.baselines`.
- :mod:`fedlmc.merging.robust`: the robust aggregation rules (coordinate-wise median, trimmed
  mean, Krum, multi-Krum), :mod:`fedlmc.merging.robust.rules`.

The registry registers all of them as it does the built-in methods.

The weighted average itself is :mod:`fedlmc.averaging`, below both this package and
:mod:`fedlmc.permutation` (MergeMany averages while it aligns).
"""

from fedlmc._lazy import lazy_exports

_EXPORTS = {
    "merge_states": ".methods",
    **dict.fromkeys(
        ["MergeResult", "finish_merge", "calibrated", "merge_and_finish"], ".merge_result"
    ),
    **dict.fromkeys(
        ["register_method", "merge_method", "merge_method_names", "MergeMethod"], ".method_registry"
    ),
    **dict.fromkeys(["MergeJob", "Alignment", "ClientQueries"], ".merge_job"),
    **dict.fromkeys(
        ["fit_temperature", "fit_temperature_federated", "reset_bn_stats", "has_batchnorm"],
        ".calibrate",
    ),
    # Not `repair`: here that name is the module; the function is the short path `repair` of fedlmc.
    "repair_with_statistics": ".repair",
    "LocalClients": ".clients",
    **dict.fromkeys(["holder_average", "match_to_widest", "width_weights"], ".widths"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
