"""The result tables of the README and of every study's README are the committed reports' own: every table is
marked with the report it comes from (``<!-- from <path>/report.md -->``, the path relative to the README that
cites it) and must appear in that file verbatim, so a figure in a README always names the run it came from and
cannot drift from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

MARKER = re.compile(r"<!-- from ([\w./-]+/report\.md) -->")
#: The front door's tables stand in its Results section; a study README is all results.
READMES = [REPO / "README.md", *sorted(REPO.glob("experiments/*/README.md"))]


def tables(section: str) -> list[tuple[str | None, str]]:
    """``(cited report, table text)`` for every markdown table of ``section``: a marker cites the one table that
    follows it; a table with no marker since the last table cites none (None)."""
    out, cited, block = [], None, []
    for line in [*section.splitlines(), ""]:
        if (match := MARKER.search(line)) is not None:
            cited = match.group(1)
        if line.startswith("|"):
            block.append(line)
        elif block:
            out.append((cited, "\n".join(block)))
            cited, block = None, []
    return out


def cited_tables(readme: Path) -> list[tuple[str, str]]:
    """The tables of ``readme`` that cite a report (a table before any marker cites none: a layout table)."""
    return [(cited, table) for cited, table in tables(readme.read_text()) if cited is not None]


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_cited_table_is_a_committed_report_table(readme):
    for cited, table in cited_tables(readme):
        report = (readme.parent / cited).resolve()
        assert report.is_file(), f"{readme}: {cited} is not committed"
        assert table in report.read_text(), f"a table of {readme} differs from {cited}:\n{table[:300]}"


def test_every_study_readme_with_a_report_shows_its_tables():
    for readme in READMES[1:]:
        if (readme.parent / "results/report.md").is_file():
            assert any(cited == "results/report.md" for cited, _ in cited_tables(readme)), \
                f"{readme} shows no table of its own report"


def test_the_check_catches_a_changed_number():
    report = "| method | 128 |\n|---|---|\n| nope | 35.1 [34.8, 35.4] |\n"
    section = f"<!-- from results/report.md -->\n\n{report.replace('35.1', '35.2')}\ntext\n\n{report}"
    (cited, table), (uncited, _) = tables(section)
    assert cited == "results/report.md" and table not in report and uncited is None
