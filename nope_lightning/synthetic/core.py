"""Types and token helpers shared by every synthetic task.

Every task works on *tokens*: a digit, an operator, a symbol or a word is one string, so the
vocabulary is word/character level and a number like ``-12`` is the three tokens ``- 1 2``
(as in the paper, where numbers are written digit by digit).
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<sep>")
PAD, BOS, EOS, SEP = SPECIAL_TOKENS

DIGITS = tuple(string.digits)

# 100 symbols, each a single token that no task uses for structure (the reference draws its
# copy/reverse symbols from the first 100 "unique" T5 tokens). Single letters, then doubled ones.
SYMBOLS = (
    tuple(string.ascii_lowercase)
    + tuple(string.ascii_uppercase)
    + tuple(c * 2 for c in string.ascii_lowercase)
    + tuple(c * 2 for c in string.ascii_uppercase[:22])
)

Step = dict[str, list[str]]
"""One scratchpad step: component name (see ``scratchpad.COMPONENTS``) -> its tokens."""


@dataclass(frozen=True)
class Problem:
    """A task instance before formatting: what the model reads, the answer, and the gold steps."""

    prompt: list[str]
    answer: list[str]
    steps: list[Step] = field(default_factory=list)


@dataclass(frozen=True)
class Example:
    """One formatted example.

    ``target`` is what the model must produce after ``<sep>``: the answer, or the scratchpad
    followed by ``<ans>`` and the answer. ``answer`` is the final answer alone, and ``length`` is the
    task's own length measure (symbols, digits, terms, actions, functions, ...), not a token count.
    """

    prompt: list[str]
    target: list[str]
    answer: list[str]
    length: int


def number(value: int) -> list[str]:
    """Digit tokens of an integer; a minus sign is its own token (``-12`` -> ``- 1 2``)."""
    return list(str(value))


def join(items: Iterable[list[str]], separator: str | None) -> list[str]:
    """Concatenate token lists with ``separator`` between them (``None``: no separator)."""
    out: list[str] = []
    for i, item in enumerate(items):
        if i and separator is not None:
            out.append(separator)
        out.extend(item)
    return out


def as_random(rng: random.Random | np.random.Generator) -> random.Random:
    """Accept either RNG type; a numpy generator seeds a ``random.Random`` with one draw."""
    if isinstance(rng, random.Random):
        return rng
    if isinstance(rng, np.random.Generator):
        return random.Random(int(rng.integers(2**63)))
    raise TypeError(f"rng must be random.Random or numpy.random.Generator, got {type(rng).__name__}")
