"""What a researcher's first commands answer (issue 54 items 3 and 9): refusals that name the
way out, help that shows examples, ``fedlmc keys NAME``."""

from __future__ import annotations

import sys

from fedlmc.simulations.cli import main


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedlmc: error: "), err
    return lines[0]


def test_a_data_set_without_its_files_is_refused_before_ray_starts(capsys):
    assert main(["run", "dataset=cifar10"]) == 2
    line = one_error_line(capsys)
    for needle in ("data-root", "download=true", "fedlmc data fetch cifar10"):
        assert needle in line, line
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
