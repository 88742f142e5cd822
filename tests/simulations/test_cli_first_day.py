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


THREE_MISTAKES = """
name = "three"
[run]
epochs = 0
widht = 2
[grid]
seed = [0, 1]
[report]
dpi = 100000
"""


def test_a_file_with_three_mistakes_names_all_three_one_line_each(tmp_path, capsys):
    path = tmp_path / "three.toml"
    path.write_text(THREE_MISTAKES)
    assert main(["validate", str(path), "--out", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("fedlmc: error: ") for line in lines)
    for needle, line in zip(
        ("run.epochs = 0: allowed", "unknown key run.widht", "report.dpi = 100000"),
        lines,
        strict=True,
    ):
        assert needle in line, lines
    assert not (tmp_path / "out").exists()
