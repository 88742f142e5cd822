"""The figure registry (:mod:`fedlmc.simulations.report.figure_table`): one table of figures,
in the order and with the words the docs show, registered once each."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_figures_come_from_one_table_in_the_documented_order():
    """The docs' figures table is generated from the registry (name, order, ``shows``); the
    report module's docstring points at the registry instead of listing the files."""
    import re

    import fedlmc.simulations.report.build as report
    from fedlmc.simulations.report.figure_table import FIGURE_TABLE, figure, figures_markdown

    sweeps = (Path(__file__).resolve().parents[3] / "docs" / "sweeps.md").read_text()
    documented = re.findall(r"^\| `(\w+)\.png` \|", sweeps, flags=re.M)
    assert [f.name for f in FIGURE_TABLE] == documented and len(documented) >= 16
    assert figures_markdown() in sweeps
    assert not re.findall(r"``\w+\.png``", report.__doc__) and "FIGURE_TABLE" in report.__doc__
    with pytest.raises(ValueError, match="figure 'lambda_paths' is already registered"):
        figure("lambda_paths", lambda inputs: True, shows="x")(lambda inputs, path: None)
    with pytest.raises(ValueError, match="figure 'blank': shows = ''; allowed: one non-empty"):
        figure("blank", lambda inputs: True, shows="")
