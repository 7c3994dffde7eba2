"""Passkey retrieval (Landmark Attention's task, as used by YaRN and the paper §4.3), at exact token lengths.

The prompt text is the reference one::

    {TASK_LINE}\\n{prefix}\\n{info line}\\n{suffix}\\n{QUESTION}

where the info line is ``"The pass key is {key}. Remember it. {key} is the pass key."`` and prefix and suffix
are the filler ``"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."``
repeated with single spaces; both start at "The grass is green." as in the reference. Keys are random 5-digit
numbers; a model passes when the first integer it generates is the key.

How lengths and depths are made exact (the reference grows a character count until the prompt is about the
right size): the prompt is the concatenation of separately encoded segments, so its token count is the sum
of the segments' counts. The haystack budget N is the requested length minus the fixed segments (task line,
info line, question, newlines). The prefix is a whole number of filler sentences, ending at the sentence
boundary nearest to ``depth * N`` tokens that leaves the prefix <= N; the suffix is the filler's first
``N - len(prefix)`` tokens, so only its last sentence may be cut mid-way, right before the question. Depth
is therefore measured in haystack tokens, off by at most half a filler sentence (a whole one when
``depth * N`` falls inside the haystack's last, cut sentence). For tokenizers that split words at spaces and
newlines (byte-level BPE, whitespace) segment-wise encoding equals encoding the whole text, except inside
the cut last sentence.
"""

from __future__ import annotations

import random
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import cycle
from typing import Protocol

from nope_lightning.config import PASSKEY_PROMPTS, EvaluateConfig
from nope_lightning.eval.generate import greedy_generate
from nope_lightning.stats import wilson

TASK_LINE = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
             "I will quiz you about the important information there.")
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
INFO_LINE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"
# The start of each tenth of the haystack; depth 1.0 (key right before the question) is the easiest case.
DEFAULT_DEPTHS = tuple(i / 10 for i in range(10))
MAX_NEW_TOKENS = 10  # the reference's generation budget; a 5-digit key needs a few tokens at most

FILLER_SENTENCES = tuple(re.findall(r" [^.]+\.", FILLER))
assert "".join(FILLER_SENTENCES) == FILLER


class TextTokenizer(Protocol):
    """What the evaluation prompts need: plain ids in and out, no special tokens added by ``encode``."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class PasskeySample:
    """One passkey prompt: ``input_ids`` has exactly ``length`` tokens; the key's tokens (which decode to
    ``" " + key``) start at ``input_ids[key_token_start]``; ``depth`` is the requested fraction of the
    haystack before the info line."""

    input_ids: list[int]
    key: str
    depth: float
    length: int
    key_token_start: int


class PasskeyPromptBuilder:
    """Encodes the fixed prompt pieces once for a tokenizer and builds prompts of exact token lengths."""

    def __init__(self, tokenizer: TextTokenizer, prefix_ids: Sequence[int] = (), prompt: str = "reference") -> None:
        """``prefix_ids`` (e.g. a BOS/EOT id) are put first and count towards the length. ``prompt``:
        ``reference`` (task line first, as in the reference) or ``compact`` (no task line: the prompt starts
        with the haystack). Compact is our deviation for short training lengths, where the task line alone
        takes a large share of the window (e.g. a 2,048-token BPE needs ~140 tokens for the fixed parts of
        the reference prompt, more than a 128-token window); the info line and question are unchanged."""
        if prompt not in PASSKEY_PROMPTS:
            raise ValueError(f"passkey prompt={prompt!r}: pick one of {', '.join(PASSKEY_PROMPTS)}")
        self.tokenizer = tokenizer
        newline = tokenizer.encode("\n")
        task = [*tokenizer.encode(TASK_LINE), *newline] if prompt == "reference" else []
        self.head = [*prefix_ids, *task]
        self.newline = newline
        self.tail = [*newline, *tokenizer.encode(QUESTION)]
        info_before, info_after = INFO_LINE.split(" {key}", 1)
        self.info_before = [*newline, *tokenizer.encode(info_before)]
        self.info_after_template = info_after
        # The filler as the reference writes it: the first sentence has no leading space.
        first, *rest = FILLER_SENTENCES
        self.first_sentence = tokenizer.encode(first.lstrip())
        self.sentences = [tokenizer.encode(s) for s in (*rest, first)]

    def filler(self) -> Iterator[list[int]]:
        """Token ids of the filler sentences in reading order, endlessly."""
        yield self.first_sentence
        yield from cycle(self.sentences)

    def build(self, key: str, depth: float, length: int) -> PasskeySample:
        """Prompt of exactly ``length`` tokens with the info line at ``depth`` (0..1) of the haystack."""
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth={depth} must be in [0, 1]")
        budget = self.haystack_budget(key, length)
        prefix = self._prefix(round(depth * budget), budget)
        return self.assemble(key, depth, prefix, self._take(budget - len(prefix)))

    def min_length(self, key: str = "12345") -> int:
        """Tokens the prompt needs without any filler (the shortest length ``build`` accepts)."""
        return len(self.head) + len(self.info_before) + len(self.key_ids(key)) + len(self._info_after(key)) + len(
            self.tail)

    def haystack_budget(self, key: str, length: int) -> int:
        """Filler tokens a prompt of ``length`` tokens holds; ``ValueError`` when the fixed parts do not fit."""
        fixed = self.min_length(key)
        if length < fixed:
            raise ValueError(f"length={length} is too short for a passkey prompt: this tokenizer needs at least "
                             f"{fixed} tokens without any filler")
        return length - fixed

    def key_ids(self, key: str) -> list[int]:
        """The key's tokens as they follow "is" (a leading space, then the digits)."""
        return self.tokenizer.encode(f" {key}")

    def assemble(self, key: str, depth: float, prefix: Sequence[int], suffix: Sequence[int]) -> PasskeySample:
        """The prompt with haystack ``prefix`` before the info line and ``suffix`` after it (any filler)."""
        info_after = self._info_after(key)
        key_token_start = len(self.head) + len(prefix) + len(self.info_before)
        input_ids = [*self.head, *prefix, *self.info_before, *self.key_ids(key), *info_after, *suffix, *self.tail]
        return PasskeySample(input_ids, key, depth, len(input_ids), key_token_start)

    def _info_after(self, key: str) -> list[int]:
        return [*self.tokenizer.encode(self.info_after_template.format(key=key)), *self.newline]

    def _prefix(self, target: int, budget: int) -> list[int]:
        """Whole filler sentences whose token count is the sentence boundary nearest ``target`` (<= budget)."""
        prefix: list[int] = []
        for sentence in self.filler():
            longer = len(prefix) + len(sentence)
            if longer > budget or abs(longer - target) >= abs(len(prefix) - target):
                return prefix
            prefix += sentence

    def _take(self, n: int) -> list[int]:
        """The first ``n`` filler tokens (the last sentence may be cut)."""
        ids: list[int] = []
        for sentence in self.filler():
            if len(ids) >= n:
                return ids[:n]
            ids += sentence


def make_passkey_samples(tokenizer: TextTokenizer, lengths: Iterable[int],
                         depths: Sequence[float] = DEFAULT_DEPTHS, keys_per_cell: int = 10, seed: int | str = 0,
                         prefix_ids: Sequence[int] = (), prompt: str = "reference") -> list[PasskeySample]:
    """The grid lengths x depths x ``keys_per_cell`` random keys (10000-99999), deterministic in ``seed`` (an
    int, or a string such as ``"test-1234"``: ``evaluate`` derives it from the split, so the prompts a
    selection on ``val`` sees are never the ones a report on ``test`` shows).

    The paper uses 10 depths x 10 keys per length. Samples are ordered by length, then depth, then key.
    """
    if keys_per_cell < 1:
        raise ValueError(f"keys_per_cell={keys_per_cell} must be >= 1")
    builder = PasskeyPromptBuilder(tokenizer, prefix_ids, prompt)
    rng = random.Random(seed)
    return [builder.build(str(rng.randint(10000, 99999)), depth, length)
            for length in lengths for depth in depths for _ in range(keys_per_cell)]


def score_passkey(generated_text: str, key: str) -> bool:
    """True when the first integer in the generated continuation equals the key (the reference's check)."""
    match = re.search(r"\d+", generated_text)
    return match is not None and int(match.group()) == int(key)


def score_passkey_tokens(generated_ids: Sequence[int], key_ids: Sequence[int]) -> bool:
    """True when the continuation starts with exactly the key's tokens, ``key_ids = encode(" " + key)`` (the
    ids the prompt holds at ``key_token_start``): an exact match, where the first-integer check would also
    pass a longer number or a key given with extra digits split off."""
    return list(generated_ids[: len(key_ids)]) == list(key_ids)


def answer_passkeys(model, tokenizer, samples: Sequence[PasskeySample], max_new_tokens: int,
                    batch_size: int) -> list[bool]:
    """Greedy answers (KV-cached), one batch per length, to ``samples``; ``correct[i]`` for ``samples[i]`` is an
    exact match of the key's tokens (``score_passkey_tokens``: a longer number or a stray digit fails, unlike
    a first-integer check)."""
    correct = [False] * len(samples)
    for length in sorted({s.length for s in samples}):
        rows = [i for i, s in enumerate(samples) if s.length == length]
        generated = greedy_generate(model, [samples[i].input_ids for i in rows], max_new_tokens, batch_size,
                                    tokenizer.vocab_size)
        for i, ids in zip(rows, generated, strict=True):
            correct[i] = score_passkey_tokens(ids, tokenizer.encode(f" {samples[i].key}"))
    return correct


@dataclass(frozen=True)
class PasskeyAccuracy:
    """Fraction of correct answers per (length, depth) cell, per length, and overall."""

    by_cell: dict[tuple[int, float], float]
    by_length: dict[int, float]
    overall: float

    def metrics(self, prefix: str = "passkey") -> dict[str, float]:
        """Flat metric names: ``{prefix}/len{L}/acc`` and ``{prefix}/len{L}/depth{percent}/acc``."""
        out = {f"{prefix}/len{length}/acc": acc for length, acc in self.by_length.items()}
        out.update({f"{prefix}/len{length}/depth{round(depth * 100)}/acc": acc
                    for (length, depth), acc in self.by_cell.items()})
        return out


def passkey_accuracy(samples: Sequence[PasskeySample], correct: Sequence[bool]) -> PasskeyAccuracy:
    """Aggregate per-sample results (``correct[i]`` for ``samples[i]``); lengths and cells keep sample order."""
    if len(samples) != len(correct) or not samples:
        raise ValueError(f"need one result per sample and at least one sample: got {len(samples)} samples "
                         f"and {len(correct)} results")
    cells: dict[tuple[int, float], list[bool]] = defaultdict(list)
    lengths: dict[int, list[bool]] = defaultdict(list)
    for sample, ok in zip(samples, correct, strict=True):
        cells[sample.length, sample.depth].append(bool(ok))
        lengths[sample.length].append(bool(ok))
    return PasskeyAccuracy({cell: _mean(v) for cell, v in cells.items()},
                           {length: _mean(v) for length, v in lengths.items()}, _mean(list(map(bool, correct))))


def _mean(values: Sequence[bool]) -> float:
    return sum(values) / len(values)


def passkey_samples(tokenizer, lengths: list[int], cfg: EvaluateConfig) -> list[PasskeySample]:
    """``evaluate``'s passkey grid: lengths x ``passkey_depths`` depths (0, 1/n, ...) x ``passkey_keys`` keys, BOS
    first, the keys drawn from the split (``<split>-<seed>``); lengths that cannot hold the prompt's fixed parts
    are skipped with one warning line."""
    shortest = PasskeyPromptBuilder(tokenizer, [tokenizer.bos_id], cfg.passkey_prompt).min_length()
    fitting = [n for n in lengths if n >= shortest]
    if len(fitting) < len(lengths):
        print(f"evaluate: passkey skipped at lengths {[n for n in lengths if n < shortest]}: the "
              f"{cfg.passkey_prompt} prompt needs {shortest} tokens", file=sys.stderr)
    depths = [i / cfg.passkey_depths for i in range(cfg.passkey_depths)]
    return make_passkey_samples(tokenizer, fitting, depths, cfg.passkey_keys, f"{cfg.split}-{cfg.seed}",
                                [tokenizer.bos_id], cfg.passkey_prompt)


def run_passkey(model, tokenizer, samples: list[PasskeySample], cfg: EvaluateConfig) -> tuple[dict, dict[str, float]]:
    """``evaluate``'s passkey part: ``(results, metrics)`` with the accuracy per length (and its Wilson
    interval), per (length, depth), and every prompt's outcome (the report pairs methods on the same prompts)."""
    correct = answer_passkeys(model, tokenizer, samples, cfg.max_new_tokens, cfg.batch_size)
    accuracy = passkey_accuracy(samples, correct)
    counts = Counter(s.length for s in samples)
    intervals = {n: wilson(round(acc * counts[n]), counts[n]) for n, acc in accuracy.by_length.items()}
    section = {"prompt": cfg.passkey_prompt, "by_length": accuracy.by_length, "overall": accuracy.overall,
               "by_length_interval": {n: [i.low, i.high] for n, i in intervals.items()},
               "by_cell": [[length, depth, acc] for (length, depth), acc in accuracy.by_cell.items()],
               "samples": [[s.length, s.depth, s.key, bool(ok)] for s, ok in zip(samples, correct, strict=True)]}
    return {"passkey": section}, accuracy.metrics("passkey")
