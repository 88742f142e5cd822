"""What the ``fedlmc`` command line teaches: an example under every sub-command's ``--help``,
the ``key=value`` form pointed to when a run-config key is given as ``--key value``, and
``fedlmc keys [NAME|PATTERN]``: one key, or the keys a shell-style pattern (``fnmatch``)
matches, each on wrapped lines no wider than the terminal (at most 100 columns); and the
parsers of the listing commands (``methods``, ``models``, ``keys``, ``columns``, ``data``)."""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import textwrap
from collections.abc import Sequence
from typing import Any

from fedlmc.data.catalog import DOWNLOADABLE

EXAMPLES = {
    "sweep": "fedlmc sweep configs/quick.toml\n"
    "fedlmc sweep configs/quick.toml seed=[0,1] epochs=2 --out results/try",
    "report": "fedlmc report results/quick\nfedlmc report results/quick --to /tmp/quick-report",
    "run": "fedlmc run epochs=2 num-clients=3 methods=average,weight_matching\n"
    "fedlmc run dataset=cifar10 data-root=data download=true model=vgg11 --csv rows.csv",
    "track": "fedlmc track results/quick --to tensorboard",
    "validate": "fedlmc validate configs/quick.toml\n"
    "fedlmc validate configs/mnist_mlp.toml num-gpus=0.5 --no-device-check",
    "methods": "fedlmc methods",
    "models": "fedlmc models",
    "keys": "fedlmc keys epochs\nfedlmc keys 'dp-*'\nfedlmc keys --pyproject",
    "columns": "fedlmc columns",
    "superlink": "fedlmc superlink start --timeout 600\nfedlmc superlink stop",
    "data": "fedlmc data list\nfedlmc data fetch cifar10 --root data",
    "data list": "fedlmc data list",
    "superlink start": "fedlmc superlink start --timeout 600",
    "superlink stop": "fedlmc superlink stop",
    "data fetch": "fedlmc data fetch cifar10 --root data\n"
    "fedlmc data fetch mnist --root data --mirror http://mirror.local/mnist",
}
"""Example command lines of each sub-command, shown under its ``--help``."""

METHODS_NOTE = (
    "A method NAME gives two rows: NAME, the merged model as it is, and NAME_t, the same merge "
    "with a calibrated softmax temperature (one temperature fitted on the server split, or on "
    "the clients' data with calibration = federated, dividing the merged model's logits)."
)
"""What ``fedlmc methods`` says about the ``_t`` rows."""

WIDEST = 100
MAX_MESSAGE = 600  # characters of an error message: its start and its end are kept


def one_line(message: object) -> str:
    """``message`` on one line, at most :data:`MAX_MESSAGE` characters (the middle of a longer
    one, e.g. a 10,000-character path, is cut)."""
    text = " ".join(str(message).split())
    if len(text) > MAX_MESSAGE:
        text = (
            f"{text[: MAX_MESSAGE // 2]} ... {text[-MAX_MESSAGE // 4 :]} ({len(text)} characters)"
        )
    return text


def methods_listing() -> str:
    """``fedlmc methods``: the methods table, then what the ``_t`` rows are
    (:data:`METHODS_NOTE`)."""
    from fedlmc.simulations.config.tables import methods_table

    return f"{methods_table()}\n\n{textwrap.fill(METHODS_NOTE, WIDEST)}"


def examples_epilog(command: str, note: str = "") -> str:
    """The ``--help`` epilog of ``command``: its examples (:data:`EXAMPLES`), then ``note``."""
    lines = "\n".join(f"  {line}" for line in EXAMPLES[command].splitlines())
    note = textwrap.fill(note, WIDEST, break_on_hyphens=False)
    return f"examples:\n{lines}" + (f"\n\n{note}" if note else "")


def help_options(command: str, note: str = "") -> dict[str, Any]:
    """``add_parser`` keywords that show ``command``'s examples as written."""
    return {
        "epilog": examples_epilog(command, note),
        "formatter_class": argparse.RawDescriptionHelpFormatter,
    }


def key_value_hint(extras: Sequence[str], argv: Sequence[str], keys: Sequence[str]) -> str:
    """For ``--epochs 2`` among argparse's unrecognized ``extras`` (of the command line
    ``argv``): ``; run-config keys are given as key=value: epochs=2`` (``""`` when none of them
    names a key in ``keys``)."""
    hints = []
    for token in extras:
        name, equals, value = token[2:].partition("=")
        if not token.startswith("--") or name not in keys:
            continue
        if not equals and token in argv:
            after = list(argv)[list(argv).index(token) + 1 :]
            value = after[0] if after and not after[0].startswith("-") else ""
        hints.append(f"{name}={value or 'VALUE'}")
    return f"; run-config keys are given as key=value: {' '.join(hints)}" if hints else ""


def selected_keys(pattern: str, names: Sequence[str]) -> list[str]:
    """The keys ``pattern`` names: itself, or those it matches as a shell-style pattern."""
    if pattern in names:
        return [pattern]
    return [name for name in names if fnmatch.fnmatchcase(name, pattern)]


def key_lines(name: str, facts: Sequence[str], width: int | None = None) -> list[str]:
    """``name`` and its ``facts`` (type, default, meaning, ...), wrapped to ``width`` columns
    (default: the terminal's, at most :data:`WIDEST`)."""
    width = width or min(WIDEST, shutil.get_terminal_size((WIDEST, 24)).columns)
    text = textwrap.fill(
        "; ".join(facts),
        width=width,
        initial_indent="    ",
        subsequent_indent="    ",
        break_on_hyphens=False,
    )
    return [name, *text.splitlines()]


def keys_listing(pattern: str | None = None) -> str:
    """``fedlmc keys [PATTERN]``: each run-config key (or each one ``pattern`` names,
    :func:`selected_keys`) on wrapped lines: ``type; default; meaning; in a cell's identity``;
    :class:`~fedlmc.simulations.config.schema.ConfigError` naming the closest keys when
    ``pattern`` names none."""
    from fedlmc.simulations.config import ConfigError, run_schema
    from fedlmc.simulations.config.schema import did_you_mean
    from fedlmc.simulations.config.tables import key_facts

    schema = run_schema()
    names = list(schema) if pattern is None else selected_keys(pattern, list(schema))
    if not names:
        raise ConfigError(
            f"keys {pattern!r}: no such key{did_you_mean(pattern, list(schema))}; allowed: a "
            "key's name or a pattern such as 'dp-*' (fedlmc keys lists them all)"
        )
    lines = []
    for name in names:
        type_name, default, meaning, identity = key_facts(schema[name])
        facts = [type_name, f"default {default}", meaning, f"in a cell's identity: {identity}"]
        lines += key_lines(name, [fact.replace("`", "") for fact in facts])
    return "\n".join(lines)


def add_listing_commands(sub: Any) -> None:
    """``fedlmc methods``, ``models``, ``keys`` and ``columns``: the markdown listings."""
    sub.add_parser(
        "methods",
        help="list the registered merge methods (markdown)",
        **help_options("methods", METHODS_NOTE),
    )
    sub.add_parser("models", help="list the registered models (markdown)", **help_options("models"))
    keys = sub.add_parser(
        "keys", help="list run-config keys with their defaults", **help_options("keys")
    )
    keys.add_argument("name", nargs="?", help="one key, or a pattern such as 'dp-*' (default: all)")
    keys.add_argument("--markdown", action="store_true", help="print the docs' markdown table")
    keys.add_argument(
        "--pyproject",
        action="store_true",
        help="print pyproject.toml's [tool.flwr.app.config] block instead (every key's default)",
    )
    keys.add_argument(
        "--write-pyproject",
        metavar="PATH",
        help="replace the [tool.flwr.app.config] block of the pyproject.toml at PATH",
    )
    sub.add_parser(
        "columns", help="list every results column (markdown)", **help_options("columns")
    )


def add_data_command(sub: Any) -> None:
    """``fedlmc data list|fetch``."""
    data = sub.add_parser(
        "data", help="data sets: list them, fetch one into a folder", **help_options("data")
    )
    data_sub = data.add_subparsers(dest="data_command", required=True)
    data_sub.add_parser(
        "list", help="list the registered data sets (markdown)", **help_options("data list")
    )
    fetch = data_sub.add_parser(
        "fetch",
        help="download a torchvision data set (md5-checked) where load_dataset reads it",
        **help_options("data fetch"),
    )
    fetch.add_argument("name", choices=DOWNLOADABLE, help="data set")
    fetch.add_argument("--root", required=True, help="folder to fetch into (the data-root)")
    fetch.add_argument("--mirror", help="base URL of a mirror (default: torchvision's URLs)")
