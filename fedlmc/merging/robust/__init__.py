"""The robust aggregation rules as one-shot merge methods (coordinate-wise median, trimmed mean,
Krum, multi-Krum): :mod:`fedlmc.merging.robust.rules`."""
