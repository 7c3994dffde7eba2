"""Byte-level BPE trained locally with HF ``tokenizers``: lossless on any text, deterministic, no download.

Ids 0 and 1 are ``<|bos|>`` and ``<|eos|>``; ids 2..257 cover the 256 bytes, so any string encodes.
The special tokens are never produced by ``encode``: a literal ``"<|bos|>"`` inside a document is
encoded as ordinary text, so only the packing code places document boundaries.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS = "<|bos|>"
EOS = "<|eos|>"


class TextTokenizer:
    """A thin wrapper over a ``tokenizers.Tokenizer`` with BOS/EOS ids and a content fingerprint."""

    def __init__(self, tokenizer: Tokenizer):
        bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
        if bos is None or eos is None:
            raise ValueError(f"tokenizer lacks the special tokens {BOS} / {EOS}")
        tokenizer.encode_special_tokens = True  # runtime setting, not stored in tokenizer.json
        self._tokenizer = tokenizer
        self.bos_id: int = bos
        self.eos_id: int = eos

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> TextTokenizer:
        """Train on ``texts`` (the train split only) up to ``vocab_size`` ids, special tokens included.

        A corpus too small for that many merges gives a smaller vocabulary (``vocab_size`` reports it).
        """
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[BOS, EOS],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tokenizer.train_from_iterator(texts, trainer)
        return cls(tokenizer)

    @classmethod
    def load(cls, path: str | os.PathLike) -> TextTokenizer:
        """Read a ``tokenizer.json`` written by ``save``."""
        return cls(Tokenizer.from_file(str(path)))

    def save(self, path: str | os.PathLike) -> None:
        """Write ``tokenizer.json`` atomically (temporary file, then rename)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(self.to_json(), encoding="utf-8")
        tmp.replace(path)

    def to_json(self) -> str:
        """The ``tokenizer.json`` text (what ``save`` writes and ``fingerprint`` hashes)."""
        return self._tokenizer.to_str()

    @property
    def fingerprint(self) -> str:
        """sha256 (hex) of the ``tokenizer.json`` text: equal fingerprints mean identical tokenizers."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    @property
    def vocab_size(self) -> int:
        """Number of ids (largest id + 1), special tokens included."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without BOS/EOS."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``encode`` for many texts at once, in parallel across texts (Rust threads)."""
        return [e.ids for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (a list, numpy array or tensor); BOS/EOS are dropped: they mark boundaries."""
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return self._tokenizer.decode(ids, skip_special_tokens=True)
