"""The passkey section of ``evaluate``'s result: every prompt's outcome as a named record, and the accuracies
per length and per (length, depth) cell."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nope_lightning.results.core import int_keys


@dataclass(frozen=True)
class PasskeyOutcome:
    """One prompt: its length (tokens), the key's depth (0-1 of the haystack), the key, and whether the
    model's answer was exactly the key. The prompt is the same for every method: ``prompt`` identifies it."""

    length: int
    depth: float
    key: str
    correct: bool

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

    def body(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "by_length": self.by_length, "overall": self.overall,
                "by_length_interval": {n: list(i) for n, i in self.by_length_interval.items()},
                "by_cell": [[c.length, c.depth, c.accuracy] for c in self.by_cell],
                "samples": [[s.length, s.depth, s.key, s.correct] for s in self.samples]}

    @classmethod
    def parse(cls, data: dict[str, Any]) -> PasskeyResults:
        return cls(data.get("prompt", ""), int_keys(data.get("by_length", {})), data.get("overall", 0.0),
                   {n: tuple(i) for n, i in int_keys(data.get("by_length_interval", {})).items()},
                   [PasskeyCell(*cell) for cell in data.get("by_cell", [])],
                   [PasskeyOutcome(*sample) for sample in data["samples"]])

