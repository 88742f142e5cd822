"""Published baselines: CCA Merge (:mod:`fedlmc.merging.baselines.cca`), RESCALE
(:mod:`fedlmc.merging.baselines.rescale`) and Preserve-First Merging
(:mod:`fedlmc.merging.baselines.preserve_first`), registered as merge methods in
:mod:`fedlmc.merging.baselines.baselines`."""
