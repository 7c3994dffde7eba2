"""Markdown tables written in one place, so that a cell holding ``|`` (a rule such as ``|effect| <= 0.1``, a
method label) stays in its own column in every renderer (python-markdown, GitHub, a browser's view of the
HTML report): the pipe is escaped as ``\\|``, which renders as ``|``; a number with its interval written as
every table of both papers writes it (``cell``: "—" when missing, marked when the interval misses its
estimate); and the report's markdown as one HTML page.
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import markdown

from nope_lightning.numerics.stats import Interval

MISSING = "—"


#: Marks an interval that does not contain its own estimate (``Interval.covers_estimate``).
BIASED = "†"
BIASED_NOTE = (f"{BIASED} The estimate lies outside its bootstrap interval: resampling biases this statistic (a "
               "non-smooth one, such as an R^2 of per-position best-lambda fits), so the interval shows the spread, "
               "not where the value lies.")


def escape(cell: Any) -> str:
    """A cell's text with its pipes escaped."""
    return str(cell).replace("|", "\\|")


def render(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    """``| a | b |`` lines: the header, the rule, one line per row (no trailing newline)."""
    lines = ["| " + " | ".join(map(escape, header)) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(escape, row)) + " |" for row in rows])


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    """A markdown table (cells escaped: ``render``); a footnote follows it when a cell carries
    the ``BIASED`` mark."""
    note = any(BIASED in str(c) for row in rows for c in row)
    return render(header, rows) + (f"\n\n{BIASED_NOTE}" if note else "")


def cell(interval: Interval | None, show: Callable[[float], str] = "{:.2f}".format) -> str:
    """'estimate [low, high]', marked ``BIASED`` when the interval misses its estimate; '—' when missing."""
    if interval is None or math.isnan(interval.estimate):
        return MISSING
    if math.isnan(interval.low) or math.isnan(interval.high):
        return show(interval.estimate)
    mark = "" if interval.covers_estimate else BIASED
    return f"{show(interval.estimate)} [{show(interval.low)}, {show(interval.high)}]{mark}"


class Footnotes:
    """Notes that a table's cells point to by a short marker (``[1]``, ``[2]``, … in the order first marked)
    and that are printed once below it: a long note repeated row after row would bury the row's numbers."""

    def __init__(self) -> None:
        self.notes: dict[str, int] = {}

    def mark(self, note: str) -> str:
        """The marker of ``note`` (a note marked twice keeps its first number)."""
        return f"[{self.notes.setdefault(note, len(self.notes) + 1)}]"

    def render(self) -> str:
        """One ``* [n] note`` line per note ('' without notes)."""
        return "\n".join(f"* [{n}] {note}" for note, n in self.notes.items())


def html_page(markdown_text: str, folder: Path, title: str) -> str:
    """The report as one self-contained HTML page (tables, and the PNGs embedded as data URIs), so MLflow's
    artifact viewer and a browser show it whole without the neighbouring files."""
    body = markdown.markdown(markdown_text, extensions=["tables"])

    def embed(match: re.Match) -> str:
        png = folder / html.unescape(match.group(1))
        if not png.is_file():
            return match.group(0)
        return f'src="data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}"'

    body = re.sub(r'src="([^"]+\.png)"', embed, body)
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;line-height:1.4}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:3px 8px;"
             "text-align:right}td:first-child,th:first-child{text-align:left}img{max-width:100%}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n{body}\n</body></html>\n")
