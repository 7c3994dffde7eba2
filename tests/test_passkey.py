"""Passkey prompts: exact token length, key at the requested depth, reference text; scoring and aggregation."""

import random
import re

import pytest

from nope_lightning.data.passkey import DEFAULT_DEPTHS, FILLER, QUESTION, TASK_LINE, make_passkey_samples
from nope_lightning.eval.passkey import passkey_accuracy, score_passkey
from tests.helpers import WORDS, HFTokenizer, WhitespaceTokenizer


def random_text(rng: random.Random, sentences: int) -> str:
    return " ".join(" ".join(rng.choices(WORDS, k=rng.randint(5, 12))).capitalize() + "."
                    for _ in range(sentences))


@pytest.fixture(scope="module")
def bpe() -> HFTokenizer:
    rng = random.Random(0)
    texts = [random_text(rng, 50) for _ in range(40)] + [TASK_LINE, FILLER * 20, QUESTION, "0123456789 " * 50]
    return HFTokenizer(texts)


def test_default_depths_are_ten_tenths():
    assert DEFAULT_DEPTHS == pytest.approx([i / 10 for i in range(10)])


@pytest.mark.parametrize("length", [160, 257, 512, 1000])
def test_bpe_prompt_has_exact_length_reference_text_and_key_at_depth(bpe, length):
    samples = make_passkey_samples(bpe, [length], [*DEFAULT_DEPTHS, 1.0], keys_per_cell=2, seed=length)
    assert len(samples) == 22
    for sample in samples:
        assert len(sample.input_ids) == sample.length == length
        assert re.fullmatch(r"[1-9]\d{4}", sample.key)
        key_ids = bpe.encode(" " + sample.key)
        assert bpe.decode(sample.input_ids[sample.key_token_start:][:len(key_ids)]) == " " + sample.key

        text = bpe.decode(sample.input_ids)
        info = f"The pass key is {sample.key}. Remember it. {sample.key} is the pass key."
        task, prefix, info_line, suffix, question = text.split("\n")
        assert (task, info_line, question) == (TASK_LINE, info, QUESTION)
        # The haystack is the reference filler: "The grass is green. The sky ..." from its start, both sides.
        filler = " ".join([FILLER.strip()] * 100)
        assert filler.startswith(prefix) and filler.startswith(suffix)
        assert prefix == "" or prefix.endswith(".")  # the info line follows a whole sentence

        # Depth in haystack tokens, counted by re-encoding the decoded prefix; the haystack size is what is
        # left of the length once the fixed pieces are counted the same way.
        fixed = len(bpe.encode(TASK_LINE + "\n")) + len(bpe.encode("\n" + info + "\n")) + len(
            bpe.encode("\n" + QUESTION))
        haystack = length - fixed
        before = len(bpe.encode(prefix))
        longest_sentence = max(len(bpe.encode(s)) for s in re.findall(r" [^.]+\.", FILLER))
        assert abs(before - sample.depth * haystack) <= longest_sentence


def test_whitespace_tokenizer_exact_length_and_depth():
    tok = WhitespaceTokenizer()
    for length in (80, 150, 401):
        for sample in make_passkey_samples(tok, [length], DEFAULT_DEPTHS, keys_per_cell=1, seed=1):
            assert len(sample.input_ids) == length
            words = tok.decode(sample.input_ids).split()
            assert words[sample.key_token_start] == sample.key
            before = sample.key_token_start - len(TASK_LINE.split()) - len("The pass key is".split())
            # The info line is encoded in pieces around the key, so "{key}." is two words here.
            info = ["The", "pass", "key", "is", sample.key, *f". Remember it. {sample.key} is the pass key.".split()]
            haystack = length - len(TASK_LINE.split()) - len(info) - len(QUESTION.split())
            assert words[sample.key_token_start + 1:][:len(info) - 5] == info[5:]
            assert abs(before - sample.depth * haystack) <= 4  # filler sentences are 3-4 words


def test_prefix_ids_count_towards_the_length(bpe):
    (sample,) = make_passkey_samples(bpe, [300], [0.5], keys_per_cell=1, prefix_ids=[7])
    assert sample.input_ids[0] == 7 and len(sample.input_ids) == 300
    assert bpe.decode(sample.input_ids[1:]).startswith(TASK_LINE)


def test_samples_are_deterministic_by_seed(bpe):
    first = make_passkey_samples(bpe, [200, 300], [0.0, 0.5], keys_per_cell=3, seed=5)
    again = make_passkey_samples(bpe, [200, 300], [0.0, 0.5], keys_per_cell=3, seed=5)
    other = make_passkey_samples(bpe, [200, 300], [0.0, 0.5], keys_per_cell=3, seed=6)
    assert first == again
    assert [s.key for s in first] != [s.key for s in other]
    assert [(s.length, s.depth) for s in first[:6]] == [(200, 0.0)] * 3 + [(200, 0.5)] * 3


def test_bad_arguments_raise(bpe):
    with pytest.raises(ValueError, match="too short"):
        make_passkey_samples(bpe, [20], [0.5], keys_per_cell=1)
    with pytest.raises(ValueError, match="depth"):
        make_passkey_samples(bpe, [300], [1.5], keys_per_cell=1)
    with pytest.raises(ValueError, match="keys_per_cell"):
        make_passkey_samples(bpe, [300], [0.5], keys_per_cell=0)


@pytest.mark.parametrize("text, ok", [
    (" 48213.", True),
    ("48213", True),
    (" is 48213, remember", True),
    ("\n48213 is the pass key", True),
    (" 4821", False),
    (" 482130", False),
    (" 1234 and 48213", False),  # only the first integer counts
    (" the pass key", False),
    ("", False),
])
def test_score_passkey(text, ok):
    assert score_passkey(text, "48213") is ok


def test_passkey_accuracy_per_cell_length_and_metric_names(bpe):
    samples = make_passkey_samples(bpe, [200, 300], [0.0, 0.5], keys_per_cell=2, seed=0)
    correct = [True, True, True, False, False, False, True, False]
    acc = passkey_accuracy(samples, correct)
    assert acc.by_cell == {(200, 0.0): 1.0, (200, 0.5): 0.5, (300, 0.0): 0.0, (300, 0.5): 0.5}
    assert acc.by_length == {200: 0.75, 300: 0.25}
    assert acc.overall == 0.5
    metrics = acc.metrics()
    assert metrics["passkey/len200/acc"] == 0.75
    assert metrics["passkey/len300/depth50/acc"] == 0.5
    assert len(metrics) == 6
    with pytest.raises(ValueError, match="one result per sample"):
        passkey_accuracy(samples, correct[:-1])


def test_passkey_is_scored_by_an_exact_match_of_the_key_tokens():
    from nope_lightning.eval.passkey import score_passkey_tokens

    key = [5, 1, 2, 3, 4, 6]
    assert score_passkey_tokens([5, 1, 2, 3, 4, 6], key)
    assert score_passkey_tokens([5, 1, 2, 3, 4, 6, 9, 9], key)  # what follows the key is not judged
    assert not score_passkey_tokens([5, 1, 2, 3, 4], key)  # cut short
    assert not score_passkey_tokens([1, 2, 3, 4, 6, 9], key)  # no leading space token
    assert not score_passkey_tokens([5, 1, 2, 3, 4, 7], key)


def test_each_outcome_records_its_answer_s_token_count_and_the_header_places_the_answer(bpe):
    from types import SimpleNamespace

    import torch

    from nope_lightning.analysis.lengthgen.tables import answer_label, key_tokens
    from nope_lightning.config import EvaluateConfig, ModelConfig
    from nope_lightning.eval.passkey import run_passkey
    from nope_lightning.model import GPT
    from nope_lightning.results import EvaluationResult, PasskeyResults

    train_len = 160  # the prompts are exactly L tokens: the "1x" prompt
    samples = make_passkey_samples(bpe, [train_len], [0.0, 0.5], keys_per_cell=2, seed=3)
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, intermediate_size=32, max_positions=256), 500,
                train_len=train_len).eval()
    tokenizer = SimpleNamespace(encode=bpe.encode, vocab_size=500)  # what run_passkey reads of a tokenizer
    section, _ = run_passkey(model, tokenizer, samples, EvaluateConfig(checkpoint="x", max_new_tokens=8,
                                                                       batch_size=4))
    # By hand: the key's tokens in the prompt, from key_token_start up to where the decoded text is " " + key.
    by_hand = [next(k for k in range(1, 12) if bpe.decode(s.input_ids[s.key_token_start:][:k]) == f" {s.key}")
               for s in samples]
    assert [o.key_tokens for o in section.samples] == by_hand == [6, 6, 6, 6]
    result = EvaluationResult(train_len, ["kjv"], passkey=section)
    # Generated after 160 prompt tokens, the 6 answer tokens sit at positions 161-166: past L.
    assert answer_label(train_len, train_len, key_tokens([result], train_len)) == "160 (answer at 161-166: past L)"
    assert PasskeyResults.parse(section.body()) == section
    legacy = {k: v for k, v in section.body().items() if k != "key_tokens"}  # a file from before the counts
    assert [o.key_tokens for o in PasskeyResults.parse(legacy).samples] == [None] * 4


def test_the_key_nll_is_the_teacher_forced_loss_of_the_answer_tokens_one_at_a_time(bpe):
    from types import SimpleNamespace

    import torch

    from nope_lightning.config import EvaluateConfig, ModelConfig
    from nope_lightning.eval.passkey import answer_ids, run_passkey
    from nope_lightning.model import GPT
    from nope_lightning.results import PasskeyResults

    samples = make_passkey_samples(bpe, [150, 170], [0.0, 0.5], keys_per_cell=2, seed=5)
    torch.manual_seed(1)
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=16, intermediate_size=32, max_positions=256), 500,
                train_len=160).eval()
    tokenizer = SimpleNamespace(encode=bpe.encode, vocab_size=480)  # fewer than the model's rows: they compete
    section, metrics = run_passkey(model, tokenizer, samples, EvaluateConfig(checkpoint="x", batch_size=3))
    # Reference: one unpadded forward per answer token, the next-token distribution over the first 480 ids.
    for sample, outcome in zip(samples, section.samples, strict=True):
        answer, losses = answer_ids(bpe, sample.key), []
        for j, token in enumerate(answer):
            ids = torch.tensor([list(sample.input_ids) + answer[:j]])
            with torch.no_grad():
                logits = model(ids)[0, -1, :480].double()
            losses.append(float(torch.logsumexp(logits, 0) - logits[token]))
        assert outcome.key_nll == pytest.approx(sum(losses) / len(losses), rel=1e-4)
    means = section.key_nll_by_length()
    assert metrics["passkey/len150/key_nll"] == pytest.approx(
        sum(o.key_nll for o in section.at(150)) / 4) == pytest.approx(means[150])
    assert PasskeyResults.parse(section.body()) == section
    legacy = {k: v for k, v in section.body().items() if k != "key_nll"}  # a file from before the NLL
    assert PasskeyResults.parse(legacy).key_nll_by_length() == {}
