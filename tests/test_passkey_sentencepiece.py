"""Passkey and long-context prompts with a Llama-style SentencePiece tokenizer (Metaspace or Llama 1/2's
``Prepend("▁")`` normalizer, byte fallback) built here, nothing downloaded: separately encoded pieces must
read as in running text (``TextTokenizer.encode_continuation``), so a prompt's ids are the whole text's; the
suite's own byte-level BPE prompts are those of plain ``encode``."""

from __future__ import annotations

import io
import json
from itertools import cycle, islice

import pytest
import sentencepiece
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from nope_lightning.data import TextTokenizer, load_documents
from nope_lightning.data.passkey import (
    FILLER,
    FILLER_SENTENCES,
    INFO_LINE,
    QUESTION,
    TASK_LINE,
    PasskeyPromptBuilder,
    make_passkey_samples,
)
from nope_lightning.eval.longctx import TASKS
from nope_lightning.eval.passkey import answer_ids
from tests.test_hf_tokenizer import LLAMA_CONFIG, imported

KEY = "40719"


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> list[str]:
    return [d.text for d in load_documents("tiny", tmp_path_factory.mktemp("corpus"))]


@pytest.fixture(scope="module")
def sp_model(documents) -> bytes:
    """A SentencePiece BPE trained as tests/test_hf_tokenizer.py trains Llama's (byte fallback, split digits,
    no normalization), on 20 KB of the tiny corpus plus the prompt's own lines, so its words get pieces."""
    prompt_lines = [TASK_LINE, FILLER.strip(), INFO_LINE.format(key=KEY), QUESTION] * 20
    lines = "\n".join(documents)[:20_000].splitlines() + prompt_lines
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="bpe", vocab_size=400,
        byte_fallback=True, split_digits=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, character_coverage=1.0, unk_id=0,
        bos_id=1, eos_id=2, pad_id=-1, num_threads=1, minloglevel=2)
    return model.getvalue()


@pytest.fixture(scope="module")
def sp_tokenizers(tmp_path_factory, sp_model) -> dict[str, TextTokenizer]:
    """The model as imported from a Llama folder (transformers' Metaspace ``prepend_scheme="first"``), and as
    the tokenizer.json Llama 2 and TinyLlama ship (``Prepend("▁")`` + ``Replace`` normalizer)."""
    folder = tmp_path_factory.mktemp("sp_folder")
    (folder / "tokenizer.model").write_bytes(sp_model)
    (folder / "tokenizer_config.json").write_text(json.dumps(LLAMA_CONFIG))
    metaspace = imported(folder, tmp_path_factory.mktemp("import") / "out")
    legacy = Tokenizer.from_str(metaspace.to_json())
    legacy.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    legacy.pre_tokenizer = None
    return {"metaspace": metaspace, "legacy": TextTokenizer(legacy)}


@pytest.fixture(scope="module")
def bpe(documents) -> TextTokenizer:
    """The suite's own byte-level BPE."""
    return TextTokenizer.train([*documents, TASK_LINE, FILLER * 20, QUESTION], 600)


class EncodeOnly:
    """A tokenizer behind ``encode`` alone: how the prompt builders encoded every piece before
    ``encode_continuation``."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.encode = tokenizer.encode


def haystack(sentences: int) -> str:
    """The first ``sentences`` filler sentences as the reference writes them (no leading space)."""
    return "".join(islice(cycle(FILLER_SENTENCES), sentences)).lstrip()


@pytest.mark.parametrize("kind", ["metaspace", "legacy"])
def test_continuation_pieces_concatenate_to_the_whole_text(sp_tokenizers, sp_model, kind):
    tok = sp_tokenizers[kind]
    sp = sentencepiece.SentencePieceProcessor(model_proto=sp_model)
    newline = tok.encode_continuation("\n")
    assert tok.encode("\n") == sp.encode("\n") == [sp.piece_to_id("▁"), *newline]  # "▁" marks the start only
    pieces = ["There is an info.", "\n", "The pass key is", f" {KEY}", ". Remember it.", "\n\n", " The grass",
              "\n", "What is it?"]
    ids = [*tok.encode(pieces[0]), *(i for piece in pieces[1:] for i in tok.encode_continuation(piece))]
    assert ids == tok.encode("".join(pieces)) == sp.encode("".join(pieces))
    assert tok.encode_continuation("") == []


def test_byte_level_continuation_is_encode(bpe):
    for text in ["\n", " 12345", "The pass key is", "  two spaces", "Ünïcödé — 東京", ""]:
        assert bpe.encode_continuation(text) == bpe.encode(text), text


def metaspace_bpe(merges: list[tuple[str, str]]) -> TextTokenizer:
    """A hand-made SentencePiece-style BPE (Metaspace, no split) over ``▁ \\n . | T e`` with ``merges``."""
    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", "▁", "\n", ".", "|", "T", "e"])}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    tokenizer.add_special_tokens(["<s>", "</s>"])
    return TextTokenizer(tokenizer)


def test_continuation_falls_back_to_a_context_that_does_not_merge():
    # "\n" + "T" merges, so the newline cannot stand before "Te"; "." does not merge.
    tok = metaspace_bpe([("\n", "T"), ("T", "e")])
    assert tok.encode("\nTe") == tok.encode("\n")[:1] + [tok.encode("\nT")[-1], tok.encode("e")[-1]]
    assert tok.encode_continuation("Te") == tok.encode(".Te")[len(tok.encode(".")):] == [tok.encode("Te")[-1]]
    merging = metaspace_bpe([("\n", "T"), (".", "T"), ("|", "T")])
    with pytest.raises(ValueError, match=r"cannot be encoded apart from the text before it: encode the"):
        merging.encode_continuation("Te")


@pytest.mark.parametrize("kind", ["metaspace", "legacy"])
@pytest.mark.parametrize(("prompt", "prefix_ids"), [("reference", []), ("compact", [1]), ("compact", [])])
def test_sentencepiece_prompt_is_the_encoding_of_its_whole_text(sp_tokenizers, sp_model, kind, prompt,
                                                                prefix_ids):
    """Where the haystack ends on a sentence boundary (found by trying lengths), the prompt's ids are the
    SentencePiece encoding of the reference text; depth 0 of a compact prompt opens it with the info line."""
    tok = sp_tokenizers[kind]
    sp = sentencepiece.SentencePieceProcessor(model_proto=sp_model)
    builder = PasskeyPromptBuilder(tok, prefix_ids, prompt)
    old = PasskeyPromptBuilder(EncodeOnly(tok), prefix_ids, prompt)
    info = INFO_LINE.format(key=KEY)
    checked = {}
    for depth in (0.0, 0.3, 1.0):
        for length in range(builder.min_length(KEY), builder.min_length(KEY) + 100):
            sample = builder.build(KEY, depth, length)
            assert len(sample.input_ids) == sample.length == length

            start, end = sample.key_token_start, sample.key_token_start + len(builder.key_ids(KEY))
            assert sample.input_ids[start:end] == answer_ids(tok, KEY)  # what the scorer expects back
            assert tok.decode(sample.input_ids[:start]).endswith("The pass key is")
            assert tok.decode(sample.input_ids[:end]) == tok.decode(sample.input_ids[:start]) + " " + KEY

            lines = tok.decode(sample.input_ids[len(prefix_ids):]).split("\n")
            before, after = lines[-4], lines[-2]  # the haystack around the info line
            if after and not after.endswith("."):
                continue  # the suffix's last sentence is cut (maybe to its "▁"): not the whole text's tokens
            task = [TASK_LINE] if prompt == "reference" else []
            text = "\n".join([*task, haystack(before.count(".")), info, haystack(after.count(".")), QUESTION])
            assert sample.input_ids == [*prefix_ids, *tok.encode(text)] == [*prefix_ids, *sp.encode(text)]
            checked.setdefault(depth, []).append(length)
            if length == builder.min_length(KEY):
                assert text.endswith(f"{info}\n\n{QUESTION}")
    assert all(len(checked.get(depth, [])) >= 5 for depth in (0.0, 0.3, 1.0)), checked
    # Plain encode, piece by piece, gave each piece its own "▁": not the whole text's ids.
    length = checked[0.3][-1]  # the longest, which the old pieces' extra tokens also fit
    assert old.build(KEY, 0.3, length).input_ids != builder.build(KEY, 0.3, length).input_ids


@pytest.mark.parametrize("prompt", ["reference", "compact"])
def test_byte_level_prompts_are_those_of_plain_encode(bpe, prompt):
    lengths, depths = [160, 197, 256, 513, 1000], [0.0, 0.1, 0.5, 0.9, 1.0]
    ours = make_passkey_samples(bpe, lengths, depths, keys_per_cell=2, seed=3, prefix_ids=[bpe.bos_id],
                                prompt=prompt)
    plain = make_passkey_samples(EncodeOnly(bpe), lengths, depths, keys_per_cell=2, seed=3,
                                 prefix_ids=[bpe.bos_id], prompt=prompt)
    assert [(s.input_ids, s.key_token_start) for s in ours] == [(s.input_ids, s.key_token_start)
                                                                for s in plain]


@pytest.mark.parametrize("task", sorted(TASKS))
def test_long_context_prompts_hold_no_start_marks_and_byte_level_ones_are_unchanged(sp_tokenizers, bpe,
                                                                                   documents, task):
    """A piece's own start mark decodes as a space the text lacks: before a newline ("▁" + "<0x0A>") or
    doubled (Llama 1/2's "▁▁The"); the haystack's whitespace is collapsed, so the prompts have neither.
    Byte-level prompts are plain encode's."""
    for kind, tok in sp_tokenizers.items():
        for sample in TASKS[task](tok, documents, 2000, num_samples=3, seed=1):
            text = tok.decode(sample.prompt_ids)
            assert len(sample.prompt_ids) <= 2000 and "\n" in text
            assert "  " not in text and " \n" not in text, (kind, text)
    ours = TASKS[task](bpe, documents, 2000, num_samples=3, seed=1)
    assert ours == TASKS[task](EncodeOnly(bpe), documents, 2000, num_samples=3, seed=1)
