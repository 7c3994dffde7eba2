"""Tokenizers as ``tokenizers.Tokenizer`` objects: the suite's own byte-level BPE, or a Hugging Face model's.

The suite's own is trained locally with HF ``tokenizers``: lossless on any text, deterministic, no download.
Ids 0 and 1 are ``<|bos|>`` and ``<|eos|>``; ids 2..257 cover the 256 bytes, so any string encodes.

A Hugging Face model's (Llama family: SentencePiece BPE with byte fallback, or Llama 3's byte-level BPE) comes
from its folder through ``hf_tokenizer_json``; its BOS/EOS pair is found as ``TextTokenizer`` says.

Special tokens are never produced by ``encode``: a literal ``"<|bos|>"`` (or ``"<s>"``, common in HTML) inside
a document is encoded as ordinary text, so only the packing code places document boundaries.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS = "<|bos|>"
EOS = "<|eos|>"
#: BOS/EOS pairs of Hugging Face tokenizers tried after the suite's own and a ``tokenizer_config.json``'s:
#: Llama 1/2 and other SentencePiece models, then Llama 3.
KNOWN_PAIRS = (("<s>", "</s>"), ("<|begin_of_text|>", "<|end_of_text|>"))
#: Text put before a piece by ``TextTokenizer.encode_continuation``, tried in order: a newline first because
#: Llama 1/2's vocabularies have no piece holding one (it is byte fallback), so it merges with nothing.
CONTINUATION_CONTEXTS = ("\n", ".", "|")


class TextTokenizer:
    """A thin wrapper over a ``tokenizers.Tokenizer`` with BOS/EOS ids and a content fingerprint."""

    def __init__(self, tokenizer: Tokenizer, special_tokens: tuple[str, str] | None = None):
        """BOS/EOS are the first pair of these that ``tokenizer`` has: the suite's ``<|bos|>`` / ``<|eos|>``,
        ``special_tokens`` (the pair a Hugging Face ``tokenizer_config.json`` names), then ``KNOWN_PAIRS``."""
        pairs = [(BOS, EOS), *([special_tokens] if special_tokens else []), *KNOWN_PAIRS]
        found = next(((bos, eos) for bos, eos in pairs
                      if tokenizer.token_to_id(bos) is not None and tokenizer.token_to_id(eos) is not None), None)
        if found is None:
            tried = ", ".join(f"{bos} / {eos}" for bos, eos in pairs)
            raise ValueError(f"tokenizer has none of the BOS/EOS pairs {tried}: name its pair as bos_token / "
                             "eos_token in a tokenizer_config.json beside its tokenizer.json")
        # Runtime setting, not stored in tokenizer.json; Hugging Face calls it split_special_tokens=True.
        tokenizer.encode_special_tokens = True
        self._tokenizer = tokenizer
        self.bos_id: int = tokenizer.token_to_id(found[0])
        self.eos_id: int = tokenizer.token_to_id(found[1])

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
        """Read a ``tokenizer.json`` (written by ``save``, or ``hf_tokenizer_json``'s text), with the BOS/EOS pair
        that a ``tokenizer_config.json`` beside it names, if any (see ``__init__``)."""
        path = Path(path)
        return cls(Tokenizer.from_file(str(path)), hf_special_tokens(path.parent))

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
        """Token ids of ``text``, without BOS/EOS; a Hugging Face tokenizer's are what its ``encode(text,
        add_special_tokens=False, split_special_tokens=True)`` gives."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_continuation(self, text: str) -> list[int]:
        """Token ids of ``text`` as it reads in the middle of running text, for prompts made of separately
        encoded pieces: their concatenation then equals the encoding of the whole text.

        A tokenizer that marks the start of a text (a ``Metaspace`` pre-tokenizer with ``prepend_scheme``
        first/always, as transformers converts SentencePiece models; the ``Prepend("▁")`` normalizer of Llama
        1/2's and TinyLlama's tokenizer.json; a byte-level pre-tokenizer with ``add_prefix_space``) gives
        ``encode`` a leading ``▁`` (or space) that text in the middle lacks: ``"\n"`` -> ``["▁", "<0x0A>"]``
        for ``["<0x0A>"]``. For those, ``text`` is encoded after the first of ``CONTINUATION_CONTEXTS`` whose
        own ids begin the combined encoding (so no token straddles the seam), and those ids are dropped. Any
        other tokenizer (the suite's byte-level BPE, Llama 3's) gives exactly ``encode(text)``.
        """
        if not _marks_text_start(self._tokenizer):
            return self.encode(text)
        for context in CONTINUATION_CONTEXTS:
            head, ids = self.encode(context), self.encode(context + text)
            if ids[:len(head)] == head:
                return ids[len(head):]
        raise ValueError(f"this tokenizer merges {text!r} with each of {CONTINUATION_CONTEXTS}, so it cannot "
                         "be encoded apart from the text before it: encode the whole text instead")

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``encode`` for many texts at once, in parallel across texts (Rust threads)."""
        return [e.ids for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (a list, numpy array or tensor); special tokens (BOS/EOS, a Hugging Face tokenizer's
        ``<unk>``...) are dropped, as Hugging Face's ``decode(ids, skip_special_tokens=True)`` drops them."""
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return self._tokenizer.decode(ids, skip_special_tokens=True)


def _marks_text_start(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer``'s normalizer or pre-tokenizer (at any depth of a ``Sequence``) adds a ``▁`` or
    space at the start of a text (``TextTokenizer.encode_continuation``)."""
    def marks(component) -> bool:
        if isinstance(component, list):
            return any(map(marks, component))
        if not isinstance(component, dict):
            return False
        kind = component.get("type")
        prepends = {"Prepend": True, "Metaspace": component.get("prepend_scheme") in ("first", "always"),
                    "ByteLevel": bool(component.get("add_prefix_space"))}
        return prepends.get(kind, False) or any(marks(value) for value in component.values())

    # Each component's own state is a few hundred bytes, unlike to_json(), which holds the whole vocabulary.
    return any(component is not None and marks(json.loads(component.__getstate__()))
               for component in (tokenizer.normalizer, tokenizer.pre_tokenizer))


def hf_special_tokens(folder: Path) -> tuple[str, str] | None:
    """The (BOS, EOS) pair that ``folder``'s Hugging Face ``tokenizer_config.json`` names as ``bos_token`` /
    ``eos_token``; None without that file or when it lacks either (e.g. Qwen's ``bos_token: null``)."""
    config_file = Path(folder) / "tokenizer_config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text(encoding="utf-8"))
    # Older transformers write each token as an AddedToken dict with its text under "content".
    bos, eos = (token.get("content") if isinstance(token, dict) else token
                for token in (config.get("bos_token"), config.get("eos_token")))
    return (bos, eos) if bos and eos else None


def hf_tokenizer_json(folder: Path) -> str:
    """The ``tokenizer.json`` text of the Hugging Face model folder ``folder`` (e.g. TinyLlama's), for
    ``TextTokenizer``: the folder's ``tokenizer.json``, else its SentencePiece ``tokenizer.model`` converted by
    transformers' ``AutoTokenizer`` (local files only; the folder's ``tokenizer_config.json`` picks the class and
    options such as ``legacy``; needs the ``sentencepiece`` and ``protobuf`` packages).

    The text is re-serialized by ``tokenizers`` without truncation or padding: Hugging Face applies neither
    unless a call asks, the suite encodes whole documents, and its sha256 is then ``TextTokenizer.fingerprint``.
    The BOS/EOS pair is not in it: write the folder's ``tokenizer_config.json`` beside it, where
    ``TextTokenizer.load`` reads the pair (without it, a Llama or Llama 3 pair is still found).
    """
    folder = Path(folder)
    if (folder / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    elif (folder / "tokenizer.model").is_file():
        # Imported here: transformers takes seconds to import and only this conversion needs it.
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True).backend_tokenizer
    else:
        raise ValueError(f"{folder} has neither tokenizer.json nor tokenizer.model: point the import at a "
                         "Hugging Face model folder that has one")
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer.to_str()
