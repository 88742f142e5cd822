"""The spread beside every mean of ``report.md`` (``simulations/report/markdown.py``, issue 34
"Seeds and spread"): on a constructed results frame, every table that averages over seeds
prints ``mean ± std`` (ddof = 1, named at the top) and the seed count where there are fewer
than three seeds."""

from __future__ import annotations

import pandas as pd

from fedlmc.simulations.report.markdown import report_markdown

SETTINGS = {"dpi": 60, "error-bars": "std", "title": ""}


def results(seeds_per_width: dict[float, tuple[int, ...]]) -> pd.DataFrame:
    """Two-client cells of ``average`` and ``weight_matching``: accuracy ``0.5 + 0.1 * seed``
    (std over seeds 0, 1, 2 exactly 0.1), endpoints ``0.9 + 0.01 * seed``."""
    rows = []
    for width, seeds in seeds_per_width.items():
        for seed in seeds:
            for method in ("average", "weight_matching"):
                rows.append(
                    {
                        "cell_id": f"{width}-{seed}",
                        "status": "ok",
                        "method": method,
                        "width": width,
                        "seed": seed,
                        "accuracy": 0.5 + 0.1 * seed,
                        "endpoint_acc_mean": 0.9 + 0.01 * seed,
                        "loss_barrier_half": 1.0 + seed,
                    }
                )
    return pd.DataFrame(rows)


def section(text: str, heading: str) -> str:
    return text.split(heading)[1].split("\n## ")[0]


def test_every_averaged_table_shows_the_spread_and_the_seed_count(tmp_path):
    text = report_markdown(results({1.0: (0, 1, 2), 4.0: (0, 1)}), {}, [], tmp_path, SETTINGS)
    assert "standard deviation over seeds (ddof = 1)" in text
    accuracy = section(text, "## Merged test accuracy (mean ± std over seeds)")
    # width 1: three seeds, no count; width 4: two seeds, the count named
    assert "| average | 0.6000 ± 0.1000 | 0.5500 ± 0.0707 (n=2) |" in accuracy
    references = section(text, "## Reference accuracies (mean ± std over seeds)")
    assert "| endpoint_acc_mean | 0.9100 ± 0.0100 | 0.9050 ± 0.0071 (n=2) |" in references
    table1 = section(text, "## Barriers at lambda = 1/2")
    assert "| 1 | 2.0000 ± 1.0000 | 2.0000 ± 1.0000 |" in table1
    assert "| 4 | 1.5000 ± 0.7071 (n=2) |" in table1


def test_a_single_seed_says_so_in_every_cell(tmp_path):
    text = report_markdown(results({1.0: (3,)}), {}, [], tmp_path, SETTINGS)
    accuracy = section(text, "## Merged test accuracy")
    assert "| average | 0.8000 (n=1) |" in accuracy
    assert "±" not in accuracy.split("|---|")[1]
    assert "| endpoint_acc_mean | 0.9300 (n=1) |" in section(text, "## Reference accuracies")
