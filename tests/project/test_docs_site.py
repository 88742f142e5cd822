"""The docs site's maths: the docstrings' reST maths becomes the site's maths markup
(``docs/docstring_math.py``, run by the griffe extension on every docstring), and the check of a
built site (``docs/check_site.py``, which ``.ci/run`` runs after ``mkdocs build --strict``)
finds a page left with raw maths, no maths markup or no KaTeX. Neither needs mkdocs installed.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_{name}", REPO / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


docstring_math = load("docstring_math")
check_site = load("check_site")


def test_inline_roles_and_display_directives_become_arithmatex_markup():
    text = (
        "Along :math:`\\theta(\\lambda)` the barrier\n"
        "\n"
        ".. math:: B = \\max_\\lambda L(\\lambda)\n"
        "    - [\\lambda L(1) + (1-\\lambda) L(0)],\n"
        "\n"
        "with :math:`L` the loss.\n"
        "    .. math::\n"
        "\n"
        "        x = 1\n"
        "    done"
    )
    assert docstring_math.math_to_markdown(text).split("\n") == [
        "Along \\(\\theta(\\lambda)\\) the barrier",
        "",
        "$$",
        "B = \\max_\\lambda L(\\lambda)",
        "- [\\lambda L(1) + (1-\\lambda) L(0)],",
        "$$",
        "",
        "with \\(L\\) the loss.",
        "",
        "    $$",
        "    x = 1",
        "    $$",
        "",
        "    done",
    ]


def source_docstrings() -> list[tuple[str, str]]:
    """(where, docstring) of every module, class and function of the three packages."""
    found = []
    for folder in ("fedlmc", "strategies", "simulations"):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(
                    node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
                ):
                    doc = ast.get_docstring(node)
                    if doc and ("math::" in doc or ":math:" in doc):
                        found.append(
                            (f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 1)}", doc)
                        )
    return found


def test_every_docstring_maths_of_the_packages_converts_completely():
    """No reST maths is left, every display is a closed $$ block with an expression, and every
    inline expression is delimited: what the strict site build cannot see."""
    docs = source_docstrings()
    assert len(docs) >= 20  # the 23 displays and the inline roles of the API pages
    for where, doc in docs:
        text = docstring_math.math_to_markdown(doc)
        assert ".. math::" not in text and ":math:`" not in text, where
        fences = [i for i, line in enumerate(text.split("\n")) if line.strip() == "$$"]
        assert len(fences) % 2 == 0, where
        for start, end in zip(fences[::2], fences[1::2], strict=True):
            assert end > start + 1, where  # an expression between the fences
        assert text.count("\\(") == text.count("\\)"), where


PAGE = """<html><head><link rel="stylesheet" href="../assets/katex/katex.min.css"></head>
<body><p>Path <span class="arithmatex">\\(\\theta(\\lambda)\\)</span></p>
<div class="arithmatex">\\[ B = 1 \\]</div>
<script src="../assets/katex/katex.min.js"></script>
<script src="../assets/katex-init.js"></script></body></html>"""


@pytest.fixture
def site(tmp_path) -> tuple[Path, Path]:
    """A docs folder with one maths page and its built site, as mkdocs lays it out."""
    docs, site = tmp_path / "docs", tmp_path / "site"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n")
    (docs / "maths.md").write_text("Path \\(\\theta\\)\n\n$$\nB = 1\n$$\n")
    shown = "Write `\\(x\\)` or `` :math:`x` ``:\n\n```text\n$$\nx\n$$\n```\n"
    (docs / "development.md").write_text(shown)  # maths shown as code: no maths expected
    (site / "maths").mkdir(parents=True)
    (site / "index.html").write_text("<html></html>")
    (site / "maths" / "index.html").write_text(PAGE)
    fonts = site / "assets" / "katex" / "fonts"
    fonts.mkdir(parents=True)
    (fonts / "KaTeX_Main-Regular.woff2").write_bytes(b"wOF2")
    css = "@font-face{src:url(fonts/KaTeX_Main-Regular.woff2) format('woff2')}"
    (site / "assets" / "katex" / "katex.min.css").write_text(css)
    (site / "assets" / "katex" / "katex.min.js").write_text("var katex;")
    (site / "assets" / "katex-init.js").write_text("renderArithmatex();")
    return docs, site


def test_a_site_with_rendered_maths_markup_passes(site):
    docs, built = site
    assert check_site.pages_with_math(docs) == ["maths.md"]
    assert check_site.check_site(built, docs) == []


def test_raw_maths_missing_markup_and_missing_katex_are_named(site):
    docs, built = site
    page = built / "maths" / "index.html"
    page.write_text(PAGE.replace('<span class="arithmatex">', "<span>.. math:: "))
    (built / "assets" / "katex-init.js").unlink()
    (built / "assets" / "katex" / "fonts" / "KaTeX_Main-Regular.woff2").unlink()
    problems = check_site.check_site(built, docs)
    assert problems == [
        "assets/katex/fonts/KaTeX_Main-Regular.woff2 is not in the site",
        "maths.md: reStructuredText maths left as text (.. math:: or :math:)",
        "maths.md: ../assets/katex-init.js is not in the site",
    ]
    page.write_text(re.sub(r'<div class="arithmatex">.*?</div>', "", PAGE, flags=re.S))
    page.write_text(page.read_text().replace('class="arithmatex"', ""))
    assert 'maths.md: no maths markup (class="arithmatex")' in check_site.check_site(built, docs)


def test_an_api_page_whose_module_holds_maths_must_show_maths(tmp_path):
    docs = tmp_path / "docs"
    (docs / "api").mkdir(parents=True)
    (docs / "api" / "analysis.md").write_text("# Analysis\n\n::: fedlmc.analysis.diagnostics\n")
    (docs / "api" / "data.md").write_text("# Data\n\n::: fedlmc.data.catalog\n")
    assert check_site.pages_with_math(docs) == ["api/analysis.md"]
