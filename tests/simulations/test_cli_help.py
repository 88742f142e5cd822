"""What the command line teaches (issue 54 item 9): examples under every sub-command's help,
the ``key=value`` hint for ``--key value``, ``fedlmc keys NAME|PATTERN`` on wrapped lines and
what ``fedlmc methods`` says about the ``_t`` rows."""

from __future__ import annotations

import argparse

import pytest

from fedlmc.merging.method_registry import CALIBRATED_SUFFIX
from fedlmc.simulations.cli import build_parser, main
from fedlmc.simulations.cli_help import (
    EXAMPLES,
    WIDEST,
    key_lines,
    key_value_hint,
    selected_keys,
)
from fedlmc.simulations.config import run_schema


def sub_commands(parser: argparse.ArgumentParser, prefix: str = ""):
    """Every (name, parser) below ``parser``, nested ones as ``"data fetch"``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                full = f"{prefix}{name}"
                yield full, child
                yield from sub_commands(child, f"{full} ")


def test_every_sub_command_help_shows_an_example(capsys):
    shown = 0
    for name, parser in sub_commands(build_parser()):
        text = parser.format_help()
        assert "examples:\n  fedlmc " in text, name
        assert all(line in text for line in EXAMPLES[name].splitlines()), name
        shown += 1
    assert shown == len(EXAMPLES)
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "fedlmc run epochs=2" in out and max(map(len, out.splitlines())) <= WIDEST


def test_a_run_config_key_given_as_an_option_points_to_key_value(capsys):
    keys = list(run_schema())
    argv = ["run", "--epochs", "2", "--num-clients=3"]
    assert key_value_hint(["--epochs", "--num-clients=3"], argv, keys) == (
        "; run-config keys are given as key=value: epochs=2 num-clients=3"
    )
    assert key_value_hint(["--frobnicate"], ["run", "--frobnicate"], keys) == ""
    with pytest.raises(SystemExit) as stopped:
        main(["run", "--epochs", "2"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --epochs" in err and "epochs=2" in err, err


def test_keys_names_one_key_or_a_pattern_on_wrapped_lines(capsys):
    names = list(run_schema())
    assert selected_keys("epochs", names) == ["epochs"]
    assert selected_keys("dp-*", names) == [n for n in names if n.startswith("dp-")]
    assert len(selected_keys("dp-*", names)) >= 2
    assert main(["keys", "epochs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "epochs" and out[1].startswith("    int; default 10; ")
    assert all(line.startswith("    ") for line in out[1:])
    assert main(["keys"]) == 0
    every = capsys.readouterr().out.splitlines()
    assert max(map(len, every)) <= WIDEST and set(names) <= set(every)
    assert main(["keys", "epoch"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'epochs'" in err and err.count("\n") == 1
    lines = key_lines("k", ["word-with-hyphens " * 20], width=40)
    assert max(map(len, lines)) <= 40 and "word-with-hyphens" in lines[1]


def test_methods_says_what_the_t_rows_are(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    note = " ".join(out.split("\n\n")[-1].split())
    assert f"NAME{CALIBRATED_SUFFIX}, the same merge with a calibrated softmax temperature" in note
