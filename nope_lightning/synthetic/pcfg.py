"""PCFG SET (Hupkes et al., 2020), generated from its grammar and string functions.

A program applies string-edit functions, written in prefix notation, to sequences of letters
(520 of them, ``A1`` .. ``Z20``, as in the released data)::

    append swap_first_last A1 B2 C3 , repeat D4 E5  ->  C3 B2 A1 D4 E5 D4 E5

unary:  copy, reverse, shift (first letter to the end), echo (repeat the last letter),
        swap_first_last, repeat (the whole sequence twice)
binary: append (x y), prepend (y x), remove_first (y), remove_second (x); arguments separated by ``,``

The generator follows PCFG SET's: a function is unary with probability 0.75, each argument is
itself a function call with probability 0.25 (else a string of 2-5 uniformly drawn letters).

Length = number of function calls in the program. The productivity split that the paper uses
trains on programs with at most 8 functions and tests on longer ones (its test set holds 9-35).
Programs of an exact size are drawn from the grammar's distribution *conditioned* on that size,
with a small dynamic program over the grammar's probabilities, so no sample is thrown away.
Outputs longer than ``MAX_OUTPUT`` letters are redrawn, because nested ``repeat``s double the
output each time; the released data is bounded too (programs of under 300 characters).
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from functools import cache

from .core import Problem

LETTERS = tuple(f"{letter}{index}" for letter in string.ascii_uppercase for index in range(1, 21))
UNARY: dict[str, Callable[[list[str]], list[str]]] = {
    "copy": lambda x: list(x),
    "reverse": lambda x: x[::-1],
    "shift": lambda x: [*x[1:], x[0]],
    "echo": lambda x: [*x, x[-1]],
    "swap_first_last": lambda x: [x[-1], *x[1:-1], x[0]],
    "repeat": lambda x: x + x,
}
BINARY: dict[str, Callable[[list[str], list[str]], list[str]]] = {
    "append": lambda x, y: x + y,
    "prepend": lambda x, y: y + x,
    "remove_first": lambda x, y: list(y),
    "remove_second": lambda x, y: list(x),
}
FUNCTIONS = frozenset({*UNARY, *BINARY})
TOKENS = frozenset({*LETTERS, *FUNCTIONS, ",", "solve", ":"})

P_UNARY = 0.75  # P(unary | function call)
P_CALL_ARGUMENT = 0.25  # P(an argument is a function call rather than a string)
STRING_LENGTHS = (2, 3, 4, 5)
MAX_OUTPUT = 100
MAX_REDRAWS = 1000
#: The most functions a program may have: sampling and interpreting recurse once per nesting level, and a program
#: of n functions nests up to n deep (2n frames to sample, n to interpret), so 100 stays far below Python's
#: default limit of 1000 frames whatever the caller's depth; it is about 3x the paper's longest test program (35).
MAX_FUNCTIONS = 100


def interpret(program: list[str]) -> list[str]:
    """The output of a PCFG SET program; ``ValueError`` when it does not parse."""
    value, end = _evaluate(program, 0)
    if end != len(program):
        raise ValueError(f"unexpected {program[end]!r} at position {end}")
    return value


def _evaluate(program: list[str], i: int) -> tuple[list[str], int]:
    """Evaluate the expression starting at ``program[i]``; return its value and where it ends."""
    if i >= len(program):
        raise ValueError("program ended where an argument was expected")
    head = program[i]
    if head in UNARY:
        argument, i = _evaluate(program, i + 1)
        return UNARY[head](argument), i
    if head in BINARY:
        first, i = _evaluate(program, i + 1)
        if i >= len(program) or program[i] != ",":
            raise ValueError(f"{head} needs two arguments separated by ','")
        second, i = _evaluate(program, i + 1)
        return BINARY[head](first, second), i
    end = i
    while end < len(program) and program[end] not in FUNCTIONS and program[end] != ",":
        end += 1
    if end == i:
        raise ValueError(f"expected a letter or a function at position {i}, got {head!r}")
    return program[i:end], end


@cache
def _argument_mass(calls: int) -> float:
    """Probability that an argument slot expands to exactly ``calls`` function calls."""
    return 1 - P_CALL_ARGUMENT if calls == 0 else P_CALL_ARGUMENT * _call_mass(calls)


@cache
def _call_mass(calls: int) -> float:
    """Probability that a function call contains exactly ``calls`` calls, itself included."""
    if calls < 1:
        return 0.0
    return sum(_call_options(calls).values())


@cache
def _call_options(calls: int) -> dict[int | None, float]:
    """Unnormalised weights of a call's shapes: ``None`` = unary, ``k`` = binary with k calls left."""
    options: dict[int | None, float] = {None: P_UNARY * _argument_mass(calls - 1)}
    for left in range(calls):
        options[left] = (1 - P_UNARY) * _argument_mass(left) * _argument_mass(calls - 1 - left)
    return options


def _sample_call(rng: random.Random, calls: int) -> list[str]:
    """A program with exactly ``calls`` function calls, from the grammar conditioned on that size."""
    options = _call_options(calls)
    (shape,) = rng.choices(list(options), weights=list(options.values()))
    if shape is None:
        return [rng.choice(list(UNARY)), *_sample_argument(rng, calls - 1)]
    return [rng.choice(list(BINARY)), *_sample_argument(rng, shape), ",", *_sample_argument(rng, calls - 1 - shape)]


def _sample_argument(rng: random.Random, calls: int) -> list[str]:
    if calls == 0:
        return [rng.choice(LETTERS) for _ in range(rng.choice(STRING_LENGTHS))]
    return _sample_call(rng, calls)


def make_pcfg(rng: random.Random, length: int) -> Problem:
    """``solve : <program with length functions>`` -> its output (at most ``MAX_OUTPUT`` letters)."""
    if not 1 <= length <= MAX_FUNCTIONS:
        raise ValueError(f"a PCFG SET program has 1..{MAX_FUNCTIONS} functions, got length {length}")
    for calls in range(1, length):  # the size table bottom-up: filled top-down it recursed ~7 frames per function
        _call_mass(calls)
    for _ in range(MAX_REDRAWS):
        program = _sample_call(rng, length)
        output = interpret(program)
        if len(output) <= MAX_OUTPUT:
            return Problem(prompt=["solve", ":", *program], answer=output)
    raise RuntimeError(f"no PCFG program with {length} functions and a short output in {MAX_REDRAWS} draws")
