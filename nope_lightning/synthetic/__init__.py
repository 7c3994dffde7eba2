"""Synthetic length-generalization tasks of Kazemnejad et al. (NeurIPS 2023), generated offline.

Pure Python (numpy only for its random generator type). Typical use::

    from nope_lightning.synthetic import TASKS, Vocabulary, make_split, exact_match

    train = make_split("addition", "train", n=10_000, seed=0, scratchpad="full")
    test = make_split("addition", "test", n=1_000, seed=0, scratchpad="full")
    vocab = Vocabulary.for_task("addition")
    input_ids, loss_mask = vocab.encode(train[0])
    exact_match(vocab.decode(generated_ids), test[0])

The lowest floor: it imports nothing else of the package, so ``config/synthetic.py`` checks task names against
``TASKS``; the grid's analysis of trained models is ``analysis/synthetic/grid.py``.
"""

from .core import BOS, EOS, PAD, SEP, SPECIAL_TOKENS, Example, Problem, Step
from .scratchpad import (
    ANSWER_MARKER,
    COMPONENTS,
    MARKERS,
    SCRATCHPAD_MARKERS,
    STEP_MARKER,
    enabled_components,
    parse_answer,
    parse_scratchpad,
    render_scratchpad,
    supported_formats,
)
from .tasks import SPLITS, TASKS, TaskSpec, exact_match, get_task, is_held_out, length_bucket, make_split
from .vocab import Vocabulary

__all__ = [
    "ANSWER_MARKER",
    "BOS",
    "COMPONENTS",
    "EOS",
    "MARKERS",
    "PAD",
    "SCRATCHPAD_MARKERS",
    "SEP",
    "SPECIAL_TOKENS",
    "SPLITS",
    "STEP_MARKER",
    "TASKS",
    "Example",
    "Problem",
    "Step",
    "TaskSpec",
    "Vocabulary",
    "enabled_components",
    "exact_match",
    "get_task",
    "is_held_out",
    "length_bucket",
    "make_split",
    "parse_answer",
    "parse_scratchpad",
    "render_scratchpad",
    "supported_formats",
]
