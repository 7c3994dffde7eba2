"""A user's corpus, read lazily record by record, and the litdata engine that tokenizes it in processes.

The forms of ``data.corpus`` that are a user's files (``UserCorpus``):

* a folder: its ``.txt`` files (one document each, named by relative path), ``.jsonl`` files (one document
  per line, ``<relative path>:<line number>``) and ``.parquet`` files (one document per row,
  ``<relative path>:<row number>``), read recursively;
* a single ``.jsonl`` or ``.parquet`` file (names as above, the path being the file's name);
* a Hugging Face ``datasets`` ``save_to_disk`` folder (it holds ``state.json`` / ``dataset_info.json``): one
  document per row, ``<row number>``; a ``DatasetDict`` folder (``dataset_dict.json``) takes every split, its
  documents named ``<split>/<row number>``.

Text is each record's ``text`` field (PG19 and proof-pile use it). Row numbers count from 1, as line numbers
do, so the same texts as .jsonl lines, .parquet rows or dataset rows get names in the same order, hence the
same split and the same evaluation documents. Parquet is read with pyarrow, in place and a batch at a time:
``datasets`` would first convert the files into an Arrow copy in its cache (the corpus once more on disk).
A ``save_to_disk`` folder is read with ``datasets.load_from_disk``, which reads the local folder only.

Every record is found by a ``Record`` (its file and the line's byte offset or the row), so a build reads the
texts again in any order without holding them: ``write_token_chunks`` hands groups of records to litdata's
``optimize``, whose worker processes each read, tokenize and write their share as token chunks.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import multiprocessing
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from litdata import TokensLoader, optimize

from nope_lightning.data.tokenizer import TextTokenizer

SUFFIXES = (".txt", ".jsonl", ".parquet")
#: Rows of a dataset read at once, and the row blocks (parquet row groups) a reader keeps: names sort as text,
#: so a run of consecutive names visits at most one contiguous run of rows per digit count (1, 10-19, 100-199,
#: ...) and a dozen blocks cover files of up to 10^12 rows.
DATASET_BLOCK, BLOCKS_KEPT = 1024, 12
#: Bytes of tokens per litdata chunk; a training window never spans two chunks.
CHUNK_BYTES = "64MB"
#: Corpus bytes from which the first pass scans files in worker processes: each takes seconds to start (it
#: imports the package), about as long as one process takes to scan 256 MB of JSON lines.
SCAN_POOL_BYTES = 256 * 2**20


@dataclass(frozen=True)
class CorpusFile:
    """One file of a user's corpus: ``kind`` (``txt``, ``jsonl``, ``parquet`` or ``dataset``, a save_to_disk
    folder or split), its ``path`` and ``rel``, the prefix of its documents' names."""

    kind: str
    path: str
    rel: str


@dataclass(frozen=True)
class Record:
    """Where one non-blank document lies: ``file``, ``index`` (a .jsonl line's byte offset, a .parquet or
    dataset row from 0; 0 for a .txt file) and its length ``chars`` in characters."""

    name: str
    file: CorpusFile
    index: int
    chars: int


def decode_text(raw: bytes) -> str:
    """UTF-8 text with Windows line ends made Unix; a few legacy files are Latin-1 (every byte decodes)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return text.replace("\r\n", "\n")


class UserCorpus:
    """The files of a user's ``data.corpus`` (see the module docstring), found at construction, read lazily.

    Raises ``ValueError`` for a path that does not exist (naming the built-in corpora ``known``), a file of
    another kind, or a folder without corpus files.
    """

    def __init__(self, corpus: str, known: tuple[str, ...] = ()):
        self.corpus, path = corpus, Path(corpus).expanduser()
        if path.is_file():
            if path.suffix not in (".jsonl", ".parquet"):
                raise ValueError(f"data.corpus={corpus}: a corpus file is .jsonl or .parquet; put .txt files "
                                 f"(one document each) in a folder and name the folder")
            self.root, self.files = path.parent, [CorpusFile(path.suffix[1:], str(path), path.name)]
        elif not path.is_dir():
            raise ValueError(f"data.corpus={corpus}: no such corpus or folder; known corpora: "
                             f"{', '.join(known)}")
        elif (path / "dataset_dict.json").is_file():
            splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
            self.root, self.files = path, [CorpusFile("dataset", str(path / s), s) for s in splits]
        elif (path / "state.json").is_file() or (path / "dataset_info.json").is_file():
            self.root, self.files = path, [CorpusFile("dataset", str(path), "")]
        else:
            found = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
            if not found:
                raise ValueError(f"data.corpus={corpus}: the folder holds no .txt or .jsonl files (nor "
                                 f".parquet files, nor a datasets save_to_disk folder)")
            self.root = path
            self.files = [CorpusFile(p.suffix[1:], str(p), p.relative_to(path).as_posix()) for p in found]

    def scan(self) -> Iterator[tuple[Record, str]]:
        """Every non-blank document with its text, file by file in file order."""
        for file in self.files:
            yield from _scan(file)

    def records(self, workers: int = 1) -> list[Record]:
        """Every non-blank document's ``Record``, sorted by name, the texts dropped as they are read: memory
        grows with the number of documents, not their size. Files are scanned by ``workers`` processes when
        there are several and they hold ``SCAN_POOL_BYTES`` or more."""
        if workers > 1 and len(self.files) > 1 and self._bytes() >= SCAN_POOL_BYTES:
            spawn = multiprocessing.get_context("spawn")  # as litdata's workers: no inherited threads
            with ProcessPoolExecutor(min(workers, len(self.files)), mp_context=spawn) as pool:
                found = [r for part in pool.map(_file_records, self.files) for r in part]
        else:
            found = [r for file in self.files for r in _file_records(file)]
        if not found:
            raise ValueError(f"data.corpus={self.corpus}: every document is empty")
        return sorted(found, key=lambda r: r.name)

    def fingerprint(self) -> str:
        """sha256 (hex) of every file's relative path, size and modification time: a key that needs no pass
        over the text (hashing 100B tokens of text takes minutes at every start); rewriting a file changes
        it."""
        stats = [(p.relative_to(self.root).as_posix(), st.st_size, st.st_mtime_ns) for p, st in self._stats()]
        return hashlib.sha256(json.dumps(stats).encode()).hexdigest()

    def _bytes(self) -> int:
        return sum(st.st_size for _, st in self._stats())

    def _stats(self) -> list[tuple[Path, os.stat_result]]:
        """Every file of the corpus (a dataset folder's files one by one) with its ``stat``."""
        paths = [p for f in self.files for p in ([Path(f.path)] if Path(f.path).is_file() else
                                                 sorted(q for q in Path(f.path).rglob("*") if q.is_file()))]
        return [(p, p.stat()) for p in paths]


def _file_records(file: CorpusFile) -> list[Record]:
    return [record for record, _ in _scan(file)]


def _scan(file: CorpusFile) -> Iterator[tuple[Record, str]]:
    """The non-blank documents of one file with their texts; a record without a string ``text`` is a
    ``ValueError`` naming the file (and line or row) and the fields the record has."""
    path = Path(file.path)
    if file.kind == "txt":
        text = decode_text(path.read_bytes())
        rows: Iterator[tuple[str, int, str]] = iter([(file.rel, 0, text)])
    elif file.kind == "jsonl":
        rows = _jsonl_rows(path, file.rel)
    else:
        prefix = f"{file.rel}{'/' if file.kind == 'dataset' else ':'}" if file.rel else ""
        rows = ((f"{prefix}{row + 1}", row, _text(value, f"{path}: row {row + 1}"))
                for row, value in enumerate(_column(file)))
    for name, index, text in rows:
        if text.strip():
            yield Record(name, file, index, len(text)), text


def _jsonl_rows(path: Path, rel: str) -> Iterator[tuple[str, int, str]]:
    """``(name, byte offset, text)`` per non-blank line; lines are split at ``\\n`` only (byte offsets)."""
    with path.open("rb") as f:
        offset = 0
        for lineno, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            line = raw.decode("utf-8")
            if line.strip():
                yield f"{rel}:{lineno}", start, _jsonl_text(line, f"{path}:{lineno}")


def _jsonl_text(line: str, where: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        raise ValueError(f"{where}: expected a JSON object with a 'text' field") from None
    if not isinstance(record, dict) or "text" not in record:
        fields = sorted(record) if isinstance(record, dict) else f"a JSON {type(record).__name__}"
        raise ValueError(f"{where}: expected a JSON object with a 'text' field; it has {fields}")
    return _text(record["text"], where)


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: 'text' must be a string, got {type(value).__name__}")
    return value


def _column(file: CorpusFile) -> Iterator[object]:
    """The ``text`` values of a .parquet file or a dataset, row by row, a batch at a time."""
    if file.kind == "parquet":
        parquet = pq.ParquetFile(file.path)
        _check_fields(file.path, parquet.schema_arrow.names)
        for batch in parquet.iter_batches(batch_size=DATASET_BLOCK, columns=["text"]):
            yield from batch.column(0).to_pylist()
    else:
        dataset = _dataset(file.path)
        for start in range(0, len(dataset), DATASET_BLOCK):
            yield from dataset[start:start + DATASET_BLOCK]["text"]


def _check_fields(path: str, fields: list[str]) -> None:
    if "text" not in fields:
        raise ValueError(f"{path}: expected a 'text' field in every record; it has {sorted(fields)}")


def _dataset(path: str):
    """A ``save_to_disk`` folder's ``text`` column as a memory-mapped ``datasets.Dataset``."""
    import datasets  # a second of imports, paid only by this form of corpus

    dataset = datasets.load_from_disk(path)
    if not isinstance(dataset, datasets.Dataset):
        raise ValueError(f"{path}: expected one split of a datasets save_to_disk folder")
    _check_fields(path, dataset.column_names)
    return dataset.select_columns(["text"])


# ---------------------------------------------------------------------------------------------------
# Reading records again


def read_texts(records: Sequence[Record]) -> Iterator[str]:
    """The texts of ``records``, in their order; rows are read a block at a time (see ``BLOCKS_KEPT``)."""
    readers: dict[CorpusFile, _Reader] = {}
    try:
        for record in records:
            if record.file not in readers:
                readers[record.file] = _Reader(record.file)
            yield readers[record.file].text(record.index)
    finally:
        for reader in readers.values():
            reader.close()


class _Reader:
    """Random access to one file's documents: a seek per .jsonl line, a cached block per row."""

    def __init__(self, file: CorpusFile):
        self.file = file
        self._handle = open(file.path, "rb") if file.kind == "jsonl" else None  # closed by close()
        if file.kind == "parquet":
            self._parquet = pq.ParquetFile(file.path)
            meta = self._parquet.metadata
            rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            self._starts = np.cumsum([0, *rows]).tolist()
        elif file.kind == "dataset":
            self._rows = _dataset(file.path)
        self._block = functools.lru_cache(maxsize=BLOCKS_KEPT)(self._read_block)

    def text(self, index: int) -> str:
        if self.file.kind == "txt":
            return decode_text(Path(self.file.path).read_bytes())
        if self._handle is not None:
            self._handle.seek(index)
            return json.loads(self._handle.readline())["text"]
        if self.file.kind == "parquet":
            block = bisect.bisect_right(self._starts, index) - 1
            return self._block(block)[index - self._starts[block]]
        return self._block(index // DATASET_BLOCK)[index % DATASET_BLOCK]

    def _read_block(self, block: int) -> list[str]:
        if self.file.kind == "parquet":
            return self._parquet.read_row_group(block, columns=["text"]).column(0).to_pylist()
        return self._rows[block * DATASET_BLOCK:(block + 1) * DATASET_BLOCK]["text"]

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


# ---------------------------------------------------------------------------------------------------
# The litdata engine

#: What a litdata worker gets: ``(tokenizer.json path, dtype name, records to read or texts)``.
Task = tuple[str, str, list[Record] | list[str]]


def pack(tokenizer: TextTokenizer, ids: list[int], dtype: np.dtype) -> np.ndarray:
    """One document's packed tokens ``<bos> ids... <eos>``, shape ``(len(ids) + 2,)``."""
    packed = np.empty(len(ids) + 2, dtype=dtype)
    packed[0], packed[1:-1], packed[-1] = tokenizer.bos_id, ids, tokenizer.eos_id
    return packed


@functools.cache
def _worker_tokenizer(path: str) -> TextTokenizer:
    # litdata runs a worker per core: tokenizers' own threads inside each would only contend for the cores
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return TextTokenizer.load(path)


def tokenize_task(task: Task) -> Iterator[np.ndarray]:
    """litdata's ``fn``: a ``Task`` -> each document's packed tokens, in order (run in a worker process; the
    tokenizer is loaded once per process)."""
    path, dtype, items = task
    tokenizer = _worker_tokenizer(path)
    texts = list(read_texts(items)) if items and isinstance(items[0], Record) else items
    for ids in tokenizer.encode_batch(texts):
        yield pack(tokenizer, ids, np.dtype(dtype))


def write_token_chunks(tasks: list[Task], out: Path, workers: int) -> int:
    """Tokenize ``tasks`` (see ``tokenize_task``) in ``workers`` processes into litdata token chunks of
    ``CHUNK_BYTES`` under ``out`` (``index.json`` + ``chunk-<worker>-<n>.bin``); return the number of tokens.

    Each worker takes a contiguous run of tasks and processes it in order, and litdata lists the workers'
    chunks in worker order, so the chunks hold the documents in task order: the memory path's stream, cut
    into chunks."""
    previous = multiprocessing.get_start_method(allow_none=True)
    try:
        # spawn, not fork: a forked worker would inherit the threads (tokenizers', a tracker's) of this process
        optimize(fn=tokenize_task, inputs=tasks, output_dir=str(out), num_workers=min(workers, len(tasks)),
                 chunk_bytes=CHUNK_BYTES, item_loader=TokensLoader(), keep_data_ordered=True, reorder_files=False,
                 start_method="spawn", verbose=False)
    finally:  # optimize sets the process-wide start method; DataLoader workers and DDP expect theirs back
        multiprocessing.set_start_method(previous, force=True)
    return sum(chunk["dim"] for chunk in json.loads((out / "index.json").read_text())["chunks"])


def default_workers(num_workers: int) -> int:
    """``data.num_workers``, 0 meaning one per core."""
    return num_workers or os.cpu_count() or 1
