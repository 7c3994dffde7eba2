"""The README's result tables are the committed reports' own: every table of its Results section is marked with
the report it comes from (``<!-- from experiments/results/<study>/report.md -->``) and must appear in that file
verbatim, so a figure in the README always names the run it came from and cannot drift from it."""

from __future__ import annotations

import re

from tests.conftest import REPO

MARKER = re.compile(r"<!-- from (experiments/results/[\w./-]+/report\.md) -->")


def results_section() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("\n## Results")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def tables(section: str) -> list[tuple[str | None, str]]:
    """``(cited report, table text)`` for every markdown table of ``section``: the report is the last marker
    before the table."""
    out, cited, block = [], None, []
    for line in [*section.splitlines(), ""]:
        if (match := MARKER.search(line)) is not None:
            cited = match.group(1)
        if line.startswith("|"):
            block.append(line)
        elif block:
            out.append((cited, "\n".join(block)))
            block = []
    return out


def test_every_results_table_is_a_committed_report_table():
    found = tables(results_section())
    assert found, "the README's Results section has no table"
    for cited, table in found:
        assert cited is not None, f"a results table cites no report:\n{table[:200]}"
        report = REPO / cited
        assert report.is_file(), f"{cited} is not committed"
        assert table in report.read_text(), f"a README table differs from {cited}:\n{table[:300]}"


def test_the_check_catches_a_changed_number(tmp_path):
    report = "| method | 128 |\n|---|---|\n| nope | 35.1 [34.8, 35.4] |\n"
    section = f"<!-- from experiments/results/x/report.md -->\n\n{report.replace('35.1', '35.2')}"
    (cited, table), = tables(section)
    assert cited == "experiments/results/x/report.md" and table not in report
