"""The ways to run: one federation (:func:`~fedlmc.simulations.runs.federation.run_federation`),
a sweep of cells with resumable results (:func:`~fedlmc.simulations.runs.sweep.run_sweep`, its out
dir's preparation in :mod:`~fedlmc.simulations.runs.out_dir`), a ``fedlmc run``'s outputs
checked and locked (:mod:`~fedlmc.simulations.runs.run_outputs`), and reading a saved merge back
(:func:`~fedlmc.simulations.runs.merged_file.load_merged`, its safetensors header checked first
in :mod:`~fedlmc.simulations.runs.safetensors_header`); and Flower's local SuperLink for
``flwr run .`` (:mod:`~fedlmc.simulations.runs.local_superlink`). Each of the first drives the
engine (:mod:`fedlmc.simulations.engine`); ``fedlmc.simulations`` exports the entry points.
"""
