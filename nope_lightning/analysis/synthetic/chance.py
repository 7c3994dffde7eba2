"""Each task's chance exact match, computed from its generator, and the floor below which paper 002's PE-vs-PE
claims read an OOD exact match as chance. A task whose answer is one of k symbols (parity's ``even``/``odd``,
LEGO's ``+1``/``-1``: k = 2; summation's digit: k = 10) is answered right 1/k of the time by a constant guess, so
two PEs at 0.44 and 0.54 on parity are two coins, not a ranking."""

from __future__ import annotations

import random
from functools import cache

import numpy as np

from nope_lightning.synthetic.tasks import TASKS, get_task

#: Test examples drawn to find a task's answer alphabet (seeded; ~0.1 s per task).
ALPHABET_DRAWS = 200
#: A task with more distinct answers than this among ``ALPHABET_DRAWS`` draws answers in sequences: chance ~ 0.
SMALL_ALPHABET = ALPHABET_DRAWS // 4


@cache
def chance(task: str) -> float:
    """Exact match of a uniform guess over the task's answers (1/k for k distinct answers among ``ALPHABET_DRAWS``
    test-length examples, seed 0), 0 for a task whose answers are sequences (more than ``SMALL_ALPHABET`` distinct)
    or that the generators do not know (a task added by a results file only)."""
    if task not in TASKS:
        return 0.0
    spec, rng = get_task(task), random.Random(0)
    lengths = [n for n in spec.test_lengths if spec.has_length(n) and (spec.max_length is None or n <= spec.max_length)]
    answers = {tuple(spec.generate(rng, lengths[i % len(lengths)]).answer) for i in range(ALPHABET_DRAWS)}
    return 1 / len(answers) if len(answers) <= SMALL_ALPHABET else 0.0


def at_chance(acc: np.ndarray, tasks: list[str], margin: float) -> np.ndarray:
    """``acc`` (..., tasks, PEs; exact match 0..1) with every score at or below its task's chance + ``margin`` set to
    that chance, so PEs within noise of a coin tie (the same rank, a zero margin) instead of being ordered by it."""
    floor = np.asarray([chance(t) for t in tasks])[:, None]
    return np.where(acc <= floor + margin, floor, acc)
