"""Tokenizer + packed token files for a corpus, built once and cached under a content key.

Layout of ``<cache_path>/prepared/<key>/``:

* ``tokenizer.json`` — the byte-level BPE trained on the train split;
* ``<split>.bin`` (split = train, val, test) — every document's tokens, ``<|bos|> ids... <|eos|>``,
  back to back as a flat ``uint16`` array (``uint32`` when the vocabulary exceeds 65536 ids);
* ``<split>.json`` — the index: document ``names``, token ``offsets`` (of each BOS) and ``lengths``
  (BOS and EOS included);
* ``manifest.json`` — the key, settings, sizes, sources/licenses and the byte size + sha256 of every file.

``key`` hashes the corpus content (sorted document names and text hashes), the vocabulary size, the split
settings and ``FORMAT_VERSION``, so any change there gives a fresh folder. The folder is built under a
temporary name and renamed into place when complete; on every load the manifest is checked file by file,
and a cache that fails the check is rebuilt with a warning naming the problem.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from nope_lightning.config.parts import DataConfig
from nope_lightning.data.corpus import Document, corpus_sources, load_documents, split_documents
from nope_lightning.data.tokenizer import TextTokenizer
from nope_lightning.runtime.locks import file_lock

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")
# Texts handed to one encode_batch call: bounds the memory of its Encoding objects (~100 bytes a token).
CHARS_PER_BATCH = 4_000_000


class PreparedData:
    """A verified prepared-data folder: tokenizer plus read-only token arrays per split."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.manifest: dict = json.loads((self.root / "manifest.json").read_text())
        self.key: str = self.manifest["key"]
        self.dtype = np.dtype(self.manifest["dtype"])
        self.tokenizer = TextTokenizer.load(self.root / "tokenizer.json")

    def tokens(self, split: str) -> np.memmap:
        """All tokens of ``split``, shape ``(num_tokens(split),)``, read-only memory map."""
        return np.memmap(self._path(split, ".bin"), dtype=self.dtype, mode="r")

    def documents(self, split: str) -> list[tuple[str, np.ndarray]]:
        """``(name, token ids)`` per document of ``split``; ids include the leading BOS and trailing EOS."""
        index, tokens = self.index(split), self.tokens(split)
        return [(name, tokens[start:start + length])
                for name, start, length in zip(index["names"], index["offsets"], index["lengths"], strict=True)]

    def num_tokens(self, split: str) -> int:
        """Number of tokens in ``split`` (BOS/EOS included)."""
        return self._path(split, ".bin").stat().st_size // self.dtype.itemsize

    def index(self, split: str) -> dict[str, list]:
        """``{"names": [...], "offsets": [...], "lengths": [...]}`` of ``split`` (offsets/lengths in tokens)."""
        return json.loads(self._path(split, ".json").read_text())

    def _path(self, split: str, suffix: str) -> Path:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; pick one of {', '.join(SPLITS)}")
        return self.root / f"{split}{suffix}"


def prepare(data_cfg: DataConfig) -> PreparedData:
    """Load the corpus, then return its prepared data from the cache, building it if missing or invalid.

    Raises what ``load_documents`` / ``split_documents`` raise for a bad corpus or split.
    """
    docs = load_documents(data_cfg.corpus, data_cfg.cache_path)
    key = cache_key(docs, data_cfg)
    root = data_cfg.cache_path / "prepared" / key
    # Processes preparing the same data (the ranks of a DDP run, which start before any process group
    # exists, or two stages) take turns: the first builds, the others then find the cache and only read it.
    with file_lock(root.with_name(f"{key}.lock")):
        if root.exists():
            problem = check_cache(root)
            if problem is None:
                log.info("prepared data cache hit: %s", root)
                return PreparedData(root)
            warnings.warn(f"prepared data cache {root} is invalid ({problem}); rebuilding it", stacklevel=2)
        _build(docs, data_cfg, root)
        return PreparedData(root)


def cache_key(docs: list[Document], data_cfg: DataConfig) -> str:
    """16 hex digits of sha256 over the corpus content and every setting that changes the output."""
    corpus = hashlib.sha256()
    for doc in sorted(docs, key=lambda d: d.name):
        corpus.update(f"{doc.name}\0{hashlib.sha256(doc.text.encode('utf-8')).hexdigest()}\n".encode())
    identity = {"format": FORMAT_VERSION, "corpus": corpus.hexdigest(), "vocab_size": data_cfg.vocab_size,
                "split_seed": data_cfg.split_seed, "val_fraction": data_cfg.val_fraction,
                "test_fraction": data_cfg.test_fraction}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def check_cache(root: Path) -> str | None:
    """What is wrong with the prepared folder ``root``, or ``None`` when every file matches its manifest."""
    try:
        manifest = json.loads((root / "manifest.json").read_text())
        files = manifest["files"]
        key, version = manifest["key"], manifest["format"]
    except FileNotFoundError:
        return "manifest.json is missing"
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
        return "manifest.json is unreadable"
    if version != FORMAT_VERSION or key != root.name:
        return f"manifest.json is for format {version}, key {key}"
    expected = {"tokenizer.json", *(f"{s}{ext}" for s in SPLITS for ext in (".bin", ".json"))}
    if set(files) != expected:
        return f"manifest.json lists {sorted(files)}, expected {sorted(expected)}"
    for name, meta in sorted(files.items()):
        path = root / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != meta["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {meta['bytes']}"
        if _sha256(path) != meta["sha256"]:
            return f"{name} does not match its sha256 in the manifest (corrupt file)"
    return None


def _build(docs: list[Document], data_cfg: DataConfig, root: Path) -> None:
    """Write the whole folder under a temporary name, then rename it to ``root``."""
    splits = split_documents(docs, data_cfg.val_fraction, data_cfg.test_fraction, data_cfg.split_seed)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}-"))
    try:
        start = time.perf_counter()
        tokenizer = TextTokenizer.train((d.text for d in splits["train"]), data_cfg.vocab_size)
        log.info("trained a %d-id tokenizer on %d train documents in %.1f s", tokenizer.vocab_size,
                 len(splits["train"]), time.perf_counter() - start)
        tokenizer.save(tmp / "tokenizer.json")
        dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32)
        stats = {split: _write_split(tokenizer, split_docs, tmp, split, dtype)
                 for split, split_docs in splits.items()}
        manifest = {
            "format": FORMAT_VERSION, "key": root.name, "corpus": data_cfg.corpus,
            "vocab_size": tokenizer.vocab_size, "vocab_size_requested": data_cfg.vocab_size,
            "dtype": dtype.name, "tokenizer_fingerprint": tokenizer.fingerprint,
            "split": {"seed": data_cfg.split_seed, "val_fraction": data_cfg.val_fraction,
                      "test_fraction": data_cfg.test_fraction},
            "splits": stats,
            "sources": {name: {"origin": s.origin, "license": s.license}
                        for name, s in corpus_sources(data_cfg.corpus).items()},
            "files": {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(tmp.iterdir())},
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
        _publish(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("prepared data written to %s", root)


def _write_split(tokenizer: TextTokenizer, docs: list[Document], folder: Path, split: str,
                 dtype: np.dtype) -> dict[str, int]:
    """Tokenize ``docs`` into ``<split>.bin`` + ``<split>.json``; return document/char/token counts."""
    names, offsets, lengths = [], [], []
    total_chars = sum(len(d.text) for d in docs)
    start, position = time.perf_counter(), 0
    with (folder / f"{split}.bin").open("wb") as out, \
            tqdm(total=total_chars, unit="char", unit_scale=True, desc=f"tokenize {split}") as bar:
        for batch in _batches(docs, CHARS_PER_BATCH):
            for doc, ids in zip(batch, tokenizer.encode_batch([d.text for d in batch]), strict=True):
                packed = np.empty(len(ids) + 2, dtype=dtype)
                packed[0], packed[1:-1], packed[-1] = tokenizer.bos_id, ids, tokenizer.eos_id
                out.write(packed.tobytes())
                names.append(doc.name)
                offsets.append(position)
                lengths.append(len(packed))
                position += len(packed)
            bar.update(sum(len(d.text) for d in batch))
    (folder / f"{split}.json").write_text(json.dumps({"names": names, "offsets": offsets, "lengths": lengths}))
    log.info("tokenized %s: %d documents, %d chars -> %d tokens in %.1f s", split, len(docs), total_chars,
             position, time.perf_counter() - start)
    return {"documents": len(docs), "chars": total_chars, "tokens": position}


def _batches(docs: list[Document], max_chars: int) -> list[list[Document]]:
    """Consecutive groups of documents with at most ``max_chars`` characters (or one longer document)."""
    batches: list[list[Document]] = [[]]
    size = 0
    for doc in docs:
        if batches[-1] and size + len(doc.text) > max_chars:
            batches.append([])
            size = 0
        batches[-1].append(doc)
        size += len(doc.text)
    return batches


def _publish(tmp: Path, root: Path) -> None:
    """Rename the finished folder ``tmp`` to ``root``, replacing an invalid ``root``. If another process
    published a valid ``root`` first (e.g. DDP ranks preparing at once), keep theirs."""
    if root.exists():
        stale = root.with_name(f".{root.name}.stale-{os.getpid()}")
        root.rename(stale)
        shutil.rmtree(stale)
    try:
        tmp.rename(root)
    except OSError:
        if check_cache(root) is not None:
            raise


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
