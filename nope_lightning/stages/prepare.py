"""``prepare``: train the tokenizer and pack the token files of a corpus (other stages call it as needed)."""

from __future__ import annotations

from typing import Any

from nope_lightning.config.stages import PrepareConfig
from nope_lightning.data.prepare import prepare

SPLITS = ("train", "val", "test")


def run(cfg: PrepareConfig) -> dict[str, Any]:
    prepared = prepare(cfg.data)
    summary = {"root": str(prepared.root), "key": prepared.key, "vocab_size": prepared.tokenizer.vocab_size,
               **{f"{split}_tokens": prepared.num_tokens(split) for split in SPLITS}}
    for key, value in summary.items():
        print(f"{key}: {value}")
    return summary


# --- declared results: the registry's ``Stage.results`` (what a later step may reference; the dry run) ---


def result_keys(cfg: PrepareConfig, train_len: int | None = None) -> dict[str, type]:
    """What ``run`` returns: the preparation's folder and key, its vocabulary and each split's token count."""
    return {"root": str, "key": str, "vocab_size": int, **{f"{split}_tokens": int for split in SPLITS}}
