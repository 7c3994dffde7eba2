"""``prepare``: train the tokenizer and pack the token files of a corpus (other stages call it as needed)."""

from __future__ import annotations

from typing import Any

from nope_lightning.config import PrepareConfig
from nope_lightning.data import prepare


def run(cfg: PrepareConfig) -> dict[str, Any]:
    prepared = prepare(cfg.data)
    summary = {"root": str(prepared.root), "key": prepared.key, "vocab_size": prepared.tokenizer.vocab_size,
               **{f"{split}_tokens": prepared.num_tokens(split) for split in ("train", "val", "test")}}
    for key, value in summary.items():
        print(f"{key}: {value}")
    return summary
