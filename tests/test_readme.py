"""The result tables of the README and of every study's README are the committed reports' own: every table is
marked with the report it comes from (``<!-- from <path>/report.md -->``, the path relative to the README that
cites it) and must appear in that file verbatim, so a figure in a README always names the run it came from and
cannot drift from it. Where the report holds two tables with the same header (in and out of distribution, per
seed), the marker also names the report's heading the table stands under (``<!-- from results/report.md, under
"Out of distribution" -->``, the heading's first words), so a README cannot show one under the other's caption."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

MARKER = re.compile(r'<!-- from ([\w./-]+/report\.md)(?:, under "([^"]+)")? -->')
#: The front door's tables stand in its Results section; a study README is all results.
READMES = [REPO / "README.md", *sorted(REPO.glob("experiments/*/README.md"))]


def marked_tables(section: str) -> list[tuple[str | None, str | None, str]]:
    """``(cited report, the report's heading it names or None, table text)`` for every markdown table of
    ``section``: a marker cites the one table that follows it; a table with no marker since the last table cites
    none (None)."""
    out, cited, heading, block = [], None, None, []
    for line in [*section.splitlines(), ""]:
        if (match := MARKER.search(line)) is not None:
            cited, heading = match.groups()
        if line.startswith("|"):
            block.append(line)
        elif block:
            out.append((cited, heading, "\n".join(block)))
            cited, heading, block = None, None, []
    return out


def tables(section: str) -> list[tuple[str | None, str]]:
    """``(cited report, table text)`` for every markdown table of ``section`` (``marked_tables`` less headings)."""
    return [(cited, table) for cited, _, table in marked_tables(section)]


def cited_tables(readme: Path) -> list[tuple[str, str]]:
    """The tables of ``readme`` that cite a report (a table before any marker cites none: a layout table)."""
    return [(cited, table) for cited, table in tables(readme.read_text()) if cited is not None]


def under(report: str, heading: str) -> str:
    """The text of ``report`` from the heading line that starts with ``heading`` (any level) to the next heading."""
    found = re.search(rf"^#+ {re.escape(heading)}.*?$(.*?)(?=^#|\Z)", report, re.M | re.S)
    assert found is not None, f"the report has no heading starting {heading!r}"
    return found.group(1)


def check_cited(report: str, heading: str | None, table: str) -> None:
    """A cited table stands in its report verbatim; under ``heading`` when one is named, and one is named when
    another table of the report has the same header row."""
    header = table.splitlines()[0]
    if heading is not None:
        assert table in under(report, heading), f"no table under {heading!r} reads:\n{table[:300]}"
        return
    assert table in report, f"the report holds no such table:\n{table[:300]}"
    twins = [line for line in report.splitlines() if line == header]
    assert len(twins) == 1, f"{len(twins)} tables of the report have the header {header!r}: name the heading"


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_cited_table_is_a_committed_report_table(readme):
    for cited, heading, table in marked_tables(readme.read_text()):
        if cited is None:
            continue
        report = (readme.parent / cited).resolve()
        assert report.is_file(), f"{readme}: {cited} is not committed"
        check_cited(report.read_text(), heading, table)


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


def test_a_table_under_the_wrong_twin_heading_is_caught():
    """The per-seed tables in and out of distribution share their header; a README that shows the first under the
    second's caption fails, and an unnamed twin asks for its heading."""
    table_in, table_out = ("| task | seed |\n|---|---|\n| copy | 1.00 |", "| task | seed |\n|---|---|\n| copy | 0.04 |")
    report = f"# r\n\n#### In distribution: EM\n\n{table_in}\n\n#### Out of distribution (test): EM\n\n{table_out}\n"
    section = f'<!-- from results/report.md, under "Out of distribution" -->\n\n{table_in}\n'
    [(cited, heading, table)] = marked_tables(section)
    assert (cited, heading) == ("results/report.md", "Out of distribution")
    with pytest.raises(AssertionError, match="no table under"):
        check_cited(report, heading, table)
    check_cited(report, heading, table_out)
    with pytest.raises(AssertionError, match="name the heading"):
        check_cited(report, None, table_out)
