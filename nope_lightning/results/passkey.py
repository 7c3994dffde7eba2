"""The passkey section of ``evaluate``'s result: every prompt's outcome as a named record, and the accuracies
per length and per (length, depth) cell.

On disk each outcome is a row ``[length, depth, key, correct]``; the key's token counts are a list beside the
rows (``key_tokens``, one per row), so a reader that predates them still reads the rows. Files written before
the counts were recorded have no such list: their outcomes read ``key_tokens=None`` (unknown)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nope_lightning.results.core import int_keys


@dataclass(frozen=True)
class PasskeyOutcome:
    """One prompt: its length (tokens), the key's depth (0-1 of the haystack), the key, and whether the
    model's answer was exactly the key. The prompt is the same for every method: ``prompt`` identifies it.
    ``key_tokens``: how many tokens the answer (the key's tokens, generated right after the prompt) takes, so
    the answer occupies positions ``length + 1 .. length + key_tokens`` (1-based); None when not recorded.
    ``key_nll``: the answer's teacher-forced NLL given the prompt, nats per answer token (None: not recorded,
    results written before it was)."""

    length: int
    depth: float
    key: str
    correct: bool
    key_tokens: int | None = None
    key_nll: float | None = None

    @property
    def prompt(self) -> tuple[int, float, str]:
        return self.length, self.depth, self.key


@dataclass(frozen=True)
class PasskeyCell:
    """Accuracy (0-1) over the keys of one (length, depth) cell."""

    length: int
    depth: float
    accuracy: float


@dataclass(frozen=True)
class PasskeyResults:
    """The passkey part: the prompt style, accuracy per length with its Wilson 95 % interval and overall, per
    cell, and every prompt's outcome (the report pairs methods on the same prompts)."""

    prompt: str
    by_length: dict[int, float]
    overall: float
    by_length_interval: dict[int, tuple[float, float]]
    by_cell: list[PasskeyCell]
    samples: list[PasskeyOutcome]

    def at(self, length: int | None) -> list[PasskeyOutcome]:
        """The outcomes at ``length`` tokens (None: every length), in prompt order."""
        return [s for s in self.samples if length is None or s.length == length]

    def key_nll_by_length(self) -> dict[int, float]:
        """Mean teacher-forced key NLL (nats per answer token) per length, for the lengths whose every prompt
        recorded one."""
        by: dict[int, list[float | None]] = {}
        for s in self.samples:
            by.setdefault(s.length, []).append(s.key_nll)
        return {n: sum(v) / len(v) for n, v in by.items() if None not in v}

    def body(self) -> dict[str, Any]:
        out = {"prompt": self.prompt, "by_length": self.by_length, "overall": self.overall,
               "by_length_interval": {n: list(i) for n, i in self.by_length_interval.items()},
               "by_cell": [[c.length, c.depth, c.accuracy] for c in self.by_cell],
               "samples": [[s.length, s.depth, s.key, s.correct] for s in self.samples]}
        counts = [s.key_tokens for s in self.samples]
        if None not in counts:
            out["key_tokens"] = counts
        nll = [s.key_nll for s in self.samples]
        if None not in nll:
            out["key_nll"] = nll
        return out

    @classmethod
    def parse(cls, data: dict[str, Any]) -> PasskeyResults:
        rows = data["samples"]
        counts = data.get("key_tokens", [None] * len(rows))
        nll = data.get("key_nll", [None] * len(rows))
        return cls(data.get("prompt", ""), int_keys(data.get("by_length", {})), data.get("overall", 0.0),
                   {n: tuple(i) for n, i in int_keys(data.get("by_length_interval", {})).items()},
                   [PasskeyCell(*cell) for cell in data.get("by_cell", [])],
                   [PasskeyOutcome(*row, key_tokens=k, key_nll=n) for row, k, n in zip(rows, counts, nll, strict=True)])

