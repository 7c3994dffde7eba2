"""Retrieval sequences mixed into pre-training: a passkey hidden in corpus text, with its answer.

A 4-layer model trained for minutes on books has no reason to learn long-range copying, so passkey retrieval
scores 0 even inside ``train_len`` and the question paper 001 asks of it (does retrieval survive past L?)
has no answer at laptop scale. ``pretrain`` can therefore replace a fraction of its training windows by
retrieval sequences. Off by default and in the paper recipe; the ``small`` recipe turns it on, and the
report says so.

A retrieval sequence has exactly ``train_len + 1`` tokens (one training window)::

    [corpus text ... EOS] BOS {task line} {haystack a} \\n The pass key is K. Remember it. K is the pass key. \\n
    {haystack b} \\n What is the pass key? The pass key is K.

i.e. a passkey prompt (``PasskeyPromptBuilder``, the evaluation's own prompt pieces, ``reference`` or
``compact``) whose haystack is, by ``filler``: ``corpus``, a random span of the training split; ``reference``,
the reference's repeated filler sentences; ``mixed``, either with probability 1/2; followed by the key's
tokens and a full stop, so the answer tokens are ordinary next-token
targets. The full stop teaches the model where an answer ends: without it the key closes the window, the
model never sees what follows a key, and greedy decoding runs on into more digits. With ``length=uniform``
the prompt's length is uniform between the shortest that holds ``MIN_HAYSTACK`` filler tokens and the whole
window, and the rest of the window before it is corpus text closed by EOS (as a packed document boundary
would be); the key-to-question distance is then a product of two uniforms, so keys near the start of a
full-length prompt (the evaluation's depth 0 at ``train_len``) are rare. ``length=full`` makes every prompt
fill the window, so that distance is uniform over all of ``train_len``. The info line's depth is uniform in
[0, 1]; keys are uniform 5-digit numbers, as in evaluation.

Why ``mixed`` is the small recipe's choice (measured, 4 x 128 NoPE, 2,750 steps, 40 % retrieval): trained on
corpus filler only, the model copies the key from corpus filler (97 % of keys exact, teacher-forced, at
L = 128) but only 35 % from the reference filler, whose repeated short sentences it has never read; the
evaluation uses the reference filler. The skill is the same; the filler is a distribution shift we remove.
"""

from __future__ import annotations

import numpy as np

from nope_lightning.config.core import RETRIEVAL_FILLERS, RETRIEVAL_LENGTHS
from nope_lightning.config.data import RetrievalConfig
from nope_lightning.data.passkey import PasskeyPromptBuilder, continuation_encoder

#: Fewest haystack tokens a retrieval sequence holds (else the "retrieval" is a copy from a few tokens back).
MIN_HAYSTACK = 16
KEY_RANGE = (10000, 100000)  # 5-digit keys, as make_passkey_samples draws them


class RetrievalMix:
    """Replaces a ``fraction`` of each training batch by retrieval sequences (see the module docstring).

    The number of replaced rows of a batch of B is ``floor(fraction * B + u)`` with u uniform in [0, 1), so
    the expected share is exactly ``fraction``; which rows, and every sequence's content, come from the
    caller's generator (a pure function of seed, step and rank, so resumed runs see the same data).
    """

    def __init__(self, tokenizer, fraction: float, seq_len: int, prompt: str = "compact",
                 filler: str = "mixed", length: str = "uniform") -> None:
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"retrieval.fraction={fraction} must be in [0, 1): the share of training windows "
                             f"replaced by passkey sequences")
        if filler not in RETRIEVAL_FILLERS:
            raise ValueError(f"retrieval.filler={filler!r}: pick one of {', '.join(RETRIEVAL_FILLERS)}")
        if length not in RETRIEVAL_LENGTHS:
            raise ValueError(f"retrieval.length={length!r}: pick one of {', '.join(RETRIEVAL_LENGTHS)}")
        self.fraction, self.width, self.filler, self.length = fraction, seq_len + 1, filler, length
        self.builder = PasskeyPromptBuilder(tokenizer, [tokenizer.bos_id], prompt)
        self.eos = tokenizer.eos_id
        self.stop = continuation_encoder(tokenizer)(".")  # the answer's full stop, as running text reads it
        self.shortest = self.builder.min_length() + MIN_HAYSTACK
        key_len = len(self.builder.key_ids(str(KEY_RANGE[0]))) + len(self.stop)
        if self.shortest + key_len > self.width:
            raise ValueError(f"train_len={seq_len} cannot hold a retrieval sequence: the {prompt} passkey prompt "
                             f"needs {self.shortest} tokens with {MIN_HAYSTACK} of haystack, plus {key_len} for "
                             f"the answer; use retrieval.prompt=compact or a longer train_len")

    def apply(self, batch: np.ndarray, tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``batch`` (B, seq_len + 1) with some rows replaced (in place); ``tokens`` is the train split."""
        count = int(np.floor(self.fraction * len(batch) + rng.random()))
        for row in rng.choice(len(batch), size=count, replace=False):
            batch[row] = self.sequence(tokens, rng)[0]
        return batch

    def sequence(self, tokens: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, int, str]:
        """One retrieval sequence: ``(ids (seq_len + 1,) int64, answer_start, key)``; ``ids[answer_start:]``
        are the key's tokens and the full stop (the answer), scored as the targets of inputs
        ``answer_start - 1 ...``."""
        key = str(rng.integers(*KEY_RANGE))
        key_ids = [*self.builder.key_ids(key), *self.stop]
        longest = self.width - len(key_ids)
        prompt_len = longest if self.length == "full" else int(rng.integers(self.shortest, longest + 1))
        budget = self.builder.haystack_budget(key, prompt_len)
        depth = float(rng.random())
        reference = self.filler == "reference" or (self.filler == "mixed" and rng.random() < 0.5)
        if reference:
            prompt = self.builder.build(key, depth, prompt_len).input_ids
        else:
            hay_start = int(rng.integers(0, len(tokens) - budget + 1))
            haystack = tokens[hay_start:hay_start + budget].tolist()
            cut = round(depth * budget)
            prompt = self.builder.assemble(key, depth, haystack[:cut], haystack[cut:]).input_ids
        lead = self.width - len(prompt) - len(key_ids)
        lead_start = int(rng.integers(0, len(tokens) - lead + 1))
        before = [*tokens[lead_start:lead_start + lead - 1].tolist(), self.eos] if lead else []
        ids = np.asarray([*before, *prompt, *key_ids], dtype=np.int64)
        assert len(ids) == self.width
        return ids, self.width - len(key_ids), key


def recipe_mix(tokenizer, retrieval: RetrievalConfig, seq_len: int) -> RetrievalMix | None:
    """A pre-training recipe's retrieval mix (``retrieval``) at windows of ``seq_len`` tokens, or None when the
    recipe has none (``fraction=0``): what pretrain trains on, and what HeadScale and the fine-tunes tune on
    with ``data_mix=recipe``."""
    if not retrieval.fraction:
        return None
    return RetrievalMix(tokenizer, retrieval.fraction, seq_len, retrieval.prompt, retrieval.filler, retrieval.length)
