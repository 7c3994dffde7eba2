"""Exact match of the synthetic tasks' decoded outputs: per example (``score``), per length bucket
(``bucket_accuracies``), where a scratchpad's wrong outputs first go wrong (``scratchpad_errors``), and the report
of the held-out in-distribution test split (``log_id_test``: problems at the training lengths that neither training
nor validation holds, decoded with the weights validation selected)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from nope_lightning.analysis.synthetic.grid import bucket_start
from nope_lightning.config.parts import TrackingConfig
from nope_lightning.results.synthetic import BucketAccuracy, problems_digest
from nope_lightning.runtime import tracking
from nope_lightning.synthetic import Example, Vocabulary, exact_match, length_bucket
from nope_lightning.synthetic.scratchpad import ERROR_KINDS, first_error


def score(vocab: Vocabulary, examples: Sequence[Example], generated: Sequence[list[int]]) -> list[bool]:
    """Exact match of each generated continuation's final answer (see ``synthetic.exact_match``).

    The prompt goes in front, so the answer starts after the prompt's ``<sep>`` even when the model
    generates a ``<sep>`` of its own.
    """
    return [exact_match(vocab.decode(vocab.encode_prompt(example) + ids), example)
            for example, ids in zip(examples, generated, strict=True)]


def bucket_accuracies(examples: Sequence[Example], correct: Sequence[bool], train_max: int,
                      width: int) -> list[BucketAccuracy]:
    """Exact match per length bucket (in or out of distribution), by length."""
    groups: dict[str, list[bool]] = defaultdict(list)
    for example, ok in zip(examples, correct, strict=True):
        groups[length_bucket(example.length, width)].append(ok)
    return [BucketAccuracy(label, "ood" if bucket_start(label) > train_max else "id", len(oks), float(np.mean(oks)))
            for label, oks in sorted(groups.items(), key=lambda item: bucket_start(item[0]))]


def scratchpad_errors(vocab: Vocabulary, examples: Sequence[Example], generated: Sequence[list[int]],
                      correct: Sequence[bool], train_max: int, scratchpad: str) -> dict[str, list[int]]:
    """Where each wrong out-of-distribution output of a scratchpad cell first departs from its target
    (``synthetic.scratchpad.first_error``): per kind met (in ``ERROR_KINDS`` order), the steps (1-based) where that
    happened, sorted. ``{}`` for a cell without a scratchpad (its output is the answer alone)."""
    if scratchpad == "none":
        return {}
    found: dict[str, list[int]] = defaultdict(list)
    for example, ids, ok in zip(examples, generated, correct, strict=True):
        if not ok and example.length > train_max:
            what, step = first_error(example.target, vocab.decode(ids), scratchpad)
            found[what].append(step)
    return {kind: sorted(found[kind]) for kind in ERROR_KINDS if kind in found}


def log_id_test(track: TrackingConfig, run_id: str, prefix: str, vocab: Vocabulary, examples: Sequence[Example],
                generated: Sequence[list[int]], width: int, step: int) -> tuple[float, list[BucketAccuracy]]:
    """Score the ``id_test`` split, log it on ``run_id`` and return its exact match and per-bucket accuracies: ``{prefix}/id_test_acc`` and
    ``{prefix}/id_test/len{L}/acc`` per bucket of ``width`` lengths (metrics at ``step``), and ``id_test.json``:
    ``acc``, ``n``, ``buckets``, ``correct`` (one ``0``/``1`` per example, in the split's order) and ``digest``
    (its ``problems_digest``, the same for every encoding of a (task, seed), so two runs' examples can be
    paired)."""
    correct = score(vocab, examples, generated)
    acc = float(np.mean(correct))
    buckets = bucket_accuracies(examples, correct, max(e.length for e in examples), width)
    metrics = {f"{prefix}/id_test_acc": acc, **{f"{prefix}/id_test/len{b.bucket}/acc": b.acc for b in buckets}}
    tracking.log_metrics(track, run_id, metrics, step=step)
    tracking.log_json(track, run_id, {"acc": acc, "n": len(correct), "buckets": [vars(b) for b in buckets],
                                      "correct": "".join("1" if ok else "0" for ok in correct),
                                      "digest": problems_digest(examples)}, "id_test.json")
    return acc, buckets
