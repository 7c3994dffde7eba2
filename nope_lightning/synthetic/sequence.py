"""Primitive tasks: copy and reverse, with the paper's variants.

Length = number of symbols in the input sequence. Symbols come from ``core.SYMBOLS`` (100 tokens).

* ``copy_repeat``        one symbol repeated L times, copied            (paper: Copy, variant 1)
* ``copy_repeat_2x``     ... written out twice: the symbol 2L times     (variant 1, 2x)
* ``copy_repeat_change`` "replace s with t": L copies of s become L of t (variant 2, repeat+change)
* ``copy``               a random sequence, copied                      (variant 3)
* ``copy_2x``            ... written twice, ``seq | seq``
* ``reverse``            a random sequence, reversed
* ``reverse_2x``         ... reversed twice over, ``rev | rev``
* ``reverse_copy``       reversed then copied, ``rev | seq``

The 2x targets follow the reference: the repeated-symbol variant is just 2L symbols, the
random-sequence variants put a separator (here ``|``) between the two halves.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from .core import SYMBOLS, Problem

NEXT = "|"

Sampler = Callable[[random.Random, int], list[str]]
Transform = Callable[[list[str]], list[str]]


def random_sequence(rng: random.Random, length: int) -> list[str]:
    """``length`` symbols drawn independently and uniformly."""
    return [rng.choice(SYMBOLS) for _ in range(length)]


def repeated_symbol(rng: random.Random, length: int) -> list[str]:
    """One uniformly drawn symbol, ``length`` times."""
    return [rng.choice(SYMBOLS)] * length


def sequence_task(verb: str, sample: Sampler, transform: Transform) -> Callable[[random.Random, int], Problem]:
    """A task whose prompt is ``verb : seq`` and whose answer is ``transform(seq)``."""

    def make(rng: random.Random, length: int) -> Problem:
        sequence = sample(rng, length)
        return Problem(prompt=[verb, ":", *sequence], answer=transform(sequence))

    return make


def make_copy_repeat_change(rng: random.Random, length: int) -> Problem:
    """``replace s with t : s s s`` -> ``t t t`` for two distinct symbols s, t."""
    source, replacement = rng.sample(SYMBOLS, 2)
    return Problem(prompt=["replace", source, "with", replacement, ":", *[source] * length],
                   answer=[replacement] * length)


def _reverse(sequence: list[str]) -> list[str]:
    return sequence[::-1]


COPY_REVERSE_TASKS: dict[str, Callable[[random.Random, int], Problem]] = {
    "copy_repeat": sequence_task("copy", repeated_symbol, list),
    "copy_repeat_2x": sequence_task("copy", repeated_symbol, lambda s: s + s),
    "copy_repeat_change": make_copy_repeat_change,
    "copy": sequence_task("copy", random_sequence, list),
    "copy_2x": sequence_task("copy", random_sequence, lambda s: [*s, NEXT, *s]),
    "reverse": sequence_task("reverse", random_sequence, _reverse),
    "reverse_2x": sequence_task("reverse", random_sequence, lambda s: [*_reverse(s), NEXT, *_reverse(s)]),
    "reverse_copy": sequence_task("reverse", random_sequence, lambda s: [*_reverse(s), NEXT, *s]),
}
"""Task name -> generator ``(rng, length) -> Problem``."""

TOKENS = frozenset({"copy", "reverse", "replace", "with", ":", NEXT, *SYMBOLS})
"""Every token the copy/reverse tasks use (one vocabulary serves the whole family)."""
