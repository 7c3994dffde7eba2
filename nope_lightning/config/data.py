"""What a model reads: the corpus, tokenizer and split settings, and the passkey sequences mixed into pre-training
(checked as ``config/core.py`` checks)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nope_lightning.config.core import (
    DATA_ENGINES,
    PASSKEY_PROMPTS,
    RETRIEVAL_FILLERS,
    RETRIEVAL_LENGTHS,
    check_choice,
    check_range,
)


@dataclass
class DataConfig:
    """Corpus, tokenizer and split settings (``docs/configuration.md``).

    ``corpus``: ``kjv`` (the 66 books of the King James Bible; no fetch: the ``small`` recipe's corpus),
    ``books`` (KJV Bible + Shakespeare/Milton + Austen), ``code`` (CPython stdlib), ``math`` (HOL Light,
    Metamath, Coq), ``tiny`` (a few KJV books; no fetch, for tests) or a user's files (``data/streaming.py``):
    a folder of .txt/.jsonl/.parquet files, a .jsonl or .parquet file, or a ``datasets`` save_to_disk folder.
    Splits are by whole document with ``split_seed``. ``tokenizer``: a tokenizer.json to use (its vocabulary
    replaces ``vocab_size``); empty trains a BPE. ``engine``: ``memory`` or ``litdata`` (``data/prepare.py``):
    the train split streamed into litdata chunks by ``num_workers`` processes (0: one per core), read back by
    ``StreamingDataset``. ``cache_dir`` empty means ``$NOPE_LIGHTNING_CACHE`` or ``~/.cache/nope_lightning``.
    """

    corpus: str = "kjv"
    vocab_size: int = 2048
    split_seed: int = 1234
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    cache_dir: str = ""
    num_workers: int = 0
    tokenizer: str = ""
    engine: str = "memory"

    def __post_init__(self) -> None:
        check_range("data.vocab_size", self.vocab_size, 260)
        check_range("data.val_fraction", self.val_fraction, 0.0, 0.5, low_open=True)
        check_range("data.test_fraction", self.test_fraction, 0.0, 0.5, low_open=True)
        check_range("data.num_workers", self.num_workers, 0)
        check_choice("data.engine", self.engine, DATA_ENGINES)
        if not self.corpus:
            raise ValueError("data.corpus is empty: name a corpus (kjv, books, code, math, tiny) or a path")

    @property
    def cache_path(self) -> Path:
        root = self.cache_dir or os.environ.get("NOPE_LIGHTNING_CACHE") or "~/.cache/nope_lightning"
        return Path(root).expanduser()


@dataclass
class RetrievalConfig:
    """Passkey sequences mixed into pre-training (``data/retrieval.py``); off (``fraction=0``) by default.

    ``fraction`` of the training windows (expected share, in [0, 1)) become a passkey prompt whose haystack
    is corpus text (``filler=corpus``), the reference passkey filler (``reference``) or either (``mixed``),
    followed by the key; ``prompt`` is the passkey prompt form (``compact`` drops the task line so the prompt
    fits short windows) and should match evaluate's ``passkey_prompt``. ``length``: ``uniform`` draws the
    prompt's length uniformly up to the window (the rest is corpus text), ``full`` makes every prompt fill the
    window, so the key-to-question distance is uniform over the whole of ``train_len``.
    """

    fraction: float = 0.0
    prompt: str = "compact"
    filler: str = "mixed"
    length: str = "uniform"

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction < 1.0:
            raise ValueError(f"retrieval.fraction={self.fraction} is out of range: it must be in [0, 1)")
        check_choice("retrieval.prompt", self.prompt, PASSKEY_PROMPTS)
        check_choice("retrieval.filler", self.filler, RETRIEVAL_FILLERS)
        check_choice("retrieval.length", self.length, RETRIEVAL_LENGTHS)
