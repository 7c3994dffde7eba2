"""Markdown tables written in one place, so that a cell holding ``|`` (a rule such as ``|effect| <= 0.1``, a
method label) stays in its own column in every renderer (python-markdown, GitHub, a browser's view of the
HTML report): the pipe is escaped as ``\\|``, which renders as ``|``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def escape(cell: Any) -> str:
    """A cell's text with its pipes escaped."""
    return str(cell).replace("|", "\\|")


def render(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    """``| a | b |`` lines: the header, the rule, one line per row (no trailing newline)."""
    lines = ["| " + " | ".join(map(escape, header)) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(escape, row)) + " |" for row in rows])
