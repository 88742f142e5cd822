"""The merge methods the model-merging field compares against: Fisher merging
(:mod:`fedlmc.merging.field.fisher`), RegMean (:mod:`fedlmc.merging.field.regmean`), Task
Arithmetic, TIES and DARE (:mod:`fedlmc.merging.field.task_vectors`) and OT fusion
(:mod:`fedlmc.merging.field.ot_fusion`), registered with their options in
:mod:`fedlmc.merging.field.field_methods`."""
