"""LongBench (Bai et al., 2023) English tasks: a loader for local JSONL files and the benchmark's own metrics.

No LongBench data ships offline; a user who has the files (``{dataset}.jsonl``, one sample per line with
``input, context, answers, length, all_classes, dataset, language, _id``) loads them with
``load_longbench``. The metric functions reproduce LongBench's definitions (its ``metrics.py`` and
``eval.py``), each returning a score in [0, 1] for one prediction against one gold answer; ``scorer`` gives
the task score in 0..100 as LongBench reports it. Decoding in LongBench is greedy with the per-task
``MAX_NEW_TOKENS`` budget, and a prompt longer than the model's window is cut in the middle
(``truncate_middle``).
"""

from __future__ import annotations

import difflib
import json
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REQUIRED_FIELDS = ("input", "context", "answers", "length", "all_classes", "dataset", "language", "_id")
_PUNCTUATION = frozenset(string.punctuation)


@dataclass(frozen=True)
class LongBenchSample:
    """One LongBench sample; ``id`` is the file's ``_id``, ``length`` its word/character count."""

    input: str
    context: str
    answers: list[str]
    length: int
    all_classes: list[str] | None
    dataset: str
    language: str
    id: str

    def prompt(self, template: str) -> str:
        """Fill a LongBench prompt template (with ``{context}`` and ``{input}`` fields) for this sample."""
        return template.format(context=self.context, input=self.input)


def load_longbench(path: str | Path) -> list[LongBenchSample]:
    """Read a LongBench-format JSONL file; raise ``ValueError`` naming file, line and field on bad input."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"LongBench file {path} does not exist")
    samples = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if line.strip():
                samples.append(_parse_sample(line, f"{path}:{line_no}"))
    return samples


def _parse_sample(line: str, where: str) -> LongBenchSample:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not valid JSON ({err})") from err
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [name for name in REQUIRED_FIELDS if name not in record]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    answers, classes = record["answers"], record["all_classes"]
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise ValueError(f"{where}: field answers must be a list of strings")
    if classes is not None and not isinstance(classes, list):
        raise ValueError(f"{where}: field all_classes must be a list of strings or null")
    return LongBenchSample(input=str(record["input"]), context=str(record["context"]), answers=answers,
                           length=int(record["length"]), all_classes=classes, dataset=str(record["dataset"]),
                           language=str(record["language"]), id=str(record["_id"]))


def truncate_middle(ids: Sequence[int], max_len: int) -> list[int]:
    """Keep the first ``max_len // 2`` and the last ``max_len - max_len // 2`` tokens of an over-long prompt.

    LongBench's rule (the question sits at both ends of its prompts). It keeps ``2 * (max_len // 2)``
    tokens; here an odd ``max_len`` keeps one more from the end so the result is exactly ``max_len``.
    """
    if max_len < 1:
        raise ValueError(f"max_len={max_len} must be >= 1")
    if len(ids) <= max_len:
        return list(ids)
    head = max_len // 2
    return [*ids[:head], *ids[len(ids) - (max_len - head):]]


# ---- metrics: one prediction against one gold answer, in [0, 1] ----------------------------------------

def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop ASCII punctuation, drop articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: Sequence[str], gold: Sequence[str]) -> float:
    """Bag-of-tokens F1 (multiset overlap)."""
    same = sum((Counter(prediction) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, **_) -> float:
    """Token F1 between the normalised prediction and answer (narrativeqa, qasper, hotpotqa, ...)."""
    return token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def rouge_score(prediction: str, ground_truth: str, **_) -> float:
    """ROUGE-L F as LongBench gets it from the ``rouge`` package (pltrdy, 1.0.1): summary-level union LCS.

    Texts are split into sentences at every ``"."`` (empty pieces dropped, whitespace collapsed) and into
    words at spaces, case-sensitively. For each reference sentence, the words of the LCS with each
    predicted sentence are collected into one *set*; with u = the size of that set over all reference
    sentences, recall = u / (distinct reference words), precision = u / (distinct predicted words), and
    F = 2PR / (P + R + 1e-8). For one sentence without repeated words this is the textbook LCS F1. An empty
    prediction or reference scores 0 (the package raises; LongBench catches it).
    """
    predicted, reference = _rouge_sentences(prediction), _rouge_sentences(ground_truth)
    if not predicted or not reference:
        return 0.0
    lcs_words: set[str] = set()
    for ref in reference:
        for pred in predicted:
            lcs_words.update(_lcs_words(ref, pred))
    recall = len(lcs_words) / len({w for s in reference for w in s})
    precision = len(lcs_words) / len({w for s in predicted for w in s})
    return 2.0 * precision * recall / (precision + recall + 1e-8)


def _rouge_sentences(text: str) -> list[list[str]]:
    return [" ".join(piece.split()).split(" ") for piece in text.split(".") if piece]


def _lcs_words(x: list[str], y: list[str]) -> list[str]:
    """Words of one longest common subsequence of x and y (ties broken as the ``rouge`` package does)."""
    table = [[0] * (len(y) + 1) for _ in range(len(x) + 1)]
    for i, xi in enumerate(x, 1):
        for j, yj in enumerate(y, 1):
            table[i][j] = table[i - 1][j - 1] + 1 if xi == yj else max(table[i - 1][j], table[i][j - 1])
    words, i, j = [], len(x), len(y)
    while i and j:
        if x[i - 1] == y[j - 1]:
            words.append(x[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return words


def classification_score(prediction: str, ground_truth: str, *, all_classes: Sequence[str] | None, **_) -> float:
    """1/k if the gold class is among the k class names found in the prediction, else 0 (trec).

    Class names that are proper substrings of the gold class are not counted as found, so "Other" does not
    compete with a gold "Other entity" that the prediction contains. (LongBench removes them from the list
    while iterating over it, which skips the element after each removal; this removes them all.)
    """
    if all_classes is None:
        raise ValueError("classification_score needs the task's all_classes")
    found = [c for c in all_classes if c in prediction]
    found = [c for c in found if c == ground_truth or c not in ground_truth]
    return 1.0 / len(found) if ground_truth in found else 0.0


def count_score(prediction: str, ground_truth: str, **_) -> float:
    """Fraction of the integers in the prediction that equal the gold count (passage_count)."""
    return _fraction_equal(re.findall(r"\d+", prediction), ground_truth)


def retrieval_score(prediction: str, ground_truth: str, **_) -> float:
    """Fraction of the integers in the prediction that equal k of the gold "Paragraph k" (passage_retrieval)."""
    match = re.search(r"Paragraph (\d+)", ground_truth)
    if match is None:
        raise ValueError(f"retrieval answer {ground_truth!r} is not of the form 'Paragraph k'")
    return _fraction_equal(re.findall(r"\d+", prediction), match.group(1))


def _fraction_equal(numbers: list[str], gold: str) -> float:
    return sum(n == gold for n in numbers) / len(numbers) if numbers else 0.0


def code_sim_score(prediction: str, ground_truth: str, **_) -> float:
    """Edit similarity of the first predicted line that contains none of ``\\```, ``#``, ``//`` (lcc, repobench-p).

    LongBench skips lines *containing* those markers (fences and comments), not only lines starting with
    them, and scores ``fuzzywuzzy.fuzz.ratio / 100``; without python-Levenshtein that ratio is
    ``round(100 * difflib.SequenceMatcher(None, a, b).ratio())``, with 100 for equal strings and 0 when
    one is empty.
    """
    line = next((ln for ln in prediction.lstrip("\n").split("\n")
                 if "`" not in ln and "#" not in ln and "//" not in ln), "")
    return fuzz_ratio(line, ground_truth) / 100


def fuzz_ratio(a: str, b: str) -> int:
    """``fuzzywuzzy.fuzz.ratio`` (pure-Python path): similarity 0..100."""
    if a == b:
        return 100
    if not a or not b:
        return 0
    return round(100 * difflib.SequenceMatcher(None, a, b).ratio())


MetricFn = Callable[..., float]

DATASET_TO_METRIC: dict[str, MetricFn] = {
    "narrativeqa": qa_f1_score,
    "qasper": qa_f1_score,
    "multifieldqa_en": qa_f1_score,
    "hotpotqa": qa_f1_score,
    "2wikimqa": qa_f1_score,
    "musique": qa_f1_score,
    "gov_report": rouge_score,
    "qmsum": rouge_score,
    "multi_news": rouge_score,
    "trec": classification_score,
    "triviaqa": qa_f1_score,
    "samsum": rouge_score,
    "passage_count": count_score,
    "passage_retrieval_en": retrieval_score,
    "lcc": code_sim_score,
    "repobench-p": code_sim_score,
}

MAX_NEW_TOKENS: dict[str, int] = {
    "narrativeqa": 128, "qasper": 128, "multifieldqa_en": 64, "hotpotqa": 32, "2wikimqa": 32, "musique": 32,
    "gov_report": 512, "qmsum": 512, "multi_news": 512, "trec": 64, "triviaqa": 32, "samsum": 128,
    "passage_count": 32, "passage_retrieval_en": 32, "lcc": 64, "repobench-p": 64,
}

# Few-shot tasks: the model keeps generating more "examples", so only its first line is the answer.
FIRST_LINE_DATASETS = frozenset({"trec", "triviaqa", "samsum"})


def score_prediction(dataset: str, prediction: str, answers: Sequence[str],
                     all_classes: Sequence[str] | None = None) -> float:
    """Best score over the gold answers for one prediction, in [0, 1]."""
    if dataset not in DATASET_TO_METRIC:
        raise ValueError(f"unknown LongBench dataset {dataset!r}; known: {', '.join(DATASET_TO_METRIC)}")
    if dataset in FIRST_LINE_DATASETS:
        prediction = prediction.lstrip("\n").split("\n")[0]
    metric = DATASET_TO_METRIC[dataset]
    return max((metric(prediction, gold, all_classes=all_classes) for gold in answers), default=0.0)


def scorer(dataset: str, predictions: Sequence[str], answers: Sequence[Sequence[str]],
           all_classes: Sequence[str] | None = None) -> float:
    """LongBench task score: 100 x the mean over samples of the best score over gold answers, 2 decimals."""
    if len(predictions) != len(answers) or not predictions:
        raise ValueError(f"need one answer list per prediction and at least one prediction: got "
                         f"{len(predictions)} predictions and {len(answers)} answer lists")
    total = sum(score_prediction(dataset, p, a, all_classes) for p, a in zip(predictions, answers, strict=True))
    return round(100 * total / len(predictions), 2)
