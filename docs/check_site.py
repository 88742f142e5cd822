"""Check a built docs site for rendered-maths markup: ``python docs/check_site.py SITE_DIR``.

``.ci/run`` runs it after ``mkdocs build --strict``. A page is expected to hold maths when its
Markdown does (``\\(``, ``$$`` or ``\\[``) or, for an API page (``docs/api/*.md``), when a module
it documents (its ``:::`` lines) has a ``:math:`` role or a ``.. math::`` directive in its
source. Such a page must hold ``pymdownx.arithmatex`` markup (``<span class="arithmatex">\\(...\\)``
inline, ``<div class="arithmatex">\\[...\\]`` display), no reStructuredText maths left as text,
and load the KaTeX the site serves itself (its script, the renderer ``katex-init.js`` and the
stylesheet, each present in the site, with every WOFF2 font the stylesheet names). Prints one
line per problem; exit status 1 when there is one.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
KATEX_FILES = ("assets/katex/katex.min.js", "assets/katex-init.js", "assets/katex/katex.min.css")
PROSE_MATH = re.compile(r"\\\(|^\s*\$\$|^\s*\\\[", re.MULTILINE)
RST_MATH = re.compile(r"\.\. math::|:math:`")
MARKUP = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.DOTALL)
DELIMITERS = {"span": ("\\(", "\\)"), "div": ("\\[", "\\]")}
MD_CODE = re.compile(r"^```.*?^```|``.*?``|`[^`\n]*`", re.DOTALL | re.MULTILINE)
CODE = re.compile(r"<code>.*?</code>", re.DOTALL)  # code may show reST maths on purpose
FONT = re.compile(r"url\((fonts/[^)]+\.woff2)\)")


def module_has_math(module: str) -> bool:
    """Whether the source of ``module`` (a package: its ``__init__``) holds reST maths."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise SystemExit(f"check_site: module {module!r} of an API page cannot be found")
    return bool(RST_MATH.search(Path(spec.origin).read_text(encoding="utf-8")))


def pages_with_math(docs: Path) -> list[str]:
    """The pages (relative ``.md`` paths) whose built HTML must hold maths (module docstring)."""
    pages = []
    for path in sorted(docs.rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        modules = re.findall(r"^::: ([\w.]+)", text, re.MULTILINE)
        prose = MD_CODE.sub("", text)  # maths shown as code is not maths
        if PROSE_MATH.search(prose) or any(module_has_math(m) for m in modules):
            pages.append(path.relative_to(docs).as_posix())
    return pages


def html_of(site: Path, page: str) -> Path:
    """The built file of a page (``use_directory_urls``: ``a/b.md`` -> ``a/b/index.html``)."""
    stem = page[: -len(".md")]
    if stem == "index" or stem.endswith("/index"):
        return site / f"{stem}.html"
    return site / stem / "index.html"


def markup_problems(page: str, html: str) -> list[str]:
    """A page's maths markup: present, well delimited, no reST maths left."""
    found = MARKUP.findall(html)
    problems = [] if found else [f'{page}: no maths markup (class="arithmatex")']
    for tag, body in found:
        left, right = DELIMITERS[tag]
        if not (body.strip().startswith(left) and body.strip().endswith(right)):
            problems.append(f"{page}: maths {body.strip()[:60]!r} not delimited by {left} {right}")
    if RST_MATH.search(CODE.sub("", html)):
        problems.append(f"{page}: reStructuredText maths left as text (.. math:: or :math:)")
    return problems


def asset_problems(site: Path, page: str, html_path: Path, html: str) -> list[str]:
    """The KaTeX files: linked from the page and present in the site."""
    problems = []
    for asset in KATEX_FILES:
        links = re.findall(rf'(?:src|href)="([^"]*{re.escape(asset)})"', html)
        if not links:
            problems.append(f"{page}: does not load {asset}")
        elif not (html_path.parent / links[0]).resolve().is_file():
            problems.append(f"{page}: {links[0]} is not in the site")
    return problems


def font_problems(site: Path) -> list[str]:
    """Every WOFF2 font the KaTeX stylesheet names, present beside it."""
    css = site / "assets/katex/katex.min.css"
    if not css.is_file():
        return ["assets/katex/katex.min.css is not in the site"]
    fonts = FONT.findall(css.read_text(encoding="utf-8"))
    missing = [f for f in fonts if not (css.parent / f).is_file()]
    return [f"assets/katex/{f} is not in the site" for f in missing] or (
        [] if fonts else ["katex.min.css names no WOFF2 font"]
    )


def check_site(site: Path, docs: Path = DOCS) -> list[str]:
    """Every problem of the built ``site`` (module docstring); [] when there is none."""
    problems = font_problems(site)
    pages = pages_with_math(docs)
    if not pages:
        problems.append(f"no page of {docs} holds maths")
    for page in pages:
        path = html_of(site, page)
        if not path.is_file():
            problems.append(f"{page}: not built ({path} is missing)")
            continue
        html = path.read_text(encoding="utf-8")
        problems += markup_problems(page, html) + asset_problems(site, page, path, html)
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python docs/check_site.py SITE_DIR", file=sys.stderr)
        return 2
    problems = check_site(Path(argv[0]))
    for line in problems:
        print(f"check_site: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
