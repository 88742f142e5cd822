"""Rewrite the generated tables of the docs pages from the registries and the row schema.

Each generated table sits between two marker lines in a page::

    <!-- BEGIN GENERATED methods -->
    | method (rows) | ... |
    <!-- END GENERATED methods -->

``python docs/gen_tables.py`` rewrites every block from :data:`BLOCKS`; ``--check`` only says
which blocks differ (exit status 1). ``tests/fedlmc/test_registry.py`` checks that every page holds
exactly the generated tables. Run from the repository root (or anywhere: paths are relative to
this file).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

DOCS = Path(__file__).resolve().parent
if str(DOCS.parent) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(DOCS.parent))

from fedlmc.data.catalog import datasets_markdown  # noqa: E402
from fedlmc.simulations.config.tables import (  # noqa: E402
    columns_table,
    keys_table,
    methods_table,
    models_table,
    secure_methods_table,
    training_columns_table,
)
from fedlmc.simulations.report.figure_table import figures_markdown  # noqa: E402
from fedlmc.strategies.query_handlers import query_handlers_table  # noqa: E402

READING_PATH: tuple[tuple[str, str], ...] = (
    ("examples/merge_two_mlps.py", "the whole story on two MLPs, each step one call below"),
    ("fedlmc/train.py", "train: `train_model`, one seeded SGD loop"),
    ("fedlmc/averaging.py", "merge by average: the weighted average, `load_state`, interpolation"),
    (
        "fedlmc/merging/calibrate.py",
        "+ T: the softmax temperature fit (and BatchNorm statistics)",
    ),
    ("fedlmc/permutation/spec.py", "by permutation: `PermutationSpec`, which axes each unit moves"),
    (
        "fedlmc/permutation/reference_matching.py",
        "Git Re-Basin's weight matching as its Algorithm 1 reads "
        "(`weight_matching` is the optimised form)",
    ),
    ("fedlmc/evaluation.py", "measure: logits, accuracy, NLL, calibration error"),
    ("fedlmc/analysis/paths.py", "measure: interpolation curves, barriers, merge gap"),
    (
        "fedlmc/merging/methods.py",
        "then the registry entry `merge_states`, which the study uses",
    ),
)
"""The modules a researcher reads, in order, to understand "train, merge by average + T or by
permutation, measure" (docs/architecture.md's reading path): path -> what to read it for."""


def reading_path_table() -> str:
    """The reading path as a Markdown table, each module's line count read from the file."""
    root = DOCS.parent
    rows = ["| step | module | lines | read it for |", "|---|---|---|---|"]
    for step, (path, why) in enumerate(READING_PATH, start=1):
        lines = len((root / path).read_text().splitlines())
        rows.append(f"| {step} | `{path}` | {lines} | {why} |")
    return "\n".join(rows)


BLOCKS: dict[str, tuple[str, Callable[[], str]]] = {
    "methods": ("methods.md", methods_table),
    "models": ("library.md", models_table),
    "datasets": ("library.md", datasets_markdown),
    "keys": ("reference/keys.md", keys_table),
    "columns": ("reference/columns.md", columns_table),
    "training-columns": ("reference/columns.md", training_columns_table),
    "figures": ("sweeps.md", figures_markdown),
    "secure-methods": ("private.md", secure_methods_table),
    "query-handlers": ("federation.md", query_handlers_table),
    "reading-path": ("architecture.md", reading_path_table),
}
"""Block name -> (page under docs/, the function that makes its table)."""


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- BEGIN GENERATED {name} -->\n)(.*?)(<!-- END GENERATED {name} -->)", flags=re.S
    )


def generated_block(page_text: str, name: str) -> str:
    """The text between block ``name``'s markers in a page (ValueError when they are missing)."""
    found = _pattern(name).search(page_text)
    if found is None:
        raise ValueError(f"no generated block {name!r}: add its BEGIN/END GENERATED markers")
    return found.group(2)


def rewrite(page_text: str, name: str, table: str) -> str:
    """The page with block ``name`` replaced by ``table``."""
    generated_block(page_text, name)  # the markers must be there
    return _pattern(name).sub(lambda m: m.group(1) + table + "\n" + m.group(3), page_text)


def stale_blocks() -> list[str]:
    """Names of the blocks whose page does not hold exactly the generated table."""
    return [
        name
        for name, (page, make) in BLOCKS.items()
        if generated_block((DOCS / page).read_text(), name) != make() + "\n"
    ]


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        stale = stale_blocks()
        for name in stale:
            print(f"docs/{BLOCKS[name][0]}: generated block {name!r} is stale", file=sys.stderr)
        return 1 if stale else 0
    if argv:
        print(f"usage: python docs/gen_tables.py [--check]; got {' '.join(argv)!r}")
        return 2
    for name, (page, make) in BLOCKS.items():
        path = DOCS / page
        path.write_text(rewrite(path.read_text(), name, make()))
    print("rewrote " + ", ".join(f"docs/{page} ({name})" for name, (page, _) in BLOCKS.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
