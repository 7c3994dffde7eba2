"""``data.tokenizer`` (a given tokenizer.json) and ``data.engine=litdata`` (the streaming prepare of a
pretraining corpus) against the memory path, on a small mixed corpus written here."""

from __future__ import annotations

import hashlib
import importlib
import json
import multiprocessing
import shutil
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from nope_lightning.config import DataConfig
from nope_lightning.config.stages import PretrainConfig
from nope_lightning.data import PackedDataModule, PreparedData, TextTokenizer, load_documents, prepare
from nope_lightning.data import streaming as streaming_module
from nope_lightning.data.datamodule import StreamedBlocks
from nope_lightning.data.prepare import cache_key, check_cache
from nope_lightning.data.retrieval import RetrievalMix
from nope_lightning.pipeline.steps import identity

# the module, not the function data/__init__.py exports under its name
prepare_module = importlib.import_module("nope_lightning.data.prepare")
SEQ_LEN, BATCH = 16, 4
WORDS = ("in the beginning was the word and the word was with god rivers run to the sea yet the sea is "
         "not full def lemma proof qed import return").split()


def text(seed: int, words: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=words)) + "\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """About 90 documents: three .txt books, 40 .jsonl lines (one blank) and 45 .parquet rows."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "books").mkdir()
    for i in range(3):
        (root / "books" / f"book{i}.txt").write_text(text(i, 3000))
    lines = [json.dumps({"text": text(100 + i, 40 + 7 * i)}) if i != 5 else "" for i in range(40)]
    (root / "web.jsonl").write_text("\n".join(lines) + "\n")
    pq.write_table(pa.table({"text": [text(200 + i, 60 + 5 * i) for i in range(45)]}), root / "rows.parquet",
                   row_group_size=8)
    return root


@pytest.fixture(scope="module")
def tokenizer_file(corpus) -> Path:
    """A tokenizer made by ``TextTokenizer.train``, saved: what ``data.tokenizer`` names."""
    path = corpus.parent / "tokenizer.json"
    TextTokenizer.train([d.text for d in load_documents(str(corpus), corpus)], 400).save(path)
    return path


@pytest.fixture(scope="module")
def both(corpus, tokenizer_file, tmp_path_factory) -> tuple[PreparedData, PreparedData]:
    """The corpus prepared by the memory path and by litdata (tasks of 20,000 characters for 2 workers, chunks
    of 2,000 tokens, files listed by a process pool), with the same tokenizer file and split."""
    cache = tmp_path_factory.mktemp("cache")
    settings = {"corpus": str(corpus), "tokenizer": str(tokenizer_file), "cache_dir": str(cache)}
    memory = prepare(DataConfig(**settings))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(streaming_module, "CHUNK_BYTES", 4000)
        patch.setattr(prepare_module, "CHARS_PER_BATCH", 20_000)
        patch.setattr(streaming_module, "SCAN_POOL_BYTES", 0)
        streamed = prepare(DataConfig(**settings, engine="litdata", num_workers=2))
    return memory, streamed


def train_stream(prepared: PreparedData) -> np.ndarray:
    """Every token of a litdata train split, in order, read through ``StreamingDataset`` a token at a time."""
    blocks = StreamedBlocks(prepared.root / "train", 1)
    return np.concatenate([blocks[i] for i in range(len(blocks))])


def module(prepared: PreparedData, seed: int = 0, step: int = 0, mix: RetrievalMix | None = None):
    dm = PackedDataModule(prepared, SEQ_LEN, BATCH, seed, val_batches=2, mix=mix)
    dm.trainer = SimpleNamespace(global_step=step, accumulate_grad_batches=1, global_rank=0, world_size=1)
    return dm


def take(loader, n: int) -> list[torch.Tensor]:
    it = iter(loader)
    return [next(it) for _ in range(n)]


# ------------------------------------------------------------------------------------------ data.tokenizer


def test_default_settings_keep_every_cache_key():
    docs = load_documents("tiny", Path("unused"))
    # the tiny corpus's key at vocab 512 before data.tokenizer and data.engine existed
    assert cache_key(docs, DataConfig(corpus="tiny", vocab_size=512)) == "7ca6005a213f4534"
    data = identity(PretrainConfig())["data"]
    assert "tokenizer" not in data and "engine" not in data  # step hashes hold too


def test_a_given_tokenizer_is_used_instead_of_training(both, corpus, tokenizer_file):
    memory, _ = both
    given = TextTokenizer.load(tokenizer_file)
    assert memory.tokenizer.fingerprint == given.fingerprint
    assert memory.manifest["vocab_size"] == given.vocab_size < 400  # as many ids as this small corpus gives
    assert memory.manifest["tokenizer_file"] == str(tokenizer_file.resolve())
    docs = load_documents(str(corpus), corpus)
    keyed = [cache_key(docs, DataConfig(corpus=str(corpus), tokenizer=str(tokenizer_file), vocab_size=v))
             for v in (300, 4096)]
    assert keyed[0] == keyed[1] == memory.key  # the file fixes the vocabulary: vocab_size is unused
    assert cache_key(docs, DataConfig(corpus=str(corpus), vocab_size=400)) != memory.key
    other = tokenizer_file.with_name("other.json")
    TextTokenizer.train([d.text for d in docs[:5]], 300).save(other)
    assert cache_key(docs, DataConfig(corpus=str(corpus), tokenizer=str(other))) != memory.key


def test_config_errors_name_the_fix(corpus, tmp_path):
    with pytest.raises(ValueError, match=r"data.tokenizer=.*missing.json: no such file; give the path of a "
                                         r"tokenizer.json"):
        prepare(DataConfig(corpus=str(corpus), tokenizer=str(tmp_path / "missing.json"),
                           cache_dir=str(tmp_path)))
    with pytest.raises(ValueError, match=r"data.engine='spark' is not a valid choice; pick one of memory, "
                                         r"litdata"):
        DataConfig(engine="spark")


# ------------------------------------------------------------------------------------------- data.engine


def test_litdata_writes_the_memory_paths_token_stream_per_split(both):
    memory, streamed = both
    assert streamed.key != memory.key and streamed.manifest["engine"] == "litdata"
    assert streamed.manifest["splits"] == memory.manifest["splits"]
    assert streamed.manifest["splits"]["train"]["documents"] > 60
    np.testing.assert_array_equal(train_stream(streamed), memory.tokens("train"))
    for split in ("val", "test"):
        np.testing.assert_array_equal(streamed.tokens(split), memory.tokens(split))
        assert streamed.index(split) == memory.index(split)
    assert streamed.num_tokens("train") == memory.num_tokens("train")


def test_the_train_chunks_come_from_both_workers_and_the_manifest_checks_them(both, tmp_path):
    _, streamed = both
    index = json.loads((streamed.root / "train" / "index.json").read_text())
    chunks = [c["filename"] for c in index["chunks"]]
    assert len(chunks) > 4 and {c.split("-")[1] for c in chunks} == {"0", "1"}
    assert chunks == sorted(chunks, key=lambda c: tuple(int(n) for n in c[6:-4].split("-")))  # worker, then n
    assert {f"train/{c}" for c in chunks} < set(streamed.manifest["files"])
    assert check_cache(streamed.root) is None
    copy = tmp_path / streamed.key
    shutil.copytree(streamed.root, copy)
    chunk = copy / "train" / chunks[1]
    chunk.write_bytes(chunk.read_bytes()[:-2])
    assert f"train/{chunks[1]} has" in check_cache(copy)
    (copy / "train" / "index.json").unlink()
    assert check_cache(copy) == "train/index.json is missing or unreadable"


def test_a_second_prepare_is_a_cache_hit(both, corpus, tokenizer_file):
    _, streamed = both
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = prepare(DataConfig(corpus=str(corpus), tokenizer=str(tokenizer_file), engine="litdata",
                                   cache_dir=str(streamed.root.parent.parent)))
    assert time.perf_counter() - start < 3.0 and again.root == streamed.root


def test_the_streamed_train_split_is_read_only_through_litdata(both):
    _, streamed = both
    with pytest.raises(ValueError, match=r"litdata chunks \(data.engine=litdata\): read it through "
                                         r"datamodule.StreamedBlocks, or prepare with data.engine=memory"):
        streamed.tokens("train")


def test_streaming_datamodule_batches_are_windows_of_the_stream(both):
    memory, streamed = both
    batches = take(module(streamed, seed=3).train_dataloader(), 3)
    stream = torch.from_numpy(memory.tokens("train").astype(np.int64))
    windows = stream.unfold(0, SEQ_LEN + 1, 1)
    for batch in batches:
        assert batch.shape == (BATCH, SEQ_LEN + 1) and batch.dtype == torch.int64
        assert all(bool((windows == row).all(dim=1).any()) for row in batch)
    assert not torch.equal(batches[0], batches[1])
    for again, batch in zip(take(module(streamed, seed=3).train_dataloader(), 3), batches, strict=True):
        assert torch.equal(again, batch)
    assert torch.equal(take(module(streamed, seed=3, step=2).train_dataloader(), 1)[0], batches[2])  # resumed
    assert not torch.equal(take(module(streamed, seed=4).train_dataloader(), 1)[0], batches[0])
    val = [torch.cat(list(module(p).val_dataloader())) for p in both]
    assert torch.equal(val[0], val[1]) and val[1].shape == (2 * BATCH, SEQ_LEN + 1)


def test_a_retrieval_mix_needs_the_memory_engine(both):
    _, streamed = both
    with pytest.raises(ValueError, match="retrieval mixing draws corpus filler from the whole train stream: "
                                         "prepare with data.engine=memory"):
        module(streamed, mix=RetrievalMix(streamed.tokenizer, 0.5, 512))


def test_a_built_in_corpus_streams_its_train_split_too(tmp_path):
    """``tiny`` keeps its in-memory loader; its train split (tokenizer trained as the memory path trains it)
    still goes through litdata's workers."""
    memory = prepare(DataConfig(corpus="tiny", vocab_size=512, cache_dir=str(tmp_path)))
    start_method = multiprocessing.get_start_method(allow_none=True)
    streamed = prepare(DataConfig(corpus="tiny", vocab_size=512, cache_dir=str(tmp_path), engine="litdata",
                                  num_workers=1))
    assert multiprocessing.get_start_method(allow_none=True) == start_method  # litdata's global setting undone
    assert streamed.tokenizer.fingerprint == memory.tokenizer.fingerprint
    np.testing.assert_array_equal(train_stream(streamed), memory.tokens("train"))
    for split in ("val", "test"):
        assert hashlib.sha256(streamed.tokens(split).tobytes()).digest() == \
            hashlib.sha256(memory.tokens(split).tobytes()).digest()
