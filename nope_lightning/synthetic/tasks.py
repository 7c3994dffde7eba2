"""The task registry of Kazemnejad et al. (2023) and the train/valid/test splits built from it.

Length ranges (train -> test; test is always out of distribution, as in the paper)::

    task                      length measure          train    test
    copy/reverse family (8)   symbols                 1-20     21-40
    addition                  digits, longer operand  1-8      9-16
    polynomial                terms                   1-8      9-16
    sort, sort_symbols        list length             1-8      9-16
    summation                 summands                1-8      9-16
    parity                    bits                    1-8      9-16
    lego                      variables               4-8      9-16
    scan                      output actions          1-25     26-48
    pcfg                      function calls          1-8      9-35

Choices where the paper leaves room:

* Training lengths start at 1, except LEGO at 4 (the reference builds LEGO from 4 variables; with
  the query in the second half of the chain, 1 variable has nothing to query).
* Addition's length is the longer operand's digit count and training operands both have 1-8
  digits (the reference's bins are all digit-count pairs in [1, 8]^2); test operands pair a 9-16
  digit number with one of 1..L digits. Training draws lengths in proportion to the 2L-1 digit-count
  pairs of each length, so every pair is equally likely, as in the reference.
* SCAN training draws commands uniformly (lengths weighted by how many commands have them), as in the
  re-split data; test draws each achievable length equally.
* PCFG's test range is the productivity test set's 9-35 functions; ``test_max_len`` moves its end, up to
  ``pcfg.MAX_FUNCTIONS`` (100).
* Every other task draws training lengths uniformly, and every test split cycles through its lengths
  so that each length bucket gets the same number of examples (within one).

Validation examples come from the training lengths. ``make_split`` splits train and valid without
coordinating the two calls: a stable hash of the prompt reserves one problem in ``HOLDOUT_MODULUS``
for validation, and training never draws a reserved problem. Where a length's problem space is large
(``is_large``), validation draws only reserved problems, problems training never saw; the reference's
random split (McGill-NLP/length-generalization: ``random.shuffle`` of one pool) leaves nearly all of
its validation problems out of training there too. Where the space is small (summation with 1
summand has 9 problems, copy_repeat 100 per length), reserved problems alone would make a validation
bucket of problems training can never see, whereas the reference's split puts most of them in
training; there validation draws from training's problems, so that no more of them are unseen than
under the reference's split. Training stays as it was (it still skips reserved problems, e.g. 2 of
summation's 9 at length 1), so committed training data are unchanged.

The held-out in-distribution test split (``id_test``) draws training lengths, by training's weights as validation
does, and reserved problems only, less the validation examples' problems it is given (``avoid``): problems neither
training nor validation holds, so that a score on them is free of checkpoint selection. A length without a single
reserved problem (parity at 1 and 3 bits, SCAN at 1 action) has no held-out problem and no ``id_test`` example.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from . import algorithmic, pcfg, scan, sequence
from .core import Example, Problem, as_random
from .scratchpad import COMPONENTS, parse_answer, render_scratchpad, supported_formats

SPLITS = ("train", "valid", "test", "id_test")
HOLDOUT_MODULUS = 10
MAX_DRAWS = 400  # draws to find a problem on the right side of the train/valid hash split
PROBE_DRAWS = 2048
"""Draws of ``is_large``'s probe. A space of K equally likely problems gives m draws without a repeat with
probability about exp(-m^2 / 2K): never (< e^-40) for K <= 5e4, where a random split with 2,500 training examples
at that length puts more than 5% of validation problems in training too, and mostly (> 0.65) for K >= 1e7."""


def _any_length(length: int) -> bool:
    return True


def _uniform(length: int) -> float:
    return 1.0


@dataclass(frozen=True)
class TaskSpec:
    """One task: its generator, vocabulary, default length ranges and scratchpad support.

    ``train_lengths``/``test_lengths`` are the paper's ranges; ``make_split`` can move their ends.
    ``components`` are the scratchpad components the task's gold steps fill (empty: no scratchpad).
    ``has_length`` says whether a length can be generated at all (only SCAN skips some), and
    ``train_weight`` how often a training length is drawn relative to the others.
    """

    name: str
    make: Callable[[random.Random, int], Problem] = field(repr=False)
    tokens: frozenset[str] = field(repr=False)
    train_lengths: range
    test_lengths: range
    components: tuple[str, ...] = ()
    max_length: int | None = None
    has_length: Callable[[int], bool] = field(default=_any_length, repr=False)
    train_weight: Callable[[int], float] = field(default=_uniform, repr=False)

    @property
    def scratchpads(self) -> tuple[str, ...]:
        """Supported scratchpad formats (see ``scratchpad.py``)."""
        return supported_formats(self.components)

    def check_scratchpad(self, scratchpad: str) -> None:
        """Raise ``ValueError`` naming the supported formats unless ``scratchpad`` is one."""
        if scratchpad not in self.scratchpads:
            raise ValueError(f"task {self.name!r} does not support scratchpad {scratchpad!r}; "
                             f"supported: {', '.join(self.scratchpads)}")

    def generate(self, rng: random.Random | np.random.Generator, length: int, scratchpad: str = "none") -> Example:
        """One example of exactly ``length``; the problem drawn does not depend on ``scratchpad``."""
        self.check_scratchpad(scratchpad)
        if length < 1 or (self.max_length is not None and length > self.max_length) or not self.has_length(length):
            raise ValueError(f"task {self.name!r} cannot generate length {length}")
        problem = self.make(as_random(rng), length)
        return Example(prompt=problem.prompt, target=render_scratchpad(problem.steps, problem.answer, scratchpad),
                       answer=problem.answer, length=length)

    def split_lengths(self, split: str, train_max_len: int | None = None,
                      test_max_len: int | None = None) -> list[int]:
        """The lengths a split draws from: train/valid up to ``train_max_len``, test above it."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
        train_max = self.train_lengths[-1] if train_max_len is None else train_max_len
        test_max = self.test_lengths[-1] if test_max_len is None else test_max_len
        if train_max < self.train_lengths.start:
            raise ValueError(f"train_max_len={train_max} is below {self.name}'s shortest training "
                             f"length {self.train_lengths.start}; set train_max_len >= {self.train_lengths.start}")
        if test_max <= train_max:
            raise ValueError(f"test_max_len={test_max} must exceed train_max_len={train_max}: "
                             "test lengths lie above the training lengths")
        if self.max_length is not None and test_max > self.max_length:
            raise ValueError(f"test_max_len={test_max} exceeds {self.name}'s maximum length {self.max_length}; "
                             f"set test_max_len <= {self.max_length}")
        span = range(train_max + 1, test_max + 1) if split == "test" else range(self.train_lengths.start, train_max + 1)
        lengths = [length for length in span if self.has_length(length)]
        if not lengths:
            raise ValueError(f"task {self.name!r} has no {split} lengths in {span.start}..{span.stop - 1}")
        return lengths


NO_VARIABLES = tuple(name for name in COMPONENTS if name != "intermediate_variables")


def _algorithmic(name: str, components: tuple[str, ...] = COMPONENTS, train_lengths: range = range(1, 9),
                 **options) -> TaskSpec:
    """A mathematical/algorithmic task: trained on lengths up to 8, tested on 9-16."""
    make, tokens = algorithmic.ALGORITHMIC_TASKS[name]
    return TaskSpec(name, make, tokens, train_lengths, range(9, 17), components, **options)


_SPECS = [
    *(TaskSpec(name, make, sequence.TOKENS, range(1, 21), range(21, 41))
      for name, make in sequence.COPY_REVERSE_TASKS.items()),
    _algorithmic("addition", train_weight=algorithmic.addition_length_weight),
    _algorithmic("polynomial"),
    _algorithmic("sort", NO_VARIABLES),
    _algorithmic("sort_symbols", NO_VARIABLES),
    _algorithmic("summation"),
    _algorithmic("parity"),
    _algorithmic("lego", NO_VARIABLES, range(4, 9), max_length=algorithmic.LEGO_MAX_VARIABLES),
    TaskSpec("scan", scan.make_scan, scan.TOKENS, range(1, 26), range(26, 49), max_length=48,
             has_length=scan.has_length, train_weight=scan.count_of_length),
    TaskSpec("pcfg", pcfg.make_pcfg, pcfg.TOKENS, range(1, 9), range(9, 36), max_length=pcfg.MAX_FUNCTIONS),
]
TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in _SPECS}


def get_task(task: str) -> TaskSpec:
    """The spec of ``task``; ``ValueError`` listing the known tasks otherwise."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[task]


def make_split(task: str, split: str, n: int, seed: int, scratchpad: str = "none",
               train_max_len: int | None = None, test_max_len: int | None = None,
               avoid: Sequence[Example] = ()) -> list[Example]:
    """``n`` examples of ``task`` for ``split`` (one of ``SPLITS``), deterministic in ``seed``.

    Train and valid draw from the training lengths (valid is the in-distribution validation set),
    test from the lengths in ``(train_max_len, test_max_len]``, cycling through them so every
    length gets ``n // #lengths`` or one more examples; id_test from the training lengths that have reserved
    problems, reserved problems only and none of ``avoid``'s (the validation split; see the module docstring).
    Each (task, split, seed) has its own random stream, and the scratchpad format only changes how the same
    problems are written.
    """
    spec = get_task(task)
    spec.check_scratchpad(scratchpad)
    if n < 0:
        raise ValueError(f"n={n} must be >= 0")
    lengths = spec.split_lengths(split, train_max_len, test_max_len)
    rng = random.Random(f"{spec.name}/{split}/{seed}")
    if split == "test":
        return [spec.generate(rng, lengths[i % len(lengths)], scratchpad) for i in range(n)]
    if split == "id_test" and not (lengths := [length for length in lengths if has_held_out(spec.name, length)]):
        raise ValueError(f"task {spec.name!r} has no held-out problem at training lengths up to "
                         f"{spec.split_lengths(split, train_max_len, test_max_len)[-1]}: raise train_max_len or set "
                         f"n_id_test=0")
    plan = rng.choices(lengths, weights=[spec.train_weight(length) for length in lengths], k=n)
    avoided = frozenset(tuple(e.prompt) for e in avoid)
    return [_draw(spec, rng, length, scratchpad, avoided,
                  valid=split == "id_test" or split == "valid" and is_large(spec.name, length)) for length in plan]


def _draw(spec: TaskSpec, rng: random.Random, length: int, scratchpad: str, avoid: frozenset[tuple[str, ...]],
          valid: bool) -> Example:
    """An example whose problem is reserved for validation (``valid``) or not (training's problems), and not one
    of ``avoid``'s prompts."""
    for _ in range(MAX_DRAWS):
        example = spec.generate(rng, length, scratchpad)
        if is_held_out(example.prompt) == valid and tuple(example.prompt) not in avoid:
            return example
    raise RuntimeError(f"{spec.name} at length {length}: no {'reserved' if valid else 'unreserved'} problem in "
                       f"{MAX_DRAWS} draws")


@functools.cache
def is_large(task: str, length: int) -> bool:
    """Whether ``task`` at ``length`` has so many problems that validation may hold problems training never sees.

    A fixed probe (its own random stream, so the same in every process and seed): ``PROBE_DRAWS`` problems,
    large when no prompt repeats. A repeat means a few hundred thousand problems or fewer (see ``PROBE_DRAWS``).
    """
    spec, rng = get_task(task), random.Random(f"{task}/probe/{length}")
    seen: set[tuple[str, ...]] = set()
    for _ in range(PROBE_DRAWS):
        prompt = tuple(spec.make(rng, length).prompt)
        if prompt in seen:
            return False
        seen.add(prompt)
    return True


@functools.cache
def has_held_out(task: str, length: int) -> bool:
    """Whether ``task`` at ``length`` has a reserved problem: one among ``MAX_DRAWS`` draws of a fixed probe (its
    own random stream), so the same answer in every process. Parity at 1 and 3 bits and SCAN at 1 action have none."""
    spec, rng = get_task(task), random.Random(f"{task}/held-out-probe/{length}")
    return any(is_held_out(spec.make(rng, length).prompt) for _ in range(MAX_DRAWS))


def is_held_out(prompt: list[str]) -> bool:
    """Whether a problem is reserved for validation (stable across processes and seeds)."""
    digest = hashlib.blake2b(" ".join(prompt).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % HOLDOUT_MODULUS == 0


def exact_match(pred_tokens: list[str], example: Example) -> bool:
    """Whether the final answer in a prediction equals the example's answer (see ``parse_answer``)."""
    return parse_answer(pred_tokens) == example.answer


def length_bucket(length: int, width: int = 1) -> str:
    """Label of the length bucket for per-length metrics: ``"24"``, or ``"21-25"`` for ``width=5``.

    Buckets are aligned to multiples of ``width`` (1-5, 6-10, ...), so with the paper's ranges a
    bucket never mixes training and test lengths when ``width`` divides the training maximum.
    """
    if width < 1:
        raise ValueError(f"width={width} must be >= 1")
    if width == 1:
        return str(length)
    low = (length - 1) // width * width + 1
    return f"{low}-{low + width - 1}"
