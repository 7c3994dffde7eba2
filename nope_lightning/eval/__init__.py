"""Model-independent evaluation pieces: passkey prompts, LongBench loading and metrics, synthetic long-context
tasks. Each submodule documents its prompt format; all build token ids with a ``TextTokenizer``
(``encode(str) -> list[int]``, ``decode(list[int]) -> str``)."""

from nope_lightning.eval.passkey import TextTokenizer

__all__ = ["TextTokenizer"]
