"""The forms of ``data.corpus`` a user's corpus comes in (``data/streaming.py``): a .jsonl or .parquet file, a
folder of .txt/.jsonl/.parquet files and a ``datasets`` save_to_disk folder, all written here, small."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nope_lightning.config import DataConfig
from nope_lightning.data import TextTokenizer, load_documents
from nope_lightning.data import streaming as streaming_module
from nope_lightning.data.corpus import corpus_label
from nope_lightning.data.streaming import UserCorpus, read_texts
from nope_lightning.eval.perplexity import split_documents_of

WORDS = "the pass key grass river ünïcödé 日本 code proof lemma book chapter verse".split()
#: 23 records (more than 9, so names sort as text, not by number: 1, 10, 11, ..., 19, 2, 20, ...); record 8 is
#: blank and is no document in any form.
TEXTS = [" \n" if i == 7 else f"Record {i + 1}. " + " ".join(WORDS[(i * j) % len(WORDS)]
                                                               for j in range(5 + i)) for i in range(23)]
KEPT = [t for t in TEXTS if t.strip()]


def write_jsonl(path: Path, texts: list[str]) -> Path:
    lines = (json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts))
    path.write_text("".join(lines), encoding="utf-8")
    return path


def write_parquet(path: Path, texts: list[str]) -> Path:
    # row groups of 5 rows: a re-read crosses row groups
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), path, row_group_size=5)
    return path


def write_dataset(path: Path, texts: list[str]) -> Path:
    datasets.Dataset.from_dict({"text": texts, "id": list(range(len(texts)))}).save_to_disk(str(path))
    return path


@pytest.fixture
def forms(tmp_path) -> dict[str, Path]:
    """The same 23 texts as a .jsonl file, a .parquet file and a save_to_disk folder."""
    return {"jsonl": write_jsonl(tmp_path / "pg.jsonl", TEXTS),
            "parquet": write_parquet(tmp_path / "pg.parquet", TEXTS),
            "dataset": write_dataset(tmp_path / "pg_dataset", TEXTS)}


def by_name_order(texts: list[str]) -> list[str]:
    """``texts`` (records 1..n) in the order of their names, the row numbers sorted as text."""
    return [texts[int(n) - 1] for n in sorted(str(i + 1) for i, t in enumerate(texts) if t.strip())]


def test_each_form_gives_the_same_documents_named_by_file_and_row(forms, tmp_path):
    got = {form: load_documents(str(path), tmp_path) for form, path in forms.items()}
    rows = ["1", "10", "11", "12"]
    assert [d.name for d in got["jsonl"][:4]] == [f"pg.jsonl:{r}" for r in rows]
    assert [d.name for d in got["parquet"][:4]] == [f"pg.parquet:{r}" for r in rows]
    assert [d.name for d in got["dataset"][:4]] == rows
    assert "pg.jsonl:8" not in {d.name for d in got["jsonl"]}  # the blank record
    for docs in got.values():
        assert [d.text for d in docs] == by_name_order(TEXTS) and len(docs) == 22


def test_a_dataset_dict_takes_every_split_as_split_slash_row(tmp_path):
    splits = {"train": ["a b", "c d", "e"], "test": ["f g"]}
    folder = {split: datasets.Dataset.from_dict({"text": texts}) for split, texts in splits.items()}
    datasets.DatasetDict(folder).save_to_disk(str(tmp_path / "dd"))
    docs = load_documents(str(tmp_path / "dd"), tmp_path)
    assert [(d.name, d.text) for d in docs] == [("test/1", "f g"), ("train/1", "a b"), ("train/2", "c d"),
                                                ("train/3", "e")]


def test_a_folder_mixes_txt_jsonl_and_parquet(tmp_path):
    (tmp_path / "c" / "deep").mkdir(parents=True)
    (tmp_path / "c" / "a.txt").write_text("alpha\r\n", encoding="utf-8")
    write_jsonl(tmp_path / "c" / "deep" / "b.jsonl", ["beta", "gamma"])
    write_parquet(tmp_path / "c" / "deep" / "d.parquet", ["delta"])
    (tmp_path / "c" / "notes.md").write_text("ignored")
    docs = load_documents(str(tmp_path / "c"), tmp_path)
    assert [(d.name, d.text) for d in docs] == [("a.txt", "alpha\n"), ("deep/b.jsonl:1", "beta"),
                                                ("deep/b.jsonl:2", "gamma"), ("deep/d.parquet:1", "delta")]


def test_a_record_without_text_names_the_file_and_its_fields(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text", "id": 2}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a JSON object with a 'text' field; it has "
                                         r"\['body', 'id'\]"):
        load_documents(str(tmp_path / "bad.jsonl"), tmp_path)
    pq.write_table(pa.table({"content": ["x"], "id": [1]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad.parquet: expected a 'text' field in every record; it has "
                                         r"\['content', 'id'\]"):
        load_documents(str(tmp_path / "bad.parquet"), tmp_path)
    datasets.Dataset.from_dict({"body": ["x"]}).save_to_disk(str(tmp_path / "bad_ds"))
    with pytest.raises(ValueError, match=r"bad_ds: expected a 'text' field in every record; it has "
                                         r"\['body'\]"):
        load_documents(str(tmp_path / "bad_ds"), tmp_path)
    pq.write_table(pa.table({"text": ["fine", None]}), tmp_path / "null.parquet")
    with pytest.raises(ValueError, match=r"null.parquet: row 2: 'text' must be a string, got NoneType"):
        load_documents(str(tmp_path / "null.parquet"), tmp_path)


def test_a_corpus_file_must_be_jsonl_or_parquet(tmp_path):
    (tmp_path / "book.txt").write_text("one document")
    with pytest.raises(ValueError, match=r"a corpus file is .jsonl or .parquet; put .txt files .* in a "
                                         r"folder"):
        load_documents(str(tmp_path / "book.txt"), tmp_path)


def test_a_file_has_a_short_stable_label(forms, tmp_path):
    label = corpus_label(str(forms["jsonl"]))
    assert label.startswith("pg.jsonl-") and len(label) == len("pg.jsonl-") + 6
    (tmp_path / "elsewhere").mkdir()
    other = write_jsonl(tmp_path / "elsewhere" / "pg.jsonl", TEXTS)
    assert corpus_label(str(other)) != label and corpus_label(str(forms["jsonl"])) == label


@pytest.mark.parametrize("form", ["jsonl", "parquet", "dataset"])
def test_records_read_back_their_texts_in_any_order(forms, form, monkeypatch):
    monkeypatch.setattr(streaming_module, "DATASET_BLOCK", 4)  # several dataset blocks for 23 rows
    records = UserCorpus(str(forms[form])).records()
    assert [r.name for r in records] == [d.name for d in load_documents(str(forms[form]), forms[form].parent)]
    assert list(read_texts(records)) == by_name_order(TEXTS)
    assert [r.chars for r in records] == [len(t) for t in by_name_order(TEXTS)]
    assert list(read_texts(records[::-1])) == by_name_order(TEXTS)[::-1]


def test_the_evaluation_reads_the_same_documents_from_every_form(forms, tmp_path):
    tokenizer = TextTokenizer.train(KEPT, 300)
    for split in ("val", "test"):  # the model's own corpus: split as its data config splits it
        own = {form: split_documents_of(model_on(path, tmp_path), str(path), tokenizer, split)
               for form, path in forms.items()}
        assert len(own["jsonl"]) == 2
        assert_same(own)
    held_out = {form: split_documents_of(model_on("tiny", tmp_path), str(path), tokenizer, "test")
                for form, path in forms.items()}  # an evaluation corpus: used whole for test
    assert [text for text, _ in held_out["jsonl"]] == by_name_order(TEXTS)
    assert_same(held_out)


def model_on(corpus: str | Path, cache: Path) -> SimpleNamespace:
    """What ``split_documents_of`` reads of a loaded model: its data config."""
    return SimpleNamespace(config=SimpleNamespace(data=DataConfig(corpus=str(corpus), cache_dir=str(cache))))


def assert_same(per_form: dict[str, list]) -> None:
    first = [(text, ids.tolist()) for text, ids in per_form["jsonl"]]
    for docs in per_form.values():
        assert [(text, ids.tolist()) for text, ids in docs] == first
