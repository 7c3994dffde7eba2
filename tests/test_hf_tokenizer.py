"""Hugging Face tokenizers through ``TextTokenizer`` and ``hf_tokenizer_json``: a Llama-style SentencePiece BPE
(byte fallback) trained here on the tiny corpus, checked against ``transformers`` and ``sentencepiece``
themselves; the BOS/EOS lookup; the suite's own byte-level BPE unchanged. Nothing is downloaded."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import pytest
import sentencepiece
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from nope_lightning.data import TextTokenizer, load_documents
from nope_lightning.data.tokenizer import hf_special_tokens, hf_tokenizer_json

#: Llama's tokenizer_config.json, reduced to what picks the class and names the special tokens.
LLAMA_CONFIG = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                "legacy": False, "add_bos_token": True, "add_eos_token": False}
TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "two  spaces,\ttab and\nnew lines\n\n",
    "  leading spaces",
    "Ünïcödé — 東京 😀 ﬁ",
    "digits 12345 and 3.14159",
    "a literal <s> and </s> inside text",
    "",
]


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory) -> bytes:
    """A SentencePiece BPE trained like Llama's (byte fallback, split digits, no normalization, ids 0..2 for
    ``<unk>``, ``<s>``, ``</s>``) on 20 KB of the tiny corpus, 400 pieces: the serialized model."""
    docs = load_documents("tiny", tmp_path_factory.mktemp("corpus"))
    text = "\n".join(d.text for d in docs)[:20_000]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(text.splitlines()), model_writer=model, model_type="bpe", vocab_size=400,
        byte_fallback=True, split_digits=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1, minloglevel=2)
    return model.getvalue()


@pytest.fixture(scope="module")
def sp_folder(tmp_path_factory, sp_model) -> Path:
    """A Llama-style folder without tokenizer.json: ``tokenizer.model`` and ``tokenizer_config.json``."""
    folder = tmp_path_factory.mktemp("sp_folder")
    (folder / "tokenizer.model").write_bytes(sp_model)
    (folder / "tokenizer_config.json").write_text(json.dumps(LLAMA_CONFIG))
    return folder


@pytest.fixture(scope="module")
def saved_folder(tmp_path_factory, sp_folder) -> Path:
    """The folder ``save_pretrained`` writes from ``sp_folder``'s fast tokenizer (with its tokenizer.json)."""
    folder = tmp_path_factory.mktemp("saved_folder")
    transformers.AutoTokenizer.from_pretrained(sp_folder, local_files_only=True).save_pretrained(folder)
    return folder


def imported(folder: Path, out: Path) -> TextTokenizer:
    """``folder``'s tokenizer as the import writes it: ``hf_tokenizer_json`` and tokenizer_config.json."""
    out.mkdir()
    (out / "tokenizer.json").write_text(hf_tokenizer_json(folder), encoding="utf-8")
    shutil.copy(folder / "tokenizer_config.json", out)
    return TextTokenizer.load(out / "tokenizer.json")


@pytest.mark.parametrize("folder", ["sp_folder", "saved_folder"], ids=["tokenizer.model", "tokenizer.json"])
def test_hf_folder_encodes_and_decodes_as_transformers(folder, request, tmp_path, sp_model):
    folder = request.getfixturevalue(folder)
    ours = imported(folder, tmp_path / "export")
    hf = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    sp = sentencepiece.SentencePieceProcessor(model_proto=sp_model)
    assert (ours.bos_id, ours.eos_id, ours.vocab_size) == (1, 2, len(hf)) == (1, 2, sp.get_piece_size())
    assert ours.fingerprint == hashlib.sha256((tmp_path / "export/tokenizer.json").read_bytes()).hexdigest()
    for text in TEXTS:
        ids = ours.encode(text)
        # Special tokens inside text stay text (split_special_tokens); elsewhere that flag changes nothing.
        assert ids == hf.encode(text, add_special_tokens=False, split_special_tokens=True), text
        if "<s>" not in text:
            assert ids == hf.encode(text, add_special_tokens=False), text
        assert ours.bos_id not in ids and ours.eos_id not in ids
        framed = [ours.bos_id, *ids, ours.eos_id]
        assert ours.decode(framed) == hf.decode(framed, skip_special_tokens=True)
        # transformers' Metaspace adds no "▁" before text that starts with one (a space), SentencePiece does:
        # a leading space is lost (the legacy tokenizer.json below keeps it); all other text is exact.
        if not text.startswith(" "):
            assert ids == sp.encode(text), text
            assert ours.decode(framed) == text


def test_legacy_tokenizer_json_encodes_as_sentencepiece(saved_folder, sp_model, tmp_path):
    """The tokenizer.json Llama 2 and TinyLlama ship (older transformers' converter: a Prepend("▁") and
    Replace(" ", "▁") normalizer, no pre-tokenizer) encodes as the SentencePiece model, leading spaces too."""
    legacy = Tokenizer.from_file(str(saved_folder / "tokenizer.json"))
    legacy.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    legacy.pre_tokenizer = None
    folder = tmp_path / "legacy"
    folder.mkdir()
    legacy.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(LLAMA_CONFIG))
    ours = imported(folder, tmp_path / "export")
    sp = sentencepiece.SentencePieceProcessor(model_proto=sp_model)
    for text in TEXTS:
        assert ours.encode(text) == sp.encode(text), text
        assert ours.decode(ours.encode(text)) == sp.decode(sp.encode(text)) == text


def test_truncation_and_padding_in_tokenizer_json_are_dropped(saved_folder, tmp_path):
    """A tokenizer.json may store truncation and padding; transformers applies neither unless a call asks, and
    neither does the imported tokenizer."""
    stored = Tokenizer.from_file(str(saved_folder / "tokenizer.json"))
    stored.enable_truncation(4)
    stored.enable_padding(length=64)
    folder = tmp_path / "stored"
    shutil.copytree(saved_folder, folder)
    stored.save(str(folder / "tokenizer.json"))
    ours = imported(folder, tmp_path / "export")
    hf = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert len(ours.encode(TEXTS[0])) > 4
    assert ours.encode(TEXTS[0]) == hf.encode(TEXTS[0], add_special_tokens=False)


def test_folder_without_tokenizer_is_refused(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(LLAMA_CONFIG))
    with pytest.raises(ValueError, match=r"has neither tokenizer\.json nor tokenizer\.model") as error:
        hf_tokenizer_json(tmp_path)
    assert "\n" not in str(error.value)


def special_only(tokens: list[str]) -> Tokenizer:
    """A tokenizer whose vocabulary is ``<unk>`` and the special tokens ``tokens``."""
    tokenizer = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    tokenizer.add_special_tokens(tokens)
    return tokenizer


@pytest.mark.parametrize(("tokens", "config", "expected"), [
    (["<s>", "</s>", "<|bos|>", "<|eos|>"], {"bos_token": "<s>", "eos_token": "</s>"}, ("<|bos|>", "<|eos|>")),
    (["<s>", "</s>", "<bos>", "<eos>"], {"bos_token": {"content": "<bos>"}, "eos_token": "<eos>"},
     ("<bos>", "<eos>")),
    (["<|begin_of_text|>", "<|end_of_text|>", "<s>", "</s>"], {"bos_token": None, "eos_token": "<eos>"},
     ("<s>", "</s>")),
    (["<|begin_of_text|>", "<|end_of_text|>"], None, ("<|begin_of_text|>", "<|end_of_text|>")),
], ids=["own-first", "config-next", "then-llama", "then-llama3"])
def test_bos_eos_lookup_order(tokens, config, expected, tmp_path):
    special_only(tokens).save(str(tmp_path / "tokenizer.json"))
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = TextTokenizer.load(tmp_path / "tokenizer.json")
    assert (tokenizer.bos_id, tokenizer.eos_id) == tuple(tokens.index(t) + 1 for t in expected)


def test_tokenizer_without_bos_eos_is_refused(tmp_path):
    special_only(["<pad>"]).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<go>", "eos_token": "<stop>"}))
    assert hf_special_tokens(tmp_path) == ("<go>", "<stop>")
    with pytest.raises(ValueError) as error:
        TextTokenizer.load(tmp_path / "tokenizer.json")
    assert str(error.value) == (
        "tokenizer has none of the BOS/EOS pairs <|bos|> / <|eos|>, <go> / <stop>, <s> / </s>, "
        "<|begin_of_text|> / <|end_of_text|>: name its pair as bos_token / eos_token in a tokenizer_config.json "
        "beside its tokenizer.json")


def test_own_tokenizer_is_unchanged(tmp_path):
    """``TextTokenizer.train`` still gives the byte-level BPE built here with ``tokenizers`` alone: the same
    tokenizer.json (so fingerprint), ids 0 / 1 for BOS / EOS, and the same ids, special literals as text."""
    texts = [d.text[:5_000] for d in load_documents("tiny", tmp_path)]
    reference = Tokenizer(models.BPE())
    reference.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    reference.decoder = decoders.ByteLevel()
    reference.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=300, min_frequency=2, special_tokens=["<|bos|>", "<|eos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    reference_json = reference.to_str()
    ours = TextTokenizer.train(texts, 300)
    assert ours.fingerprint == hashlib.sha256(reference_json.encode("utf-8")).hexdigest()
    assert (ours.bos_id, ours.eos_id) == (0, 1)
    reference.encode_special_tokens = True
    for text in [*TEXTS, "a literal <|bos|> and <|eos|> are just text"]:
        assert ours.encode(text) == reference.encode(text, add_special_tokens=False).ids, text
    assert 0 not in ours.encode("<|bos|>")
