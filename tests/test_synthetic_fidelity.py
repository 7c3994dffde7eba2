"""Fidelity of the synthetic tasks to the reference code (McGill-NLP/length-generalization).

The train/valid split against the reference's random split, computed here by simulating that split.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from nope_lightning.synthetic import TASKS, get_task, make_split

N_TRAIN, N_VALID, SIMULATED_VALID = 4000, 2000, 1000


def reference_unseen_share(task: str, length: int, n_train: int, seed: int = 0) -> float:
    """Share of validation problems at ``length`` absent from training under the reference's split.

    The reference generates one pool of problems per length and splits it with ``random.shuffle``: training and
    validation are then independent draws of the task's generator, ``n_train`` of them in training. Simulated with
    the generator alone (``TaskSpec.make``), on a random stream of its own.
    """
    spec, rng = get_task(task), random.Random(f"reference/{task}/{length}/{seed}")
    train = {tuple(spec.make(rng, length).prompt) for _ in range(n_train)}
    return sum(tuple(spec.make(rng, length).prompt) not in train for _ in range(SIMULATED_VALID)) / SIMULATED_VALID


@pytest.mark.parametrize("task", sorted(TASKS))
def test_no_validation_bucket_is_more_unseen_than_the_reference_split(task):
    train = make_split(task, "train", N_TRAIN, seed=0)
    valid = make_split(task, "valid", N_VALID, seed=0)
    seen = {tuple(e.prompt) for e in train}
    train_per_length = Counter(e.length for e in train)
    for length, n in sorted(Counter(e.length for e in valid).items()):
        unseen = sum(tuple(e.prompt) not in seen for e in valid if e.length == length) / n
        bound = reference_unseen_share(task, length, train_per_length[length])
        # Both shares are sample means: allow four standard errors of each, and 2 points for a bound of 0 or 1.
        noise = math.sqrt(bound * (1 - bound))
        slack = 4 * noise * (1 / math.sqrt(n) + 1 / math.sqrt(SIMULATED_VALID)) + 0.02
        assert unseen <= bound + slack, (task, length, unseen, bound)


def test_summation_short_buckets_hold_only_problems_training_sees():
    # The defect this split fixes: with 9 one-summand problems, a hash split left that whole bucket unseen.
    train = {tuple(e.prompt) for e in make_split("summation", "train", 20_000, seed=0)}
    short = [e for e in make_split("summation", "valid", 256, seed=0) if e.length <= 2]
    assert len(short) > 40 and all(tuple(e.prompt) in train for e in short)
