"""The docstrings' reStructuredText maths as the site's maths markup (no griffe needed).

The docstrings write maths the Sphinx way: ``:math:`x``` inline and a ``.. math::`` directive
(its expression on the directive's line and/or on the more indented lines after it) for a
display. The site renders maths with KaTeX from the ``pymdownx.arithmatex`` markup (generic
mode, ``mkdocs.yml``): ``\\(x\\)`` inline and a ``$$`` block for a display, which
:func:`math_to_markdown` writes. Used by the griffe extension ``griffe_roles.py`` on every
docstring, whatever its style (Sphinx, NumPy or Google sections).
"""

from __future__ import annotations

import re

INLINE = re.compile(r":math:`([^`]+)`")
DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)\.\. math::[ \t]*(?P<first>.*)$")


def inline_math(text: str) -> str:
    """Every ``:math:`x``` of ``text`` as ``\\(x\\)``."""
    return INLINE.sub(lambda m: rf"\({m.group(1)}\)", text)


def indent_of(line: str) -> int:
    """The width of the line's leading whitespace."""
    return len(line) - len(line.lstrip())


def directive_body(lines: list[str], start: int, indent: int) -> tuple[list[str], int]:
    """The expression lines after a ``.. math::`` line at ``start`` (indented deeper than the
    directive; one blank line may separate them from it) and the index after them."""
    body: list[str] = []
    i = start + 1
    if i < len(lines) and not lines[i].strip() and i + 1 < len(lines):
        if lines[i + 1].strip() and indent_of(lines[i + 1]) > indent:
            i += 1  # the body after a blank line
    while i < len(lines) and lines[i].strip() and indent_of(lines[i]) > indent:
        body.append(lines[i].strip())
        i += 1
    return body, i


def display_math(text: str) -> str:
    """Every ``.. math::`` directive of ``text`` as a ``$$`` block at the directive's indent,
    with a blank line before and after it."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = DIRECTIVE.match(lines[i])
        if match is None:
            out.append(lines[i])
            i += 1
            continue
        pad = match["indent"]
        body, i = directive_body(lines, i, len(pad))
        expression = [match["first"].strip(), *body] if match["first"].strip() else body
        if out and out[-1].strip():
            out.append("")
        out += [f"{pad}$$", *(f"{pad}{line}" for line in expression), f"{pad}$$"]
        if i < len(lines) and lines[i].strip():
            out.append("")
    return "\n".join(out)


def math_to_markdown(text: str) -> str:
    """A docstring's ``.. math::`` displays and ``:math:`` roles as the site's maths markup."""
    return inline_math(display_math(text))
