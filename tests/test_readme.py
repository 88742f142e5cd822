"""The README's code blocks are the example files, and they run as shown."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


@pytest.mark.parametrize("example", ["merge_two_mlps.py", "my_server_app.py"])
def test_readme_shows_the_example_file_verbatim(example: str) -> None:
    assert (ROOT / "examples" / example).read_text() in python_blocks()


def test_quick_start_commands_are_the_ci_commands() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    commands = re.findall(r"```bash\n(python3 -m venv .*?)\n```", README)
    assert len(commands) >= 2
    assert "fedlmc sweep configs/quick.toml" in commands[0]
    assert commands[1] in ci


def test_data_snippet_runs_and_prints_what_the_readme_shows(tmp_path: Path) -> None:
    block = next(b for b in python_blocks() if "plot_label_distribution(parts" in b)
    shown = re.match(r"```\s*```\n(.*?)```", README.split(block, 1)[1], flags=re.S).group(1)
    (tmp_path / "results").mkdir()
    out = subprocess.run(
        [sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == shown.strip()
    assert (tmp_path / "results" / "mnist5k_dirichlet.png").stat().st_size > 0


def test_server_app_snippet_runs_a_federation(tmp_path: Path) -> None:
    env = {**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "my_server_app.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    match = re.search(r"temperature ([0-9.e-]+) survivors \[0, 1\]", out.stdout)
    assert match and float(match.group(1)) > 0
    assert "merged tensors 6" in out.stdout


def test_merge_example_prints_what_the_readme_shows() -> None:
    """The example prints the README's numbers (to 0.01, as BLAS may round differently)."""
    block = (ROOT / "examples" / "merge_two_mlps.py").read_text()
    shown = re.match(r"```\s*\n.*?```\n(.*?)```", README.split(block, 1)[1], flags=re.S).group(1)
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "merge_two_mlps.py")],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    number = r"-?\d+\.\d+"
    printed, expected = re.findall(number, out), re.findall(number, shown)
    assert len(printed) == len(expected) > 20
    assert all(abs(float(a) - float(b)) <= 0.01 for a, b in zip(printed, expected, strict=True))
