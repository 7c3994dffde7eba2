"""Mathematical and algorithmic tasks, each with gold scratchpad steps (see ``scratchpad.py``).

Each task's length measure and answer:

* ``addition``: digits of the longer operand; ``a + b`` (operands uniform for their digit count).
* ``polynomial``: number of terms; ``sum_i c_i * x ** d_i mod 10`` with c in [-3, 3], d in [0, 3],
  x in [-2, 2] (and ``0 ** 0 = 1``).
* ``sort`` / ``sort_symbols``: list length; the list in ascending order (numbers in [10, 9999] /
  single-token symbols in a fixed, arbitrary order).
* ``summation``: number of summands; their sum mod 10 (summands in [1, 9]).
* ``parity``: number of bits; ``even`` or ``odd`` number of ones.
* ``lego``: number of variables; the value (``+ 1`` / ``- 1``) of the queried variable.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from itertools import accumulate

from .core import DIGITS, SYMBOLS, Problem, Step, join, number
from .scratchpad import step

SORT_SYMBOLS = SYMBOLS[:50]
"""Single-token sort items; their order is their position here, as with the reference's token list."""

LEGO_NAMES = tuple(string.ascii_lowercase)
LEGO_MAX_VARIABLES = len(LEGO_NAMES)


def left_to_right_steps(items: list[list[str]], separator: str | None, **components: list[list[str]]) -> list[Step]:
    """One step per item, reading ``items`` left to right.

    The step input is the item and the remaining input the items after it (joined by
    ``separator``); every other component is given as one token list per step.
    """
    return [step(step_input=item, remaining_input=join(items[i + 1:], separator),
                 **{name: per_step[i] for name, per_step in components.items()})
            for i, item in enumerate(items)]


def running_sums_mod10(values: list[int]) -> list[int]:
    """The running sum mod 10 after each value."""
    return [total % 10 for total in accumulate(values)]


def sum_variables(values: list[int]) -> list[list[str]]:
    """The intermediate variable ``sum = s`` (running sum mod 10) after each step."""
    return [["sum", "=", str(s)] for s in running_sums_mod10(values)]


# --- addition ------------------------------------------------------------------------------------

def uniform_number(rng: random.Random, digits: int) -> int:
    """A uniform integer with exactly ``digits`` digits (1-digit numbers include 0)."""
    return rng.randrange(10) if digits == 1 else rng.randrange(10 ** (digits - 1), 10 ** digits)


def operand_digits(rng: random.Random, length: int) -> tuple[int, int]:
    """Digit counts (d_a, d_b) drawn uniformly from the 2L-1 pairs with max(d_a, d_b) = L."""
    k = rng.randrange(2 * length - 1)
    return (length, k + 1) if k < length else (k - length + 1, length)


def addition_length_weight(length: int) -> float:
    """How many digit-count pairs have this length, so that training draws every pair equally often."""
    return 2 * length - 1


def make_addition(rng: random.Random, length: int) -> Problem:
    """``add : 3 5 7 + 4 8`` -> ``4 0 5``; one step per digit column, right to left."""
    a, b = (uniform_number(rng, d) for d in operand_digits(rng, length))
    return Problem(prompt=["add", ":", *number(a), "+", *number(b)], answer=number(a + b),
                   steps=addition_steps(number(a), number(b)))


def addition_steps(a: list[str], b: list[str]) -> list[Step]:
    """Schoolbook addition: add a column and the carry, emit a digit, carry the tens."""
    steps, carry = [], 0
    for column in range(max(len(a), len(b))):
        x, y = (int(n[-1 - column]) if column < len(n) else 0 for n in (a, b))
        total = x + y + carry
        steps.append(step(
            step_input=[str(x), ",", str(y)],
            step_computation=[str(x), "+", str(y), "+", str(carry), "=", *number(total)],
            step_output=[str(total % 10)],
            intermediate_variables=["carry", "=", str(total // 10)],
            remaining_input=[*a[: max(len(a) - column - 1, 0)], "+", *b[: max(len(b) - column - 1, 0)]],
        ))
        carry = total // 10
    return steps


# --- polynomial evaluation, summation, parity ----------------------------------------------------

def make_polynomial(rng: random.Random, length: int) -> Problem:
    """``evaluate x = - 1 : - 2 * x ** 2 + 3 * x ** 0`` -> ``1``; one step per term."""
    x = rng.randint(-2, 2)
    terms = [(rng.randint(-3, 3), rng.randint(0, 3)) for _ in range(length)]
    values = [c * x ** d for c, d in terms]
    items = [[*number(c), "*", "x", "**", str(d)] for c, d in terms]
    steps = left_to_right_steps(
        items, "+",
        step_computation=[[*number(c), "*", "(", *number(x), ")", "**", str(d)] for c, d in terms],
        step_output=[number(v) for v in values],
        intermediate_variables=sum_variables(values),
    )
    return Problem(prompt=["evaluate", "x", "=", *number(x), ":", *join(items, "+")],
                   answer=[str(sum(values) % 10)], steps=steps)


def make_summation(rng: random.Random, length: int) -> Problem:
    """``sum : 3 + 9 + 4`` -> ``6`` (mod 10); one step per summand."""
    values = [rng.randint(1, 9) for _ in range(length)]
    items = [[str(v)] for v in values]
    before = [0, *running_sums_mod10(values)[:-1]]
    steps = left_to_right_steps(
        items, "+",
        step_computation=[[str(r), "+", str(v)] for r, v in zip(before, values, strict=True)],
        step_output=[number(r + v) for r, v in zip(before, values, strict=True)],
        intermediate_variables=sum_variables(values),
    )
    return Problem(prompt=["sum", ":", *join(items, "+")],
                   answer=[str(sum(values) % 10)], steps=steps)


def make_parity(rng: random.Random, length: int) -> Problem:
    """``parity : 1 0 1`` -> ``even``; one step per bit, XOR-ing it into the running parity."""
    bits = [rng.randrange(2) for _ in range(length)]
    after = [total % 2 for total in accumulate(bits)]
    before = [0, *after[:-1]]
    steps = left_to_right_steps(
        [[str(b)] for b in bits], None,  # bits are written without separators
        step_computation=[[str(p), "xor", str(b)] for p, b in zip(before, bits, strict=True)],
        step_output=[[str(p)] for p in after],
        intermediate_variables=[["parity", "=", str(p)] for p in after],
    )
    return Problem(prompt=["parity", ":", *map(str, bits)], answer=["odd" if after[-1] else "even"], steps=steps)


# --- sorting -------------------------------------------------------------------------------------

def sort_problem(items: list[list[str]], key: Callable[[list[str]], int]) -> Problem:
    """``sort : 4 2 , 1 7`` -> ``1 7 , 4 2``; the steps run selection sort.

    Each step reads the front of the unsorted part, swaps the minimum into its place and outputs
    it; the remaining input is the unsorted part after the swap. (Sorting has no intermediate
    variables, as in the paper.)
    """
    steps, unsorted = [], list(items)
    while unsorted:
        smallest = min(range(len(unsorted)), key=lambda j: key(unsorted[j]))
        front, minimum = unsorted[0], unsorted[smallest]
        unsorted[0], unsorted[smallest] = minimum, front
        unsorted = unsorted[1:]
        steps.append(step(step_input=front, step_computation=["swap", *front, "with", *minimum],
                          step_output=minimum, remaining_input=join(unsorted, ",")))
    return Problem(prompt=["sort", ":", *join(items, ",")], answer=join(sorted(items, key=key), ","),
                   steps=steps)


def make_sort(rng: random.Random, length: int) -> Problem:
    """Sort ``length`` multi-digit numbers drawn uniformly from [10, 9999]."""
    return sort_problem([number(rng.randint(10, 9999)) for _ in range(length)],
                        key=lambda item: int("".join(item)))


def make_sort_symbols(rng: random.Random, length: int) -> Problem:
    """Sort ``length`` single-token symbols by their fixed position in ``SORT_SYMBOLS``."""
    return sort_problem([[rng.choice(SORT_SYMBOLS)] for _ in range(length)],
                        key=lambda item: SORT_SYMBOLS.index(item[0]))


# --- LEGO ----------------------------------------------------------------------------------------

def make_lego(rng: random.Random, length: int) -> Problem:
    """``solve : a = - 1 , b = + a , c = - b . c ?`` -> ``+ 1``.

    A chain of ``length`` distinct variables: the first is +1 or -1, each next one is + or - the
    previous one. The queried variable lies in the second half of the chain (index >= ceil(n/2),
    as in the reference), and clauses are listed in chain order. The steps resolve the chain from
    its start to the queried variable; LEGO has no intermediate variables (as in the paper).
    """
    if not 2 <= length <= LEGO_MAX_VARIABLES:
        raise ValueError(f"lego needs 2..{LEGO_MAX_VARIABLES} variables (one letter each), got {length}")
    names = rng.sample(LEGO_NAMES, length)
    signs = [rng.choice("+-") for _ in range(length)]
    query = rng.randrange((length + 1) // 2, length)
    sources = ["1", *names[:-1]]
    values = [-1 if sign == "-" else 1 for sign in signs]
    for i in range(1, length):
        values[i] *= values[i - 1]
    clauses = [[name, "=", sign, source] for name, sign, source in zip(names, signs, sources, strict=True)]
    source_values = [1, *values[:-1]]
    steps = left_to_right_steps(
        clauses[: query + 1], ",",
        step_computation=[[sign, "(", *_signed_one(v), ")"] for sign, v in zip(signs, source_values, strict=True)],
        step_output=[_signed_one(v) for v in values],
    )
    return Problem(prompt=["solve", ":", *join(clauses, ","), ".", names[query], "?"],
                   answer=_signed_one(values[query]), steps=steps)


def _signed_one(value: int) -> list[str]:
    return ["+" if value > 0 else "-", "1"]


ALGORITHMIC_TASKS: dict[str, tuple[Callable[[random.Random, int], Problem], frozenset[str]]] = {
    "addition": (make_addition, frozenset({*DIGITS, "add", ":", "+", ",", "=", "carry"})),
    "polynomial": (make_polynomial,
                   frozenset({*DIGITS, "evaluate", "x", "=", ":", "+", "-", "*", "**", "(", ")", "sum"})),
    "sort": (make_sort, frozenset({*DIGITS, "sort", ":", ",", "swap", "with"})),
    "sort_symbols": (make_sort_symbols, frozenset({*SORT_SYMBOLS, "sort", ":", ",", "swap", "with"})),
    "summation": (make_summation, frozenset({*DIGITS, "sum", ":", "+", "="})),
    "parity": (make_parity, frozenset({"0", "1", "parity", ":", "xor", "=", "even", "odd"})),
    "lego": (make_lego, frozenset({*LEGO_NAMES, "1", "solve", ":", "=", "+", "-", ",", ".", "?", "(", ")"})),
}
"""Task name -> (generator ``(rng, length) -> Problem``, every token it can use)."""
