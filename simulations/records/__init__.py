"""What a run leaves in its out dir and tells its user, below the Flower app that writes it.

:mod:`~fedlmc.simulations.records.csv_lines` (the line-by-line reader both CSV files share),
:mod:`~fedlmc.simulations.records.results_file` (``results.csv``: its schema, reading with
rejected lines kept, which cells are finished), :mod:`~fedlmc.simulations.records.cell_rows` (a
cell's rows and their atomic append), :mod:`~fedlmc.simulations.records.training_file`
(``training.csv``), :mod:`~fedlmc.simulations.records.provenance` (versions and device),
:mod:`~fedlmc.simulations.records.out_dir_lock` (one writer per folder),
:mod:`~fedlmc.simulations.records.server_outcome` (what one ServerApp run produced, what a
mode works on and its round columns), :mod:`~fedlmc.simulations.records.row_groups` (tables
over rows: the keys that vary, split labels, the summary) and
:mod:`~fedlmc.simulations.records.progress` (the stages a run reports, each client reply and
the waits on a timer), with
:mod:`~fedlmc.simulations.records.watched_grid` (a Grid that tells each reply as it arrives, a
:mod:`~fedlmc.simulations.records.forwarding_grid` over the run's Grid, as the engine's cell view
is) and
:mod:`~fedlmc.simulations.records.run_table` (the table ``fedlmc run`` prints). The ServerApp
writes these files and the engine runs the ServerApp, so they sit below both; the report and the
trackers read them.
"""
