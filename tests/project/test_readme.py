"""The README and the docs pages: their code blocks are the example files and run as shown, and
every import they show works."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PAGES = {
    path.relative_to(ROOT).as_posix(): path.read_text()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
}
"""Every page a reader sees: the README and each Markdown page of the docs site."""


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def output_after(text: str, block: str) -> str:
    """The first unlabelled fenced block after ``block`` in ``text``: what the page says it
    printed."""
    return re.match(r"```\s*\n.*?```\n(.*?)```", text.split(block, 1)[1], flags=re.S).group(1)


@pytest.mark.parametrize(
    ("example", "page"),
    [
        ("merge_two_mlps.py", "docs/library.md"),
        ("my_server_app.py", "docs/federation.md"),
        ("custom_cnn.py", "docs/own_model.md"),
    ],
)
def test_the_docs_show_the_example_file_verbatim(example: str, page: str) -> None:
    assert (ROOT / "examples" / example).read_text() in python_blocks(PAGES[page])


def test_quick_start_commands_are_the_ci_commands() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    commands = re.findall(r"```bash\n(python3 -m venv .*?)\n```", README)
    assert len(commands) >= 2
    assert "fedlmc sweep configs/quick.toml" in commands[0]
    # CI runs the README's test command one step per line (a failed step stops it, `set -e`)
    ci_lines = ci.splitlines()
    steps = commands[1].split(" && ")
    assert len(steps) == 3 and all(step in ci_lines for step in steps)
    positions = [ci_lines.index(step) for step in steps]
    assert positions == sorted(positions)
    # the docs' home page shows the same two commands
    assert "\n".join(commands[:2]) in PAGES["docs/index.md"]


def test_the_docs_home_page_shows_the_readme_intro_and_layout() -> None:
    def layout(text: str) -> str:
        return text.split("## Layout\n", 1)[1].split("\n## ", 1)[0].strip()

    def intro(text: str) -> str:
        return text.split("## Quick start\n", 1)[0].strip()

    assert "| `fedlmc/` |" in layout(README) and "arXiv 2510.08023" in intro(README)
    assert layout(PAGES["docs/index.md"]) == layout(README)
    assert intro(PAGES["docs/index.md"]) == intro(README)


def test_the_readme_links_to_files_that_exist() -> None:
    """The README's relative links and images (the docs pages and figures) point at files; the
    docs pages' own links are checked by the strict site build (``mkdocs build --strict``)."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if "://" not in t]
    assert len(local) >= 10 and "docs/results.md" in local
    assert [t for t in local if not (ROOT / t).is_file()] == []


@pytest.mark.slow
def test_data_snippet_runs_and_prints_what_the_docs_show(tmp_path: Path) -> None:
    page = PAGES["docs/library.md"]
    block = next(b for b in python_blocks(page) if "plot_label_distribution(parts" in b)
    shown = re.match(r"```\s*```\n(.*?)```", page.split(block, 1)[1], flags=re.S).group(1)
    (tmp_path / "results").mkdir()
    out = subprocess.run(
        [sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == shown.strip()
    assert (tmp_path / "results" / "mnist5k_dirichlet.png").stat().st_size > 0


IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+(?:fedlmc|strategies|simulations)(?:\.\w+)*[ \t]+import[ \t]+"
    r"(?:\([^)]*\)|[^\n]*)|import[ \t]+(?:fedlmc|strategies|simulations)\b[^\n]*)",
    flags=re.M,
)


def shown_imports() -> list[tuple[str, str]]:
    """(page, statement) for every import of fedlmc, strategies or simulations in any fenced
    code block of any page, in page order."""
    found = []
    for page, text in PAGES.items():
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
            found += [(page, m.group(0).strip()) for m in IMPORT.finditer(block)]
    return found


@pytest.mark.slow
def test_every_import_the_pages_show_works() -> None:
    """Each import statement of a code block runs (in one fresh interpreter, each statement on
    its own); the failures are listed with their page."""
    imports = shown_imports()
    pages = {page for page, _ in imports}
    assert len(imports) >= 15 and {"README.md", "docs/library.md", "docs/federation.md"} <= pages
    script = (
        f"for page, statement in {imports!r}:\n"
        "    try:\n"
        "        exec(statement, {})\n"
        "    except Exception as error:\n"
        "        print(page, '|', statement, '|', type(error).__name__, error)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout == "", out.stdout


@pytest.mark.slow
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


DRIFT = 0.04
"""How far a printed number may be from the page's: float32 training on another CPU's BLAS
drifts; on an AMD EPYC the NLL moved by 0.012 and a barrier by 0.013 after 10 epochs (the
pages' numbers were measured on one x86 CPU). Three times the largest drift seen."""

NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")
"""A number as the pages print it (``0.756``, ``-0.013``, ``2``), not a digit inside a name."""


def assert_prints_what_is_shown(printed: str, shown: str, tolerance: float = DRIFT) -> None:
    """``printed`` (a command's stdout) is the page's output block ``shown``: as many non-empty
    lines, the same words in each (columns, methods, ``NaN``, messages; spacing aside) and every
    number within ``tolerance`` of the page's."""
    got = [line for line in printed.splitlines() if line.strip()]
    want = [line for line in shown.splitlines() if line.strip()]
    assert len(got) == len(want), f"{len(got)} lines printed, {len(want)} shown:\n{printed}"
    for line, page_line in zip(got, want, strict=True):
        words = NUMBER.sub("#", line).split()
        assert words == NUMBER.sub("#", page_line).split(), (line, page_line)
        pairs = zip(NUMBER.findall(line), NUMBER.findall(page_line), strict=True)
        assert all(abs(float(a) - float(b)) <= tolerance for a, b in pairs), (line, page_line)


def _merge_lines(text: str) -> dict[str, dict[str, float]]:
    """The example's two merge lines as {name: {acc, nll, nll_t, t, ece, ece_t, bar, bar_t}}."""
    pattern = (
        r"(plain average|weight matching)\s+acc (?P<acc>[\d.]+)\s+NLL (?P<nll>[\d.]+) -> "
        r"(?P<nll_t>[\d.]+) \(T=(?P<t>[\d.]+)\)\s+ECE (?P<ece>[\d.]+) -> (?P<ece_t>[\d.]+)"
        r"\s+max loss barrier (?P<bar>-?[\d.]+) -> (?P<bar_t>-?[\d.]+)\s+LEWC cos \[[\d., ]+\]"
    )
    found = {
        m.group(1): {k: float(v) for k, v in m.groupdict().items()}
        for m in re.finditer(pattern, text)
    }
    assert set(found) == {"plain average", "weight matching"}, text
    return found


@pytest.mark.slow
def test_merge_example_prints_what_the_docs_show() -> None:
    """The example prints the page's lines (same structure), the claims the page draws from
    them hold, and every number is within the CPU drift :data:`DRIFT` of the page's."""
    block = (ROOT / "examples" / "merge_two_mlps.py").read_text()
    shown = output_after(PAGES["docs/library.md"], block)
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "merge_two_mlps.py")],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    merges = _merge_lines(out)
    plain, matched = merges["plain average"], merges["weight matching"]
    assert matched["acc"] > plain["acc"]  # weight matching beats plain averaging
    for line in (plain, matched):  # a temperature lowers NLL and ECE, and the barrier
        assert line["nll_t"] < line["nll"] and line["ece_t"] < line["ece"]
        assert line["bar_t"] < line["bar"]
    assert plain["t"] < 1.0  # the plain average's logits shrink: T < 1 sharpens them
    assert matched["bar"] < plain["bar"] and matched["bar_t"] < plain["bar_t"]
    assert len(NUMBER.findall(shown)) > 20
    assert_prints_what_is_shown(out, shown)


@pytest.mark.slow
def test_readme_example_prints_what_the_readme_shows(tmp_path: Path) -> None:
    """The README's one example (two clients, plain average vs weight matching vs ensemble) prints
    one line per method as shown, weight matching beats the plain average, and every number is
    within :data:`DRIFT` of the README's."""
    block = python_blocks(README)[0]
    shown = output_after(README, block)
    out = subprocess.run(
        [sys.executable, "-c", block],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    line = r"^(\w+)\s+accuracy ([\d.]+)\s+nll ([\d.]+)$"
    printed = {m[0]: (float(m[1]), float(m[2])) for m in re.findall(line, out, flags=re.M)}
    expected = {m[0]: (float(m[1]), float(m[2])) for m in re.findall(line, shown, flags=re.M)}
    assert list(printed) == list(expected) == ["average_t", "weight_matching_t", "ensemble"]
    assert printed["weight_matching_t"][0] > printed["average_t"][0]
    assert_prints_what_is_shown(out, shown)


@pytest.mark.slow
@pytest.mark.timeout(400)  # 3x its quiet 132 s (docs/development.md, "Bounds")
def test_user_cnn_is_aligned_and_merged_in_simulation_without_a_hand_written_spec() -> None:
    """examples/custom_cnn.py: a user CNN (BatchNorm, a residual block) named by its file in the
    run config goes through training on Ray actors, weight and activation matching with a derived
    spec, and the diagnostics with derived layer names; aligning beats plain averaging, both
    alignments aligned the spec's 2 groups, and it prints what docs/own_model.md shows."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "custom_cnn.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {
        line.split()[0]: [float(v) for v in line.split()[1:]]
        for line in out.stdout.splitlines()
        if line.split() and line.split()[0].endswith(("_t", "ensemble"))
    }
    assert set(rows) == {"average_t", "weight_matching_t", "activation_matching_t", "ensemble"}
    for method in ("weight_matching_t", "activation_matching_t"):
        assert rows[method][0] > rows["average_t"][0]  # accuracy: alignment helps
        assert rows[method][2] < rows["average_t"][2]  # calibrated barrier at 1/2 is lower
        assert 0.0 < rows[method][3] <= 1.0  # LLFC cosine over the derived layer names
    # the residual block: LEWC's columns are NaN with the reason, never a number
    assert "LEWC: no single depth exponent" in out.stdout
    # the residual stream and the block's inner convolution, aligned by both methods
    groups = "permutation groups aligned: {'weight_matching_t': 2, 'activation_matching_t': 2}"
    assert groups in out.stdout
    block = (ROOT / "examples" / "custom_cnn.py").read_text()
    assert_prints_what_is_shown(out.stdout, output_after(PAGES["docs/own_model.md"], block))


def test_derived_spec_snippet_computes_what_its_comments_show() -> None:
    """docs/own_model.md's first block: torchvision's ResNet-18 has the group count and the
    layer names its comments show."""
    page = PAGES["docs/own_model.md"]
    block = re.search(r"```\n(import torch, torchvision\n.*?)```", page, flags=re.S).group(1)
    groups = int(re.search(r"# (\d+) groups", block).group(1))
    shown = re.search(r"# (\[.*\])", block).group(1).strip("[]").split(", ")
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(block, namespace)  # the page's own snippet, as shown
    layers = namespace["layers"]
    assert len(namespace["spec"].perm_to_axes) == groups == 12
    first, last = shown[: shown.index("...")], shown[shown.index("...") + 1 :]
    assert [f"'{n}'" for n in layers[: len(first)]] == first
    assert [f"'{n}'" for n in layers[-len(last) :]] == last


def test_the_cell_counts_next_to_sweep_commands_are_the_configs() -> None:
    """A ``fedlmc sweep configs/x.toml  # N cells`` comment on any page is what ``fedlmc
    validate`` counts for that file (no training: the grid is only expanded)."""
    from fedlmc.simulations.config import expand_grid, load_sweep_config

    pattern = r"fedlmc sweep (configs/\S+\.toml)\s+# (\d+) cells"
    shown = [(m[0], int(m[1])) for text in PAGES.values() for m in re.findall(pattern, text)]
    assert ("configs/widths_quick.toml", 32) in shown
    for path, count in shown:
        assert len(expand_grid(load_sweep_config(ROOT / path, check_devices=False))) == count
