"""Token <-> id mapping and the decoder-only layout ``<bos> prompt <sep> target <eos>``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .core import BOS, EOS, PAD, SEP, SPECIAL_TOKENS, Example
from .scratchpad import SCRATCHPAD_MARKERS
from .tasks import get_task


class Vocabulary:
    """A word-level vocabulary: special tokens and scratchpad markers first, then sorted task tokens.

    ``<pad>`` is id 0. The reserved tokens come first in a fixed order, so their ids are the same
    in every task's vocabulary.
    """

    def __init__(self, tokens: Iterable[str]):
        reserved = (*SPECIAL_TOKENS, *SCRATCHPAD_MARKERS)
        self.tokens: tuple[str, ...] = (*reserved, *sorted(set(tokens) - set(reserved)))
        self._ids = {token: i for i, token in enumerate(self.tokens)}

    @classmethod
    def for_task(cls, task: str) -> Vocabulary:
        """Every token ``task`` can produce, in any format and at any length."""
        return cls(get_task(task).tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self._ids

    def token_id(self, token: str) -> int:
        """The id of ``token``; ``ValueError`` if it is not in the vocabulary."""
        if token not in self._ids:
            raise ValueError(f"token {token!r} is not in the vocabulary")
        return self._ids[token]

    @property
    def pad_id(self) -> int:
        return self._ids[PAD]

    @property
    def bos_id(self) -> int:
        return self._ids[BOS]

    @property
    def eos_id(self) -> int:
        return self._ids[EOS]

    @property
    def sep_id(self) -> int:
        return self._ids[SEP]

    def encode_tokens(self, tokens: Iterable[str]) -> list[int]:
        """Ids of ``tokens``."""
        return [self.token_id(token) for token in tokens]

    def encode_prompt(self, example: Example) -> list[int]:
        """``<bos> prompt <sep>``: the input to generate a prediction from."""
        return self.encode_tokens([BOS, *example.prompt, SEP])

    def encode(self, example: Example) -> tuple[list[int], list[int]]:
        """``(input_ids, loss_mask)`` for ``<bos> prompt <sep> target <eos>``.

        ``loss_mask[i]`` is 1 where token i is a target token or the final ``<eos>`` (the tokens the
        model is trained to predict) and 0 on ``<bos>``, the prompt and ``<sep>``.
        """
        prompt = self.encode_prompt(example)
        target = self.encode_tokens([*example.target, EOS])
        return prompt + target, [0] * len(prompt) + [1] * len(target)

    def decode(self, ids: Sequence[int]) -> list[str]:
        """Tokens of ``ids`` (special tokens included; ``parse_answer`` knows where to cut)."""
        ids = [int(i) for i in ids]  # accept numpy/torch integers too
        if any(not 0 <= i < len(self.tokens) for i in ids):
            raise ValueError(f"ids must lie in [0, {len(self.tokens)}), got {ids}")
        return [self.tokens[i] for i in ids]
