"""mkdocs hooks (`mkdocs.yml: hooks`) of the documentation site.

- The reference pages that `scripts/gen_docs_reference.py` generates from the code are added to
  the site at build time, so they cannot drift from the code (no copy of them is kept in docs/).
- `<!-- race:docstring MODULE -->` in a page is replaced by that module's docstring, for pages
  that show what the code itself says (the cover's algorithm, the store's layout).
- Math (`$...$`, `$$...$$`, through pymdownx.arithmatex) is turned into MathML at build time with
  latex2mathml: browsers render it natively, so the site loads no script from anywhere.
"""

from __future__ import annotations

import html
import importlib
import inspect
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gen_docs_reference import PAGES  # noqa: E402 - a script beside this one, not a package

_DOCSTRING = re.compile(r"<!-- race:docstring ([\w.]+) -->")
_MATH = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
_MTEXT = re.compile(r"(<mtext[^>]*>)(.*?)(</mtext>)", re.S)


def _escaped_text(match: re.Match[str]) -> str:
    """latex2mathml copies \\text{...} as it is: `\\texttt{</think>}` must not become a tag."""
    return match[1] + match[2].replace("<", "&lt;").replace(">", "&gt;") + match[3]


def on_files(files, config):
    from mkdocs.structure.files import File

    for name, build in PAGES.items():
        files.append(File.generated(config, name, content=build()))
    return files


def on_page_markdown(markdown, page, config, files):
    def docstring(match: re.Match[str]) -> str:
        return inspect.getdoc(importlib.import_module(match[1])) or ""

    return _DOCSTRING.sub(docstring, markdown)


def on_page_content(content, page, config, files):
    from latex2mathml.converter import convert

    def mathml(match: re.Match[str]) -> str:
        tex = html.unescape(match[2]).strip()
        block = match[1] == "div"
        for opening, closing in (("\\[", "\\]"), ("\\(", "\\)")):
            if tex.startswith(opening) and tex.endswith(closing):
                tex = tex[len(opening):-len(closing)]
        return _MTEXT.sub(_escaped_text, convert(tex, display="block" if block else "inline"))

    return _MATH.sub(mathml, content)
