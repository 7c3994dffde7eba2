"""Evaluation pieces: passkey scoring, LongBench loading and metrics, synthetic long-context tasks, perplexity
and its summaries. Each submodule documents its prompt format; all build token ids with ``data``'s
``TextTokenizer`` (``encode(str) -> list[int]``, ``decode(list[int]) -> str``)."""
