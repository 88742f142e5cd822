"""Huge or long values, and local sources that are not there, are refused before any work: one
short line naming the key and what is allowed (never Python's "Exceeds the limit (4300 digits)"
or a 10,000-character "File name too long"), exit status 2, and Ray never started."""

from __future__ import annotations

import sys

import pytest

from fedlmc.simulations.cli import main
from fedlmc.simulations.cli_help import MAX_MESSAGE
from fedlmc.simulations.config import MAX_NAME, parse_override
from fedlmc.simulations.config.schema import MAX_INT, ConfigError

SHORT = 300  # characters: what "one short line" means here


def one_short_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[:500]
    assert lines[0].startswith("fedlmc: error: ") and len(lines[0]) < SHORT, lines[0][:500]
    assert "Traceback" not in err and "4300" not in err
    return lines[0]


def ray_started() -> bool:
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


@pytest.mark.parametrize("digits", [30, 5000, 10_000])
def test_a_huge_width_names_the_key_and_the_allowed_range(tmp_path, capsys, digits):
    """30 digits parse but are beyond 64 bits; 5,000 and 10,000 are beyond what Python
    converts: the same message."""
    out = tmp_path / "out"
    assert main(["run", "width=" + "1" * digits, f"out-dir={out}"]) == 2
    line = one_short_line(capsys)
    assert "width = '1111" in line or "width = 1111" in line
    assert "out of range; allowed: a number in (0, 1024]" in line
    assert not out.exists() and not ray_started()


def test_a_huge_value_in_a_sweep_file_names_its_key(tmp_path, capsys):
    path = tmp_path / "huge.toml"
    path.write_text(f'name = "huge"\n[grid]\nepochs = [1, {"9" * 10_000}]\n')
    assert main(["validate", str(path)]) == 2
    line = one_short_line(capsys)
    assert "epochs = 9999" in line and "(10000 characters)" in line
    assert "out of range; allowed: an integer 1 .. 100000" in line


def test_a_long_sweep_name_is_refused_naming_the_limit(tmp_path, capsys):
    path = tmp_path / "long.toml"
    path.write_text(f'name = "{"n" * 10_000}"\n[run]\nepochs = 1\n')
    assert main(["sweep", str(path), "--no-report"]) == 2
    line = one_short_line(capsys)
    assert f"at most {MAX_NAME} letters" in line and "(10002 characters)" in line
    assert "File name too long" not in line and not ray_started()


def test_a_long_text_value_is_cut_in_the_message(capsys):
    assert main(["run", "model=" + "m" * 10_000]) == 2
    line = one_short_line(capsys)
    assert line.startswith("fedlmc: error: model = 'mmm") and "(10002 characters)" in line


def test_an_error_naming_a_huge_path_stays_short(tmp_path, capsys):
    """An OS error echoing a 10,000-character path is cut to MAX_MESSAGE characters."""
    out = tmp_path / ("d" * 10_000)
    config = tmp_path / "two.toml"
    config.write_text('name = "two"\n[run]\nepochs = 1\n')
    assert main(["sweep", str(config), "--out", str(out), "--no-report"]) in (1, 2)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < MAX_MESSAGE + 100 and "Traceback" not in err


@pytest.mark.parametrize(
    "override, needle",
    [
        ("model=/no/such/net.py:make_net", "no such file '/no/such/net.py'"),
        ("dataset=hf:../../x", "dataset = 'hf:../../x': no such local file or folder"),
    ],
)
def test_missing_local_sources_are_refused_before_ray_starts(tmp_path, capsys, override, needle):
    assert main(["run", override, "epochs=1", f"out-dir={tmp_path / 'out'}"]) == 2
    assert needle in one_short_line(capsys)
    assert not ray_started() and not (tmp_path / "out").exists()


def test_a_hub_name_and_an_existing_path_pass_the_source_check(tmp_path):
    from fedlmc.simulations.config import check_local_sources, validate_run_config

    folder = tmp_path / "data"
    folder.mkdir()
    for dataset in ("hf:ylecun/mnist", "hf:mnist", f"hf:{folder}"):
        config = validate_run_config({"dataset": dataset}, check_devices=False)
        check_local_sources(config)  # no error


def test_parse_override_refuses_an_unreadable_integer_with_its_key():
    with pytest.raises(
        ConfigError,
        match=rf"^seed = 7777.*\(5000 characters\): out of range; allowed: an integer 0 "
        rf"\.\. {MAX_INT}",
    ):
        parse_override("seed=" + "7" * 5000)
