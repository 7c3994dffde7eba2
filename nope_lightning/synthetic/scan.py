"""SCAN (Lake & Baroni, 2018), generated from its published phrase-structure grammar.

Grammar::

    C -> S and S | S after S | S
    S -> V twice | V thrice | V
    V -> D[1] opposite D[2] | D[1] around D[2] | D | U
    D -> U left | U right | turn left | turn right
    U -> walk | look | run | jump

It generates exactly 20,910 commands. The interpretation function maps a command to actions
(WALK, LOOK, RUN, JUMP, LTURN, RTURN): ``x and y`` is x then y, ``x after y`` is y then x,
``twice``/``thrice`` repeat, ``u left`` is LTURN u, ``u opposite left`` turns twice then does u,
``u around left`` does (LTURN u) four times; ``turn`` contributes no action of its own.

Length = number of output actions (1..48). The paper re-splits SCAN by this length: commands with at
most 25 actions for training, 26-48 for testing. Only some lengths occur (the test lengths are 26, 27,
28, 30, 32, 33, 36, 40 and 48), and a command of a given length is drawn uniformly among all commands
of that length.
"""

from __future__ import annotations

import random
from collections import defaultdict
from functools import cache

from .core import Problem

ACTIONS = {"walk": "WALK", "look": "LOOK", "run": "RUN", "jump": "JUMP"}
TURNS = {"left": "LTURN", "right": "RTURN"}
REPEATS = {"twice": 2, "thrice": 3}
CONJUNCTIONS = ("and", "after")
COMMAND_WORDS = frozenset({*ACTIONS, *TURNS, *REPEATS, *CONJUNCTIONS, "turn", "opposite", "around"})
ACTION_TOKENS = frozenset({*ACTIONS.values(), *TURNS.values()})
TOKENS = frozenset({*COMMAND_WORDS, *ACTION_TOKENS, "solve", ":"})


def interpret(command: list[str]) -> list[str]:
    """The action sequence of a SCAN command (the paper's interpretation function)."""
    for conjunction in CONJUNCTIONS:
        if conjunction in command:
            cut = command.index(conjunction)
            first, second = interpret(command[:cut]), interpret(command[cut + 1:])
            return first + second if conjunction == "and" else second + first
    if command and command[-1] in REPEATS:
        return _interpret_phrase(command[:-1]) * REPEATS[command[-1]]
    return _interpret_phrase(command)


def _interpret_phrase(phrase: list[str]) -> list[str]:
    """Rule V: ``u``, ``x dir``, ``x opposite dir``, ``x around dir`` (x a verb or ``turn``)."""
    match phrase:
        case [verb] if verb in ACTIONS:
            return [ACTIONS[verb]]
        case [verb, direction] if direction in TURNS:
            return [TURNS[direction], *_action(verb)]
        case [verb, "opposite", direction] if direction in TURNS:
            return [TURNS[direction]] * 2 + _action(verb)
        case [verb, "around", direction] if direction in TURNS:
            return ([TURNS[direction], *_action(verb)]) * 4
    raise ValueError(f"not a SCAN command: {' '.join(phrase)!r}")


def _action(verb: str) -> list[str]:
    if verb == "turn":
        return []
    if verb in ACTIONS:
        return [ACTIONS[verb]]
    raise ValueError(f"not a SCAN verb: {verb!r}")


def all_commands() -> list[list[str]]:
    """Every command the grammar generates, in a fixed order."""
    verbs = list(ACTIONS)
    directed = [[verb, direction] for verb in [*verbs, "turn"] for direction in TURNS]
    phrases = (
        [[verb] for verb in verbs]
        + directed
        + [[verb, modifier, direction] for modifier in ("opposite", "around")
           for verb, direction in directed]
    )
    sentences = [[*phrase, *repeat] for phrase in phrases for repeat in ([], ["twice"], ["thrice"])]
    return sentences + [[*a, conjunction, *b] for conjunction in CONJUNCTIONS for a in sentences for b in sentences]


@cache
def commands_by_length() -> dict[int, list[list[str]]]:
    """All commands grouped by their number of output actions (built once, about 0.1 s)."""
    table: dict[int, list[list[str]]] = defaultdict(list)
    for command in all_commands():
        table[len(interpret(command))].append(command)
    return dict(table)


def has_length(length: int) -> bool:
    """Whether some command has exactly ``length`` actions."""
    return length in commands_by_length()


def count_of_length(length: int) -> int:
    """How many commands have exactly ``length`` actions (training weights lengths by this)."""
    return len(commands_by_length().get(length, ()))


def make_scan(rng: random.Random, length: int) -> Problem:
    """``solve : walk after turn left`` -> ``LTURN WALK``, a command with ``length`` actions."""
    if not has_length(length):
        raise ValueError(f"no SCAN command has {length} actions; lengths: {sorted(commands_by_length())}")
    command = rng.choice(commands_by_length()[length])
    return Problem(prompt=["solve", ":", *command], answer=interpret(command))
