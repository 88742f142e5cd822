"""The built-in merge methods' evaluation policies (:mod:`fedlmc.study.method_policy`).

Registered once, when :data:`fedlmc.study.method_policy.EVALUATIONS` is first used; a method
not named here gets the defaults (on the path, no own columns, the server sees each model).
The columns are those each method's ``Alignment.info`` reports, declared beside its align
function; the order here is the order of the methods' registration (the results columns
follow it).
"""

from __future__ import annotations

from fedlmc.merging.alignment_record import ALIGNMENT_COLUMNS
from fedlmc.merging.baselines.baselines import CCA_COLUMNS, RESCALE_COLUMNS
from fedlmc.merging.builtin_methods import AUTO_COLUMNS
from fedlmc.merging.field.field_methods import CLIENT_STATISTICS_COLUMNS, OT_COLUMNS
from fedlmc.merging.random_direction import RANDOM_DIRECTION_COLUMNS
from fedlmc.merging.robust.rules import KRUM_COLUMNS
from fedlmc.study.method_policy import register_evaluation
from fedlmc.study.server_sees import SECURE_SUM

STATISTICS = "each model's statistics"

register_evaluation("average", server_sees=SECURE_SUM)
register_evaluation("weight_matching", columns=ALIGNMENT_COLUMNS)
register_evaluation("weight_matching_forward", columns=ALIGNMENT_COLUMNS)
register_evaluation("activation_matching", columns=ALIGNMENT_COLUMNS)
register_evaluation(
    "activation_federated", columns=ALIGNMENT_COLUMNS, server_sees="one model and permutations"
)
register_evaluation("merge_many", columns=ALIGNMENT_COLUMNS)
register_evaluation("random_permutation", columns=ALIGNMENT_COLUMNS)
register_evaluation("average_repair", server_sees=STATISTICS)
register_evaluation("weight_matching_repair", columns=ALIGNMENT_COLUMNS)
register_evaluation("average_lewc_bias", server_sees=SECURE_SUM)
register_evaluation("auto", columns=(*AUTO_COLUMNS, *ALIGNMENT_COLUMNS))
register_evaluation("embed_average", counterpart_of="average", server_sees=SECURE_SUM)
register_evaluation(
    "embed_weight_matching", counterpart_of="weight_matching", columns=ALIGNMENT_COLUMNS
)
register_evaluation("embed_weight_matching_repair", columns=ALIGNMENT_COLUMNS)
register_evaluation("heterofl", server_sees=SECURE_SUM)
register_evaluation("random_direction", on_path=False, columns=RANDOM_DIRECTION_COLUMNS)
register_evaluation(
    "average_rescale", on_path=False, columns=RESCALE_COLUMNS, server_sees=STATISTICS
)
register_evaluation(
    "weight_matching_rescale", on_path=False, columns=(*RESCALE_COLUMNS, *ALIGNMENT_COLUMNS)
)
register_evaluation("cca_merge", columns=CCA_COLUMNS)
register_evaluation("preserve_first", on_path=False)
register_evaluation("weight_matching_preserve_first", on_path=False, columns=ALIGNMENT_COLUMNS)
for _name in ("fisher", "regmean"):
    register_evaluation(
        _name, on_path=False, columns=CLIENT_STATISTICS_COLUMNS, server_sees=SECURE_SUM
    )
for _name in ("task_arithmetic", "ties", "dare"):
    register_evaluation(_name, on_path=False, server_sees=SECURE_SUM)
register_evaluation("ot_fusion", columns=OT_COLUMNS)
register_evaluation("median", on_path=False)
register_evaluation("trimmed_mean", on_path=False)
register_evaluation("krum", on_path=False, columns=KRUM_COLUMNS)
register_evaluation("multi_krum", on_path=False, columns=KRUM_COLUMNS)
