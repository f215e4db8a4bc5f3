"""The documentation site: `mkdocs build --strict` passes (no broken link, anchor or nav entry), the
reference pages generated at build time name every command, option and config field the code has,
and the built pages load nothing from elsewhere (math is MathML, no CDN script)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from gen_docs_reference import cli_reference, config_reference, datasets_reference  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built with --strict: any warning (a broken link or anchor, a page not in the nav)
    fails the build."""
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                            capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                            timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return out


def _parsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield sub
                yield from _parsers(sub)


def test_the_cli_reference_names_every_command_and_option():
    from flows.cli import build_parser

    page = cli_reference()
    subparsers = list(_parsers(build_parser()))
    assert len(subparsers) > 10
    for sub in subparsers:
        assert f"## `{sub.prog}`" in page, sub.prog
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in page or f", {flag}" in page, (sub.prog, flag)


def test_the_config_reference_names_every_field_of_every_section():
    from race_core.config import SECTIONS, NightlyConfig, PipelineConfig, field_help, field_types

    page = config_reference()
    classes = [(PipelineConfig, ""), (NightlyConfig, ""), *((type(getattr(PipelineConfig(), s)), f"{s}.")
                                                            for s in SECTIONS)]
    for cls, prefix in classes:
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(field_types(cls)[f.name]):
                continue  # a section: its own table
            row = next((line for line in page.splitlines() if line.startswith(f"| `{prefix}{f.name}` |")), None)
            assert row is not None, prefix + f.name
            assert field_help(cls)[f.name].replace("*", "\\*").replace("<", "&lt;") in row
    assert "| `cover.epsilon` | `float` | `0.001` | `--epsilon`" in page


def test_the_datasets_reference_lists_every_column_and_reject_code():
    from race_core.schema import ERROR_CODES
    from storage.parquet import SCHEMAS

    page = datasets_reference()
    for kind, schema in SCHEMAS.items():
        section = page.split(f"## `{kind}`", 1)[1].split("\n## ", 1)[0]
        assert [f.name for f in schema] == re.findall(r"^\| `(\w+)` \|", section, re.M)
    for code in (*ERROR_CODES, "too_long", "no_success_flag"):
        assert f"| `{code}` |" in page


def test_the_built_site_has_every_page_math_as_mathml_and_no_remote_script(site):
    for page in ("index.html", "getting-started/index.html", "reference/cli/index.html",
                 "reference/config/index.html", "reference/datasets/index.html", "method/cover/index.html",
                 "guides/training-at-scale/index.html"):
        assert (site / page).is_file(), page
    losses = (site / "method" / "losses" / "index.html").read_text()
    assert losses.count("<math") >= 8 and 'class="arithmatex"' not in losses
    assert "&lt;/think&gt;" in losses  # \texttt{</think>} is text, not a tag
    for html in site.rglob("*.html"):
        assert not re.search(r'<script[^>]+src="(https?:)?//', html.read_text()), html
    assert "def logic_cover" not in (site / "method" / "cover" / "index.html").read_text()
    assert "LoGiC progressive cover" in (site / "method" / "cover" / "index.html").read_text()  # its docstring


def test_the_readme_links_only_to_files_that_exist_and_keeps_its_result_markers(tmp_path):
    """The README is short and points into docs/: every relative link must open a file on GitHub
    (the generated reference pages have no file, so it may not link to them), its two commands are
    the ones CI runs, and `race bench table --readme` finds its markers and leaves the rest alone."""
    from bench import records

    text = (ROOT / "README.md").read_text()
    links = [link.split("#")[0] for link in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in link]
    assert len(links) > 10
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, missing
    assert "```bash\nbash scripts/demo.sh\n```" in text and "```bash\nbash scripts/test.sh\n```" in text
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    for marker in ("<!-- real-model:begin -->", "<!-- real-model:end -->", records.TABLE_START, records.TABLE_END):
        assert text.count(marker) == 1, marker
    records_page = (ROOT / "docs" / "method" / "records.md").read_text()  # every record's table
    assert all(records_page.count(marker) == 1 for marker in (records.TABLE_START, records.TABLE_END))
    copy = tmp_path / "README.md"
    copy.write_text(text)
    records.replace_table(copy, "| new | table |\n")
    start, end = text.index(records.TABLE_START), text.index(records.TABLE_END)
    assert copy.read_text() == text[:start] + f"{records.TABLE_START}\n| new | table |\n" + text[end:]


def test_every_reference_to_the_architecture_page_names_one_of_its_sections():
    """The code cites the design as `docs/architecture.md §N`: each N is a section of that page."""
    sections = {int(m) for m in re.findall(r"^## (\d+)\. ", (ROOT / "docs" / "architecture.md").read_text(), re.M)}
    cited: dict[int, list[str]] = {}
    for path in ROOT.rglob("*"):
        if path.suffix not in (".py", ".md", ".sh") or any(part.startswith(".") or part == "site" for part in
                                                           path.relative_to(ROOT).parts):
            continue
        for n in re.findall(r"docs/architecture\.md §(\d+)", path.read_text(errors="replace")):
            cited.setdefault(int(n), []).append(str(path.relative_to(ROOT)))
    assert sections == set(range(1, 12)) and len(cited) >= 8
    assert set(cited) <= sections, {n: files for n, files in cited.items() if n not in sections}
    old = "DESIGN" + " §"  # the form references had while the design lived outside the repository
    assert not [p for p in ROOT.rglob("*.py") if ".venv" not in p.parts and old in p.read_text()]
