"""The retrieval mix of pre-training: passkey sequences in corpus filler, mixed into training batches."""

from __future__ import annotations

import numpy as np
import pytest

from nope_lightning.config import DataConfig, PretrainConfig, load_config
from nope_lightning.data import prepare
from nope_lightning.data.datamodule import sample_batch
from nope_lightning.data.passkey import QUESTION, PasskeyPromptBuilder
from nope_lightning.data.retrieval import MIN_HAYSTACK, RetrievalMix

SEQ = 128


@pytest.fixture(scope="module")
def prepared(data_cache):
    return prepare(DataConfig(corpus="tiny", vocab_size=512, cache_dir=data_cache))


def test_a_retrieval_sequence_hides_its_key_in_corpus_text_and_ends_with_the_answer(prepared):
    tok, tokens = prepared.tokenizer, np.asarray(prepared.tokens("train"))
    mix = RetrievalMix(tok, 0.5, SEQ, "compact", filler="corpus")
    rng = np.random.default_rng(0)
    builder = PasskeyPromptBuilder(tok, [tok.bos_id], "compact")
    depths = []
    for _ in range(50):
        ids, answer_start, key = mix.sequence(tokens, rng)
        assert ids.shape == (SEQ + 1,) and ids.dtype == np.int64
        key_ids = [*builder.key_ids(key), *tok.encode(".")]
        assert ids[answer_start:].tolist() == key_ids and answer_start >= 1  # the answer: last targets
        text = tok.decode(ids.tolist())
        assert text.count(key) == 3  # twice in the info line, once as the answer
        assert text.endswith(f"{QUESTION} {key}.")
        info = text.index(f"The pass key is {key}.")
        question = text.index(QUESTION)
        prompt_start = int(np.flatnonzero(ids == tok.bos_id)[-1])
        prompt = tok.decode(ids[prompt_start + 1:answer_start].tolist())
        hay = len(prompt) - len(f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n{QUESTION}")
        assert hay >= 0 and info < question
        depths.append(prompt.index("\nThe pass key is") / max(hay, 1))
        # the haystack before the info line is a contiguous span of the training split
        info_at = next(j for j in range(prompt_start, answer_start)
                       if ids[j:j + len(builder.info_before)].tolist() == builder.info_before)
        prefix = ids[prompt_start + 1:info_at]
        if len(prefix):
            starts = np.flatnonzero(tokens[:len(tokens) - len(prefix) + 1] == prefix[0])
            assert any((tokens[s:s + len(prefix)] == prefix).all() for s in starts)
    assert min(depths) < 0.2 and max(depths) > 0.8  # keys at every depth


def test_reference_and_mixed_fillers(prepared):
    tok, tokens = prepared.tokenizer, np.asarray(prepared.tokens("train"))
    builder = PasskeyPromptBuilder(tok, [tok.bos_id], "compact")
    reference = RetrievalMix(tok, 0.5, SEQ, "compact", filler="reference")
    rng = np.random.default_rng(1)
    for _ in range(20):
        ids, answer_start, key = reference.sequence(tokens, rng)
        prompt_start = int(np.flatnonzero(ids == tok.bos_id)[-1])
        prompt = ids[prompt_start:answer_start].tolist()
        # exactly the evaluation's prompt of that length, for the depth the sequence was built with
        assert any(builder.build(key, d / 100, len(prompt)).input_ids == prompt for d in range(101))
    mixed = RetrievalMix(tok, 0.5, SEQ, "compact", filler="mixed")
    grass = tok.decode(builder.first_sentence)
    kinds = [grass in tok.decode(mixed.sequence(tokens, rng)[0].tolist()) for _ in range(200)]
    assert 0.4 < np.mean(kinds) < 0.6
    with pytest.raises(ValueError, match="retrieval.filler='web'"):
        RetrievalMix(tok, 0.5, SEQ, "compact", filler="web")


def test_full_length_prompts_fill_the_window_and_spread_the_key_over_it(prepared):
    tok, tokens = prepared.tokenizer, np.asarray(prepared.tokens("train"))
    uniform = RetrievalMix(tok, 0.5, SEQ, "compact", filler="corpus")
    full = RetrievalMix(tok, 0.5, SEQ, "compact", filler="corpus", length="full")
    info = PasskeyPromptBuilder(tok, [tok.bos_id], "compact").info_before

    def distances(mix, seed):
        """Tokens from the info line's start to the answer, and where the prompt's BOS sits."""
        rng, out = np.random.default_rng(seed), []
        for _ in range(300):
            ids, answer_start, _ = mix.sequence(tokens, rng)
            bos = int(np.flatnonzero(ids == tok.bos_id)[-1])
            at = next(j for j in range(bos, answer_start) if ids[j:j + len(info)].tolist() == info)
            out.append((answer_start - at, bos))
        return np.asarray(out)

    full_d, uniform_d = distances(full, 0), distances(uniform, 0)
    assert (full_d[:, 1] == 0).all()  # no corpus lead-in: the prompt starts the window
    assert (uniform_d[:, 1] > 0).mean() > 0.9
    # key-to-answer distance uniform over its range (fixed prompt parts + 0..all of the haystack): the far
    # quarter holds ~1/4 of full prompts, and is several times rarer with uniform lengths (where the haystack
    # length and the depth are both uniform)
    lo, hi = full_d[:, 0].min(), full_d[:, 0].max()
    far = lo + 0.75 * (hi - lo)
    assert 0.15 < (full_d[:, 0] > far).mean() < 0.35
    assert (uniform_d[:, 0] > far).mean() < 0.5 * (full_d[:, 0] > far).mean()
    with pytest.raises(ValueError, match="retrieval.length='half'"):
        RetrievalMix(tok, 0.5, SEQ, length="half")


def test_the_fraction_is_honoured_and_other_windows_are_unchanged(prepared):
    tokens = np.asarray(prepared.tokens("train"))
    tok = prepared.tokenizer
    question = tok.encode(QUESTION)

    def is_retrieval(row) -> bool:
        row = row.tolist()
        return any(row[i:i + len(question)] == question for i in range(len(row) - len(question) + 1))

    for fraction, batch in ((0.25, 8), (0.1, 16), (0.5, 4)):
        mix = RetrievalMix(tok, fraction, SEQ)
        replaced = 0
        for step in range(200):
            plain = sample_batch(tokens, step, SEQ, batch, seed=3, rank=0)
            mixed = sample_batch(tokens, step, SEQ, batch, seed=3, rank=0, mix=mix)
            flags = [is_retrieval(r) for r in mixed]
            assert not any(is_retrieval(r) for r in plain)
            for row, flag in enumerate(flags):
                if not flag:
                    assert (mixed[row] == plain[row]).all()
            if fraction * batch == int(fraction * batch):
                assert sum(flags) == int(fraction * batch)  # an integer share is exact in every batch
            replaced += sum(flags)
        assert replaced / (200 * batch) == pytest.approx(fraction, abs=0.03)
    again = sample_batch(tokens, 7, SEQ, 8, seed=3, rank=0, mix=RetrievalMix(tok, 0.25, SEQ))
    assert (again == sample_batch(tokens, 7, SEQ, 8, seed=3, rank=0, mix=RetrievalMix(tok, 0.25, SEQ))).all()


def test_bad_retrieval_settings_are_one_line_errors(prepared):
    tok = prepared.tokenizer
    with pytest.raises(ValueError, match=r"must be in \[0, 1\)"):
        RetrievalMix(tok, 1.0, SEQ)
    shortest = PasskeyPromptBuilder(tok, [tok.bos_id], "reference").min_length() + MIN_HAYSTACK
    with pytest.raises(ValueError, match="cannot hold a retrieval sequence"):
        RetrievalMix(tok, 0.1, shortest - 1, "reference")
    for bad in ("retrieval.fraction=1.0", "retrieval.fraction=-0.1"):
        with pytest.raises(ValueError, match="retrieval.fraction=.* is out of range"):
            load_config(PretrainConfig, None, [bad])
    with pytest.raises(ValueError, match="retrieval.prompt='long' is not a valid choice"):
        load_config(PretrainConfig, None, ["retrieval.prompt=long"])
