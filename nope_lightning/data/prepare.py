"""Tokenizer + packed token files for a corpus, built once and cached under a content key.

Layout of ``<cache_path>/prepared/<key>/``:

* ``tokenizer.json`` — the byte-level BPE trained on the train split, or the ``data.tokenizer`` file's;
* ``<split>.bin`` (split = train, val, test) — every document's tokens, ``<|bos|> ids... <|eos|>``,
  back to back as a flat ``uint16`` array (``uint32`` when the vocabulary exceeds 65536 ids);
* ``<split>.json`` — the index: document ``names``, token ``offsets`` (of each BOS) and ``lengths``
  (BOS and EOS included);
* ``manifest.json`` — the key, settings, sizes, sources/licenses and the byte size + sha256 of every file.

``key`` hashes the corpus content (sorted document names and text hashes), the vocabulary size (or the given
tokenizer's fingerprint), the split settings and ``FORMAT_VERSION``, so any change there gives a fresh folder.
The folder is built under a temporary name and renamed into place when complete; on every load the manifest is
checked file by file, and a cache that fails the check is rebuilt with a warning naming the problem.

``data.engine=litdata`` (a pretraining corpus of up to ~100B tokens) writes the same streams another way. A
user's corpus is never held: a first pass keeps each document's ``Record`` (name and place, ~200 bytes), the
split is ``split_documents`` of those, and the train split (nearly all the tokens) is tokenized by
``data.num_workers`` litdata worker processes into ``train/`` (``index.json`` + token chunks), in the same
document order, so the chunks hold the memory path's train stream. ``val``/``test`` stay ``<split>.bin`` +
``.json``, written a batch of documents at a time: validation and evaluation read held-out documents by index,
which litdata's token chunks do not keep, and held-out splits are a small share. Its key hashes each file's
path, size and modification time instead of the text (see ``UserCorpus.fingerprint``); a built-in corpus
keeps its in-memory loader and content key. The manifest hashes every file, but a load checks the chunks by
size only: re-hashing 200 GB of chunks would take minutes at every start.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from nope_lightning.config.data import DataConfig
from nope_lightning.data.corpus import (
    BUILTIN_CORPORA,
    Document,
    corpus_sources,
    load_documents,
    split_documents,
)
from nope_lightning.data.streaming import UserCorpus, default_workers, pack, read_texts, write_token_chunks
from nope_lightning.data.tokenizer import TextTokenizer
from nope_lightning.runtime.locks import file_lock

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")
# Texts handed to one encode_batch call: bounds the memory of its Encoding objects (~100 bytes a token).
CHARS_PER_BATCH = 4_000_000


class PreparedData:
    """A verified prepared-data folder: tokenizer plus read-only token arrays per split (for
    ``engine=litdata`` the train split is litdata chunks under ``train/``, which ``datamodule.StreamedBlocks``
    reads)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.manifest: dict = json.loads((self.root / "manifest.json").read_text())
        self.key: str = self.manifest["key"]
        self.dtype = np.dtype(self.manifest["dtype"])
        self.engine: str = self.manifest.get("engine", "memory")
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
        if self.streamed(split):
            return self.manifest["splits"][split]["tokens"]
        return self._path(split, ".bin").stat().st_size // self.dtype.itemsize

    def index(self, split: str) -> dict[str, list]:
        """``{"names": [...], "offsets": [...], "lengths": [...]}`` of ``split`` (offsets/lengths in tokens)."""
        return json.loads(self._path(split, ".json").read_text())

    def streamed(self, split: str) -> bool:
        """Whether ``split`` is litdata chunks (the train split of ``engine=litdata``), not a packed file."""
        return self.engine == "litdata" and split == "train"

    def _path(self, split: str, suffix: str) -> Path:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; pick one of {', '.join(SPLITS)}")
        if self.streamed(split):
            raise ValueError(f"the train split of {self.root} is litdata chunks (data.engine=litdata): read "
                             f"it through datamodule.StreamedBlocks, or prepare with data.engine=memory")
        return self.root / f"{split}{suffix}"


def prepare(data_cfg: DataConfig) -> PreparedData:
    """Load the corpus, then return its prepared data from the cache, building it if missing or invalid. With
    ``engine=litdata`` a user's corpus is only listed here; a build streams it (see the module docstring).

    Raises what ``load_documents`` / ``split_documents`` raise for a bad corpus or split, and ``ValueError``
    for a ``data.tokenizer`` that is not a file.
    """
    streamed = data_cfg.engine == "litdata" and data_cfg.corpus not in BUILTIN_CORPORA
    if streamed:
        corpus = UserCorpus(data_cfg.corpus, known=BUILTIN_CORPORA)
        key = _key(f"files:{corpus.fingerprint()}", data_cfg)
    else:
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
        if streamed:
            _build_streamed(corpus, data_cfg, root)
        else:
            _build(split_documents(docs, data_cfg.val_fraction, data_cfg.test_fraction, data_cfg.split_seed),
                   data_cfg, root, streamed=False)
        return PreparedData(root)


def cache_key(docs: list[Document], data_cfg: DataConfig) -> str:
    """16 hex digits of sha256 over the corpus content and every setting that changes the output."""
    corpus = hashlib.sha256()
    for doc in sorted(docs, key=lambda d: d.name):
        corpus.update(f"{doc.name}\0{hashlib.sha256(doc.text.encode('utf-8')).hexdigest()}\n".encode())
    return _key(corpus.hexdigest(), data_cfg)


def _key(corpus: str, data_cfg: DataConfig) -> str:
    """The key of ``corpus`` (a fingerprint) under ``data_cfg``. Settings at their defaults add nothing, so
    the keys of caches built before those settings existed still hold."""
    identity: dict[str, Any] = {"format": FORMAT_VERSION, "corpus": corpus, "vocab_size": data_cfg.vocab_size,
                                "split_seed": data_cfg.split_seed, "val_fraction": data_cfg.val_fraction,
                                "test_fraction": data_cfg.test_fraction}
    if data_cfg.tokenizer:  # the file's fingerprint fixes the vocabulary; vocab_size is unused
        del identity["vocab_size"]
        identity["tokenizer"] = given_tokenizer(data_cfg).fingerprint
    if data_cfg.engine != "memory":
        identity["engine"] = data_cfg.engine
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def given_tokenizer(data_cfg: DataConfig) -> TextTokenizer:
    """The ``data.tokenizer`` file's tokenizer; ``ValueError`` when there is no such file."""
    path = Path(data_cfg.tokenizer).expanduser()
    if not path.is_file():
        raise ValueError(f"data.tokenizer={data_cfg.tokenizer}: no such file; give the path of a "
                         f"tokenizer.json (an imported Hugging Face model's) or leave it empty to train one")
    return TextTokenizer.load(path)


def check_cache(root: Path) -> str | None:
    """What is wrong with the prepared folder ``root``, or ``None`` when every file matches its manifest
    (litdata chunks by size only, see the module docstring)."""
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
    try:
        expected = _expected_files(root, manifest.get("engine", "memory"))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
        return "train/index.json is missing or unreadable"
    if set(files) != expected:
        return f"manifest.json lists {sorted(files)}, expected {sorted(expected)}"
    for name, meta in sorted(files.items()):
        path = root / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != meta["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {meta['bytes']}"
        if not name.startswith("train/chunk-") and _sha256(path) != meta["sha256"]:
            return f"{name} does not match its sha256 in the manifest (corrupt file)"
    return None


def _expected_files(root: Path, engine: str) -> set[str]:
    """The files a folder of ``engine`` holds; a litdata train split's chunks are those its index lists."""
    packed = ("val", "test") if engine == "litdata" else SPLITS
    files = {"tokenizer.json", *(f"{s}{ext}" for s in packed for ext in (".bin", ".json"))}
    if engine == "litdata":
        chunks = json.loads((root / "train" / "index.json").read_text())["chunks"]
        files |= {"train/index.json", *(f"train/{chunk['filename']}" for chunk in chunks)}
    return files


def _build_streamed(corpus: UserCorpus, data_cfg: DataConfig, root: Path) -> None:
    """A first pass lists every document's ``Record`` (in ``data.num_workers`` processes), then ``_build``."""
    start = time.perf_counter()
    records = corpus.records(default_workers(data_cfg.num_workers))
    log.info("listed %d documents of %s in %.1f s", len(records), data_cfg.corpus,
             time.perf_counter() - start)
    _build(split_documents(records, data_cfg.val_fraction, data_cfg.test_fraction, data_cfg.split_seed),
           data_cfg, root, streamed=True)


def _build(splits: dict[str, list], data_cfg: DataConfig, root: Path, streamed: bool) -> None:
    """Write the whole folder under a temporary name, then rename it to ``root``. ``splits`` hold
    ``Document``s, or a user's corpus's ``Record``s (``streamed``), whose texts are read when needed."""
    texts: Callable[[list], Iterable[str]] = read_texts if streamed else _document_texts
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}-"))
    try:
        if data_cfg.tokenizer:
            tokenizer = given_tokenizer(data_cfg)
        else:
            start = time.perf_counter()
            tokenizer = TextTokenizer.train(texts(splits["train"]), data_cfg.vocab_size)
            log.info("trained a %d-id tokenizer on %d train documents in %.1f s", tokenizer.vocab_size,
                     len(splits["train"]), time.perf_counter() - start)
        tokenizer.save(tmp / "tokenizer.json")
        dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32)
        stats = {split: _write_chunks(items, streamed, tmp, dtype, data_cfg)
                 if split == "train" and data_cfg.engine == "litdata" else
                 _write_split(tokenizer, items, texts, tmp, split, dtype) for split, items in splits.items()}
        manifest = {
            "format": FORMAT_VERSION, "key": root.name, "corpus": data_cfg.corpus,
            "vocab_size": tokenizer.vocab_size, "vocab_size_requested": data_cfg.vocab_size,
            "dtype": dtype.name, "tokenizer_fingerprint": tokenizer.fingerprint,
            "split": {"seed": data_cfg.split_seed, "val_fraction": data_cfg.val_fraction,
                      "test_fraction": data_cfg.test_fraction},
            "splits": stats,
            "sources": {name: {"origin": s.origin, "license": s.license}
                        for name, s in corpus_sources(data_cfg.corpus).items()},
            # settings at their defaults add no entry: a memory build's manifest is as it always was
            **({"tokenizer_file": str(Path(data_cfg.tokenizer).expanduser().resolve())} if data_cfg.tokenizer
               else {}),
            **({"engine": data_cfg.engine} if data_cfg.engine != "memory" else {}),
            "files": {p.relative_to(tmp).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
                      for p in sorted(tmp.rglob("*")) if p.is_file()},
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
        _publish(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("prepared data written to %s", root)


def _document_texts(docs: list[Document]) -> Iterable[str]:
    return (d.text for d in docs)


def _write_split(tokenizer: TextTokenizer, items: list, texts: Callable[[list], Iterable[str]], folder: Path,
                 split: str, dtype: np.dtype) -> dict[str, int]:
    """Tokenize ``items`` (``Document``s or ``Record``s, whose ``texts`` are read a batch at a time) into
    ``<split>.bin`` + ``<split>.json``; return document/char/token counts."""
    names, offsets, lengths = [], [], []
    total_chars = sum(d.chars for d in items)
    start, position, stream = time.perf_counter(), 0, iter(texts(items))
    with (folder / f"{split}.bin").open("wb") as out, \
            tqdm(total=total_chars, unit="char", unit_scale=True, desc=f"tokenize {split}") as bar:
        for batch in _batches(items, CHARS_PER_BATCH):
            encoded = tokenizer.encode_batch(list(itertools.islice(stream, len(batch))))
            for doc, ids in zip(batch, encoded, strict=True):
                packed = pack(tokenizer, ids, dtype)
                out.write(packed.tobytes())
                names.append(doc.name)
                offsets.append(position)
                lengths.append(len(packed))
                position += len(packed)
            bar.update(sum(d.chars for d in batch))
    (folder / f"{split}.json").write_text(json.dumps({"names": names, "offsets": offsets, "lengths": lengths}))
    log.info("tokenized %s: %d documents, %d chars -> %d tokens in %.1f s", split, len(items), total_chars,
             position, time.perf_counter() - start)
    return {"documents": len(items), "chars": total_chars, "tokens": position}


def _write_chunks(items: list, streamed: bool, folder: Path, dtype: np.dtype,
                  data_cfg: DataConfig) -> dict[str, int]:
    """Tokenize the train split's ``items`` into litdata chunks under ``folder/train`` in ``data.num_workers``
    processes; each task is a batch of records (read by the worker) or of a built-in corpus's texts."""
    start, chars = time.perf_counter(), sum(d.chars for d in items)
    tasks = [(str(folder / "tokenizer.json"), dtype.name, batch if streamed else [d.text for d in batch])
             for batch in _batches(items, CHARS_PER_BATCH)]
    tokens = write_token_chunks(tasks, folder / "train", default_workers(data_cfg.num_workers))
    log.info("tokenized train into litdata chunks: %d documents, %d chars -> %d tokens in %.1f s", len(items),
             chars, tokens, time.perf_counter() - start)
    return {"documents": len(items), "chars": chars, "tokens": tokens}


def _batches(items: list, max_chars: int) -> list[list]:
    """Consecutive groups of documents with at most ``max_chars`` characters (or one longer document)."""
    batches: list[list] = [[]]
    size = 0
    for doc in items:
        if batches[-1] and size + doc.chars > max_chars:
            batches.append([])
            size = 0
        batches[-1].append(doc)
        size += doc.chars
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
