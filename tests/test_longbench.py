"""LongBench metrics on hand-computed examples (through the official packages), the protocol of a run on a
scripted model, the JSONL loader, and the synthetic long-context tasks."""

import json
import random
import re
import string

import pytest
import torch
from torch import nn

from nope_lightning import cli
from nope_lightning.eval.longbench import (
    LongBenchConfig,
    check_longbench,
    load_longbench,
    longbench_max_length,
    run_longbench,
    truncate_middle,
)
from nope_lightning.eval.longbench_metrics import (
    DATASET_TO_METRIC,
    classification_score,
    code_sim_score,
    count_score,
    normalize_answer,
    qa_f1_score,
    qa_f1_zh_score,
    retrieval_score,
    retrieval_zh_score,
    rouge_score,
    rouge_zh_score,
    scorer,
    scorer_e,
)
from nope_lightning.eval.longctx import (
    multikey_retrieval,
    passage_count,
    passage_retrieval,
    split_paragraphs,
    string_match_all,
    variable_tracking,
)
from tests.conftest import REPO
from tests.helpers import WORDS, HFTokenizer, WhitespaceTokenizer

LONGBENCH_DATA = REPO / "tests/data/longbench"

# ---- LongBench metrics -----------------------------------------------------------------------------------

def test_normalize_answer_and_qa_f1():
    assert normalize_answer("  The Cat, sat on a MAT! ") == "cat sat on mat"
    # "cat sat on mat" vs "cat on mat": 3 common tokens, P = 3/4, R = 1, F1 = 6/7.
    assert qa_f1_score("The cat sat on the mat.", "a cat on mat") == pytest.approx(6 / 7)
    # Multiset overlap: "paris paris" vs "paris": P = 1/2, R = 1.
    assert qa_f1_score("Paris, Paris", "Paris") == pytest.approx(2 / 3)
    assert qa_f1_score("nothing here", "Paris") == 0.0
    assert qa_f1_score("", "Paris") == 0.0


def test_rouge_l_single_sentence_counts_distinct_words():
    # LCS "the cat on the mat" has 4 distinct words; both texts have 5 distinct words: P = R = F = 4/5.
    # (The textbook token LCS F1 would be 5/6: the rouge package works on sets of words.)
    assert rouge_score("the cat sat on the mat", "the cat is on the mat") == pytest.approx(0.8, abs=1e-7)
    assert rouge_score("a b c", "a b c") == pytest.approx(1.0, abs=1e-7)
    assert rouge_score("Cat", "cat") == 0.0  # case-sensitive, no normalisation


def test_rouge_l_summary_level_union_lcs():
    # Sentences split at ".": ref [the dog ran], [cat sat]; prediction [the cat sat], [a dog ran].
    # Union of LCS words over pairs: {the} + {dog, ran} + {cat, sat} = 5 words. Distinct words: ref 5, pred 6.
    # R = 1, P = 5/6, F = 2PR / (P + R) = 10/11.
    assert rouge_score("the cat sat. a dog ran", "the dog ran. cat sat") == pytest.approx(10 / 11, abs=1e-7)


def test_rouge_l_empty_texts_score_zero():
    assert rouge_score("", "a summary") == 0.0
    assert rouge_score("...", "a summary") == 0.0
    assert rouge_score("a summary", "") == 0.0


def test_chinese_metrics_use_jieba_words():
    # jieba: 北京/是/中国/的/首都 and 首都/是/北京/。 ("。" normalised away): 3 common words, P = 1, R = 3/5.
    assert qa_f1_zh_score("首都是北京。", "北京是中国的首都") == pytest.approx(0.75)
    # ROUGE-L on those words: the longest common subsequence is one word; P = 1/4, R = 1/5, F = 2/9.
    assert rouge_zh_score("首都是北京。", "北京是中国的首都") == pytest.approx(2 / 9, abs=1e-7)
    assert retrieval_zh_score("段落3 和 段落 3 还有 4", "段落3") == pytest.approx(2 / 3)


def test_classification_score():
    classes = ["Location", "Other location", "Entity", "Description"]
    assert classification_score("Other location", "Other location", all_classes=classes) == 1.0
    assert classification_score("Location or Entity", "Location", all_classes=classes) == 0.5
    # LongBench removes substrings of the gold class while iterating, which skips the next one: of A, AB, B
    # found in "ABC", A is removed, AB skipped, B removed, so AB still competes: 1/2, not 1.
    assert classification_score("ABC", "ABC", all_classes=["A", "AB", "B", "ABC"]) == 0.5
    assert classification_score("Description", "Entity", all_classes=classes) == 0.0
    assert classification_score("nothing", "Entity", all_classes=classes) == 0.0


def test_count_and_retrieval_scores():
    assert count_score("There are 5 paragraphs, 5 unique ones", "5") == 1.0
    assert count_score("3 or 5", "5") == 0.5
    assert count_score("15", "5") == 0.0
    assert count_score("no idea", "5") == 0.0
    assert retrieval_score("Paragraph 12", "Paragraph 12") == 1.0
    assert retrieval_score(" 12.", "Paragraph 12") == 1.0
    assert retrieval_score("Paragraph 1 or Paragraph 12", "Paragraph 12") == 0.5
    with pytest.raises(ValueError, match="does not match"):
        retrieval_score("12", "twelve")


def test_code_sim_score_uses_first_line_without_fences_or_comments():
    # "x = foo(1)" vs "x = foo(2)": SequenceMatcher matches 9 of 10 characters on each side, ratio 0.9.
    prediction = "\n```python\n# the next line\ny = a // b\nx = foo(1)\nz = 3"
    assert code_sim_score(prediction, "x = foo(2)") == 0.9
    assert code_sim_score("x = foo(2)", "x = foo(2)") == 1.0
    assert code_sim_score("# only a comment", "x = 1") == 0.0
    assert code_sim_score("abcd", "abce") == 0.75


def test_scorer_max_over_answers_first_line_and_rounding():
    # qa: max over gold answers; second prediction F1 = 2/3 against "Paris".
    assert scorer("hotpotqa", ["Paris", "Paris, Paris"], [["London", "Paris"], ["Paris"]]) == pytest.approx(83.33)
    # trec: only the first line of the prediction counts.
    classes = ["Location", "Entity"]
    assert scorer("trec", ["\nLocation\nEntity", "Entity"], [["Location"], ["Location"]], classes) == 50.0
    assert scorer("passage_count", ["7", "the count is 7 or 8"], [["7"], ["7"]]) == 75.0
    with pytest.raises(ValueError, match="unknown LongBench dataset"):
        scorer("nope_task", ["a"], [["a"]])
    with pytest.raises(ValueError, match="one answer list per prediction"):
        scorer("hotpotqa", ["a", "b"], [["a"]])


def test_all_21_tasks_and_longbench_e_buckets():
    assert len(DATASET_TO_METRIC) == 21 and DATASET_TO_METRIC["vcsum"] is rouge_zh_score
    # Buckets by the sample's length: < 4000, < 8000, the rest; qa F1 per sample 1, 0 | 1 | 0.
    got = scorer_e("hotpotqa_e", ["Paris", "x", "Paris", "x"], [["Paris"]] * 4, [100, 3999, 4000, 8000])
    assert got == {"0-4k": 50.0, "4-8k": 100.0, "8k+": 0.0}
    assert scorer_e("hotpotqa_e", ["Paris"], [["Paris"]], [10]) == {"0-4k": 100.0}


def test_truncate_middle():
    ids = list(range(10))
    assert truncate_middle(ids, 4) == [0, 1, 8, 9]
    assert truncate_middle(ids, 5) == [0, 1, 7, 8, 9]
    assert truncate_middle(ids, 10) == ids
    assert truncate_middle(ids, 1) == [9]


# ---- loader ----------------------------------------------------------------------------------------------

def record(**overrides):
    base = {"input": "Who?", "context": "Long text.", "answers": ["Me"], "length": 2, "all_classes": None,
            "dataset": "hotpotqa", "language": "en", "_id": "abc"}
    return {**base, **overrides}


def write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_load_longbench(tmp_path):
    path = write_jsonl(tmp_path / "hotpotqa.jsonl", [record(), record(_id="def", answers=["A", "B"])])
    samples = load_longbench(path)
    assert [s.id for s in samples] == ["abc", "def"]
    assert samples[1].answers == ["A", "B"] and samples[0].all_classes is None
    assert samples[0].prompt("{context}\nQuestion: {input}\nAnswer:") == "Long text.\nQuestion: Who?\nAnswer:"


def test_load_longbench_names_file_line_and_missing_field(tmp_path):
    bad = record()
    del bad["answers"]
    path = write_jsonl(tmp_path / "qasper.jsonl", [record(), bad])
    with pytest.raises(ValueError, match=r"qasper\.jsonl:2: missing field\(s\) answers"):
        load_longbench(path)
    path = write_jsonl(tmp_path / "broken.jsonl", [record(), "{not json"])
    with pytest.raises(ValueError, match=r"broken\.jsonl:2: not valid JSON"):
        load_longbench(path)
    path = write_jsonl(tmp_path / "types.jsonl", [record(answers="Me")])
    with pytest.raises(ValueError, match=r"types\.jsonl:1: field answers"):
        load_longbench(path)
    with pytest.raises(FileNotFoundError, match=r"absent\.jsonl does not exist: .*data/<task>\.jsonl, and "
                                                 r"data/<task>_e\.jsonl for LongBench-E"):
        load_longbench(tmp_path / "absent.jsonl")
    path = write_jsonl(tmp_path / "mine.jsonl", [record(dataset="my_task")])
    with pytest.raises(ValueError, match=r"mine\.jsonl:1: unknown LongBench task 'my_task'"):
        load_longbench(path)


# ---- a run: LongBench's protocol on a scripted model ----------------------------------------------------

class CharTokenizer:
    """One id per character; 0 = BOS, 1 = EOS (dropped by decode, as ours)."""

    def __init__(self, alphabet: str) -> None:
        self.ids = {ch: i + 2 for i, ch in enumerate(alphabet)}
        self.chars = {i: ch for ch, i in self.ids.items()}
        self.bos_id, self.eos_id, self.vocab_size = 0, 1, len(alphabet) + 2

    def encode(self, text: str) -> list[int]:
        return [self.ids[ch] for ch in text]

    def decode(self, ids) -> str:
        return "".join(self.chars.get(i, "") for i in ids)


class BigramOracle(nn.Module):
    """Predicts the next character from the current one: ":" -> A -> B -> newline -> C -> A; everything
    else -> EOS. Records the length of every forward."""

    def __init__(self, tok: CharTokenizer) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))  # generation reads the device from the parameters
        table = torch.full((tok.vocab_size,), tok.eos_id)
        for a, b in zip(":AB\nC", "AB\nCA", strict=True):
            table[tok.ids[a]] = tok.ids[b]
        self.table, self.vocab, self.lengths = table, tok.vocab_size, []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.lengths.append(ids.size(1))
        return nn.functional.one_hot(self.table[ids], self.vocab).float()


@pytest.fixture
def oracle():
    tok = CharTokenizer(string.printable)
    return BigramOracle(tok), tok


def test_run_follows_templates_budgets_stops_and_truncation(oracle):
    model, tok = oracle
    metrics = run_longbench(model, tok, LONGBENCH_DATA / "sample.jsonl", 64, config_dir=LONGBENCH_DATA / "config")
    # qasper (budget 6, no newline stop): "AB\nCAB" -> words [ab, cab]: F1 2/3 vs "AB", 1 vs "AB CAB".
    # samsum: stops at the newline after "AB" (3 tokens), first line "AB": ROUGE-L 1.
    # A 64-token window is too small for LongBench's rule (window - 500): prompts get the window minus the budget.
    assert metrics == {"longbench/qasper/score": pytest.approx(83.33), "longbench/qasper/max_length": 58,
                       "longbench/samsum/score": 100.0, "longbench/samsum/max_length": 58}
    template = json.loads((LONGBENCH_DATA / "config/dataset2prompt.json").read_text())["qasper"]
    short = 1 + len(template.format(context="zz", input="who?"))  # BOS + prompt
    # One forward per new token: 6 for each qasper sample; the long one cut to 64 - 6 positions; samsum 3.
    samsum = 1 + len("Chat:\nA: hi\nB: yo\nSummary:")
    assert model.lengths == [*range(short, short + 6), *range(58, 64), *range(samsum, samsum + 3)]


def test_beam_search_and_longbench_e(oracle, tmp_path):
    model, tok = oracle
    rows = [json.loads(line) for line in (LONGBENCH_DATA / "sample.jsonl").read_text().splitlines()][:2]
    path = write_jsonl(tmp_path / "qasper_e.jsonl", [{**r, "dataset": "qasper_e"} for r in rows])
    metrics = run_longbench(model, tok, path, 64, config_dir=LONGBENCH_DATA / "config", num_beams=3)
    # A one-hot model leaves beam search the greedy answer; lengths 120 and 5000 fall in two buckets.
    assert metrics == {"longbench/qasper_e/score": pytest.approx(83.33), "longbench/qasper_e/max_length": 58,
                       "longbench/qasper_e/0-4k/score": pytest.approx(66.67),
                       "longbench/qasper_e/4-8k/score": 100.0}


def test_run_rejects_bad_beams_config_and_tasks(oracle, tmp_path):
    model, tok = oracle
    data, config = LONGBENCH_DATA / "sample.jsonl", LONGBENCH_DATA / "config"
    with pytest.raises(ValueError, match="num_beams=0 must be >= 1"):
        run_longbench(model, tok, data, 64, config_dir=config, num_beams=0)
    with pytest.raises(FileNotFoundError, match="dataset2prompt.json does not exist"):
        run_longbench(model, tok, data, 64, config_dir=tmp_path)
    with pytest.raises(ValueError, match="qasper's 6-token answer budget leaves no room for a prompt in this "
                                         "model's window of 7 tokens"):
        run_longbench(model, tok, data, 7, config_dir=config)
    assert model.lengths == []  # nothing generated: every task's budgets are checked first
    path = write_jsonl(tmp_path / "lcc.jsonl", [record(dataset="lcc")])
    with pytest.raises(ValueError, match="LongBench config has no prompt and budget for task 'lcc'"):
        run_longbench(model, tok, path, 64, config_dir=config)
    assert LongBenchConfig.load(config).task("qasper_e") == ("Read:\n{context}\nQ: {input}\nA:", 6)


def test_prompt_budget_is_longbench_rule_cut_to_fit_each_answer(oracle):
    """LongBench's max_length is the window minus 500 (its config/model2maxlen.json); where prompt plus answer would
    not fit the window the prompt is cut further; an explicit max_length is used as given (and recorded)."""
    assert [longbench_max_length(n) for n in (4096, 32768, 1024, 500, 64)] == [3596, 32268, 524, 500, 64]
    model, tok = oracle
    metrics = run_longbench(model, tok, LONGBENCH_DATA / "sample.jsonl", 64, config_dir=LONGBENCH_DATA / "config",
                            max_length=40)
    assert metrics["longbench/qasper/max_length"] == 40 == metrics["longbench/samsum/max_length"]
    # The long qasper prompt (5000-word context) is cut to 40 tokens; its 6 answer tokens follow.
    assert model.lengths[6:12] == list(range(40, 46))


def test_check_longbench_finds_every_input_problem_before_compute(tmp_path):
    """One line each, naming the fix: missing files or config (with LongBench's layouts), a config without a
    task of the file, bad JSON, an empty file; good inputs pass."""
    data, config = LONGBENCH_DATA / "sample.jsonl", LONGBENCH_DATA / "config"
    check_longbench([data], config)
    problems = [
        ([tmp_path / "hotpotqa.jsonl"], config, FileNotFoundError,
         r"hotpotqa\.jsonl does not exist: pass files from LongBench's data archive .* data/<task>\.jsonl, and "
         r"data/<task>_e\.jsonl for LongBench-E"),
        ([data], tmp_path / "none", FileNotFoundError,
         r"longbench_config=.*none: no such folder; LongBench's config folder .* holds dataset2prompt\.json and "
         r"dataset2maxlen\.json"),
        ([data], tmp_path, FileNotFoundError, r"dataset2prompt\.json does not exist"),
        ([write_jsonl(tmp_path / "lcc.jsonl", [record(dataset="lcc")])], config, ValueError,
         r"lcc\.jsonl: LongBench config has no prompt and budget for task 'lcc' \(not in dataset2prompt\.json and "
         r"dataset2maxlen\.json\)"),
        ([write_jsonl(tmp_path / "empty.jsonl", [])], config, ValueError, r"empty\.jsonl holds no samples"),
        ([write_jsonl(tmp_path / "bad.jsonl", ["{oops"])], config, ValueError, r"bad\.jsonl:1: not valid JSON"),
    ]
    for files, folder, error, message in problems:
        with pytest.raises(error, match=message) as info:
            check_longbench(files, folder)
        assert "\n" not in str(info.value)
    broken = tmp_path / "broken_config"
    broken.mkdir()
    (broken / "dataset2prompt.json").write_text((config / "dataset2prompt.json").read_text())
    (broken / "dataset2maxlen.json").write_text('{"qasper": "six"}')
    with pytest.raises(ValueError, match=r"dataset2maxlen\.json: expected a JSON object of task -> int"):
        check_longbench([data], broken)
    (broken / "dataset2maxlen.json").write_text("{")
    with pytest.raises(ValueError, match=r"dataset2maxlen\.json: not valid JSON"):
        check_longbench([data], broken)


def test_evaluate_refuses_a_missing_longbench_file_before_building_a_model(tmp_path, tracking_overrides, capsys):
    """The checkpoint is an empty folder: a model built first would fail on it, so an error naming the LongBench
    file shows that the inputs were checked before any model."""
    code = cli.main(["run", "evaluate", f"checkpoint={tmp_path}", *tracking_overrides,
                     f"longbench_files=[{tmp_path}/hotpotqa.jsonl]", f"longbench_config={LONGBENCH_DATA / 'config'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "hotpotqa.jsonl does not exist" in err and "data/<task>.jsonl" in err and "checkpoint" not in err


# ---- synthetic long-context tasks ------------------------------------------------------------------------

def paragraph(rng: random.Random) -> str:
    return " ".join(" ".join(rng.choices(WORDS, k=rng.randint(6, 12))).capitalize() + "."
                    for _ in range(rng.randint(4, 8)))


@pytest.fixture(scope="module")
def documents() -> list[str]:
    rng = random.Random(0)
    return ["\n\n".join(paragraph(rng) for _ in range(40)) for _ in range(3)]


@pytest.fixture(scope="module")
def bpe(documents) -> HFTokenizer:
    return HFTokenizer([*documents, "Paragraph 0123456789: VAR ABCDEFGHIJKLMNOPQRSTUVWXYZ = 0123456789."])


LENGTHS = (400, 1100)


@pytest.mark.parametrize("length", LENGTHS)
def test_multikey_retrieval_answer_by_construction(bpe, documents, length):
    samples = multikey_retrieval(bpe, documents, length, num_samples=4, num_keys=3, seed=1)
    for sample in samples:
        assert len(sample.prompt_ids) == length
        text = bpe.decode(sample.prompt_ids)
        keys = dict(re.findall(r"The pass key of ([A-Z]{5}) is (\d{5})\. Remember it\.", text))
        assert len(keys) == 3
        (asked,) = re.findall(r"What is the pass key of ([A-Z]{5})\? The pass key of \1 is$", text)
        assert sample.answers == [keys[asked]]
        assert sample.score(f" {keys[asked]}.") == 1.0
        other = next(k for name, k in keys.items() if name != asked)
        assert sample.score(f" {other}.") == 0.0


@pytest.mark.parametrize("length", LENGTHS)
def test_variable_tracking_answer_by_construction(bpe, documents, length):
    samples = variable_tracking(bpe, documents, length, num_samples=4, num_chains=2, num_hops=3, seed=2)
    for sample in samples:
        assert len(sample.prompt_ids) == length
        text = bpe.decode(sample.prompt_ids)
        values: dict[str, str] = {}
        for name, source in re.findall(r"VAR ([A-Z]{5}) = (\d{5}|VAR [A-Z]{5})\.", text):
            # Every variable is assigned after the one it copies, so one left-to-right pass resolves all.
            values[name] = values[source[4:]] if source.startswith("VAR ") else source
        assert len(values) == 8
        (asked,) = re.findall(r"assigned the value (\d{5}) are:$", text)
        assert sorted(sample.answers) == sorted(n for n, v in values.items() if v == asked)
        assert sample.score(" " + ", ".join(sample.answers)) == 1.0
        assert sample.score(" " + sample.answers[0]) == 0.25


@pytest.mark.parametrize("length", LENGTHS)
def test_passage_retrieval_answer_by_construction(bpe, documents, length):
    for sample in passage_retrieval(bpe, documents, length, num_samples=4, seed=3):
        assert len(sample.prompt_ids) <= length
        text = bpe.decode(sample.prompt_ids)
        paragraphs = dict(re.findall(r"Paragraph (\d+): (.*?)\n\n", text))
        assert list(paragraphs) == [str(k) for k in range(1, len(paragraphs) + 1)]
        (sentence,) = re.findall(r"\nSentence: (.*)\nThe sentence comes from Paragraph$", text)
        sources = [k for k, p in paragraphs.items() if sentence in p]
        assert len(paragraphs) >= 2 and sample.answers == [f"Paragraph {k}" for k in sources]
        assert sample.score(f" {sources[0]}") == 1.0 and sample.metric == "retrieval_score"


@pytest.mark.parametrize("length", LENGTHS)
def test_passage_count_answer_by_construction(bpe, documents, length):
    samples = passage_count(bpe, documents, length, num_samples=4, seed=4)
    for sample in samples:
        assert len(sample.prompt_ids) <= length
        text = bpe.decode(sample.prompt_ids)
        paragraphs = re.findall(r"Paragraph \d+: (.*?)\n\n", text)
        assert sample.answers == [str(len(set(paragraphs)))]
        assert sample.score(f" {len(set(paragraphs))}") == 1.0
    assert any(len(set(p)) < len(p) for p in (re.findall(r"Paragraph \d+: (.*?)\n\n", bpe.decode(s.prompt_ids))
                                              for s in samples))  # duplicates do occur


def test_tasks_fit_lengths_with_whitespace_tokenizer(documents):
    tok = WhitespaceTokenizer()
    for length in (300, 777):
        for task in (multikey_retrieval, variable_tracking):
            assert all(len(s.prompt_ids) == length for s in task(tok, documents, length, 3, seed=5))
        for task in (passage_retrieval, passage_count):
            assert all(length - 120 < len(s.prompt_ids) <= length for s in task(tok, documents, length, 3, seed=5))


def test_tasks_are_deterministic_by_seed(bpe, documents):
    for task in (multikey_retrieval, variable_tracking, passage_retrieval, passage_count):
        first, again = task(bpe, documents, 500, 2, seed=7), task(bpe, documents, 500, 2, seed=7)
        assert first == again
        assert first != task(bpe, documents, 500, 2, seed=8)


def test_tasks_reject_too_short_lengths(bpe, documents):
    for task in (multikey_retrieval, variable_tracking, passage_retrieval, passage_count):
        with pytest.raises(ValueError, match="too short|do not fit"):
            task(bpe, documents, 30, 1)


def test_split_paragraphs_dedupes_and_cuts_long_blocks():
    doc = "one two three four\n\none two three four\n\n" + " ".join(["w"] * 10)
    assert split_paragraphs([doc], min_words=3, max_words=4) == ["one two three four", "w w w w"]


def test_string_match_all():
    assert string_match_all("abcde and FGHIJ", ["ABCDE", "FGHIJ", "KLMNO"]) == pytest.approx(2 / 3)
