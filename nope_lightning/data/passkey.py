"""Passkey prompts (Landmark Attention's task, as used by YaRN and the paper §4.3) at exact token lengths: what
``evaluate`` asks (``eval/passkey.py``) and what pre-training's retrieval mix teaches (``data/retrieval.py``).

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
``depth * N`` falls inside the haystack's last, cut sentence).

Segment-wise encoding equals encoding the whole text, except inside the cut last sentence: every segment
that follows other text is encoded as it reads there (``TextTokenizer.encode_continuation``), only the one
that opens the prompt (the task line; in ``compact`` prompts the haystack's first sentence, or the info line's
newline when the haystack before it is empty) with ``encode``. Both are the same for tokenizers that split
words at spaces and newlines (byte-level BPE, whitespace); a SentencePiece tokenizer (Llama 1/2) marks only
the start of a text with ``▁``, so a compact prompt's opening segment there may take a token more, which the
haystack gives up.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import cycle

from nope_lightning.config.core import PASSKEY_PROMPTS
from nope_lightning.data.tokenizer import TextTokenizer

TASK_LINE = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
             "I will quiz you about the important information there.")
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
INFO_LINE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"
# The start of each tenth of the haystack; depth 1.0 (key right before the question) is the easiest case.
DEFAULT_DEPTHS = tuple(i / 10 for i in range(10))

FILLER_SENTENCES = tuple(re.findall(r" [^.]+\.", FILLER))
assert "".join(FILLER_SENTENCES) == FILLER


def continuation_encoder(tokenizer) -> Callable[[str], list[int]]:
    """``tokenizer.encode_continuation`` (ids of a piece as it reads after other text), or ``encode`` for a
    tokenizer with only encode/decode: such a one (whitespace, byte-level BPE) marks no start of text."""
    return getattr(tokenizer, "encode_continuation", tokenizer.encode)


@dataclass(frozen=True)
class PasskeySample:
    """One passkey prompt: ``input_ids`` has exactly ``length`` tokens; the key's tokens (``" " + key`` as it
    follows "is") start at ``input_ids[key_token_start]``; ``depth`` is the requested fraction of the haystack
    before the info line."""

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
        self.continuation = continuation_encoder(tokenizer)
        newline = self.continuation("\n")
        task = [*tokenizer.encode(TASK_LINE), *newline] if prompt == "reference" else []
        self.head = [*prefix_ids, *task]
        self.newline = newline
        self.tail = [*newline, *self.continuation(QUESTION)]
        info_before, info_after = INFO_LINE.split(" {key}", 1)
        self.info_before = [*newline, *self.continuation(info_before)]
        self.info_after_template = info_after
        # The filler as the reference writes it: the first sentence has no leading space.
        first, *rest = FILLER_SENTENCES
        self.first_sentence = self.continuation(first.lstrip())
        self.sentences = [self.continuation(s) for s in (*rest, first)]
        # What opens a compact prompt (module doc): its first sentence, or the info line when no haystack
        # precedes it; a reference prompt opens with the task line, so these are the running-text forms.
        compact = prompt == "compact"
        self.opening_sentence = tokenizer.encode(first.lstrip()) if compact else self.first_sentence
        self.opening_info_before = ([*tokenizer.encode("\n"), *self.continuation(info_before)] if compact
                                    else self.info_before)
        self.opening_extra = len(self.opening_info_before) - len(self.info_before)

    def filler(self, opening: bool = False) -> Iterator[list[int]]:
        """Token ids of the filler sentences in reading order, endlessly; ``opening``: as the haystack before
        the info line begins (the prompt's opening text in a compact prompt)."""
        yield self.opening_sentence if opening else self.first_sentence
        yield from cycle(self.sentences)

    def build(self, key: str, depth: float, length: int) -> PasskeySample:
        """Prompt of exactly ``length`` tokens with the info line at ``depth`` (0..1) of the haystack."""
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth={depth} must be in [0, 1]")
        budget = self.haystack_budget(key, length)
        prefix = self._prefix(round(depth * budget), budget)
        if prefix:
            return self.assemble(key, depth, prefix, self._take(budget - len(prefix)))
        suffix = self._take(budget - self.opening_extra)
        return self._assemble(key, depth, prefix, suffix, self.opening_info_before)

    def min_length(self, key: str = "12345") -> int:
        """Tokens the prompt needs without any filler (the shortest length ``build`` accepts)."""
        return self._fixed(key) + max(self.opening_extra, 0)

    def haystack_budget(self, key: str, length: int) -> int:
        """Filler tokens (prefix + suffix of ``assemble``) a prompt of ``length`` tokens holds; ``build``
        gives ``opening_extra`` of them to the info line when it opens a compact prompt. ``ValueError`` when
        the fixed parts do not fit."""
        shortest = self.min_length(key)
        if length < shortest:
            raise ValueError(f"length={length} is too short for a passkey prompt: this tokenizer needs at least "
                             f"{shortest} tokens without any filler")
        return length - self._fixed(key)

    def key_ids(self, key: str) -> list[int]:
        """The key's tokens as they follow "is" (a leading space, then the digits)."""
        return self.continuation(f" {key}")

    def assemble(self, key: str, depth: float, prefix: Sequence[int], suffix: Sequence[int]) -> PasskeySample:
        """The prompt with haystack ``prefix`` before the info line and ``suffix`` after it (any filler ids,
        taken as running text: the info line is in its running-text form even after an empty ``prefix``)."""
        return self._assemble(key, depth, prefix, suffix, self.info_before)

    def _assemble(self, key: str, depth: float, prefix: Sequence[int], suffix: Sequence[int],
                  info_before: Sequence[int]) -> PasskeySample:
        key_token_start = len(self.head) + len(prefix) + len(info_before)
        input_ids = [*self.head, *prefix, *info_before, *self.key_ids(key), *self._info_after(key), *suffix,
                     *self.tail]
        return PasskeySample(input_ids, key, depth, len(input_ids), key_token_start)

    def _fixed(self, key: str) -> int:
        """Tokens of the prompt's fixed parts in their running-text forms (``assemble``'s, without filler)."""
        return (len(self.head) + len(self.info_before) + len(self.key_ids(key)) + len(self._info_after(key))
                + len(self.tail))

    def _info_after(self, key: str) -> list[int]:
        return [*self.continuation(self.info_after_template.format(key=key)), *self.newline]

    def _prefix(self, target: int, budget: int) -> list[int]:
        """Whole filler sentences whose token count is the sentence boundary nearest ``target`` (<= budget)."""
        prefix: list[int] = []
        for sentence in self.filler(opening=True):
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
