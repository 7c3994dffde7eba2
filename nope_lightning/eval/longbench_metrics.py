"""LongBench's metrics (Bai et al., 2023, ``metrics.py`` and ``eval.py`` of THUDM/LongBench): one prediction
against one gold answer in [0, 1], the task score (100 x the mean over samples of the best score over gold
answers) and LongBench-E's per-length-bucket scores. Token F1 (jieba words for Chinese), ROUGE-L F from the
``rouge`` package, ``fuzzywuzzy``'s ratio for code, class / count / paragraph matches; trec, triviaqa, samsum and
lsht are scored on the prediction's first line."""

from __future__ import annotations

import re
import string
import warnings
from collections import Counter
from collections.abc import Callable, Sequence

import jieba
from rouge import Rouge

with warnings.catch_warnings():
    # fuzzywuzzy warns that python-Levenshtein is absent; LongBench's requirements leave it out too, and its
    # pure-Python ratio (difflib) is the one LongBench's published scores use.
    warnings.simplefilter("ignore", UserWarning)
    from fuzzywuzzy import fuzz

_PUNCTUATION = frozenset(string.punctuation)
# LongBench's normalize_zh_answer: ASCII punctuation plus these full-width / CJK marks.
_ZH_PUNCTUATION = _PUNCTUATION | frozenset(
    "\uff01\uff1f\uff61\u3002\uff02\uff03\uff04\uff05\uff06\uff07\uff08\uff09\uff0a\uff0b\uff0c\uff0d"
    "\uff0f\uff1a\uff1b\uff1c\uff1d\uff1e\uff20\uff3b\uff3c\uff3d\uff3e\uff3f\uff40\uff5b\uff5c\uff5d"
    "\uff5e\uff5f\uff60\uff62\uff63\uff64\u3001\u3003\u300b\u300c\u300d\u300e\u300f\u3010\u3011\u3014"
    "\u3015\u3016\u3017\u3018\u3019\u301a\u301b\u301c\u301d\u301e\u301f\u3030\u303e\u303f\u2013\u2014"
    "\u2018\u2019\u201b\u201c\u201d\u201e\u201f\u2026\u2027\ufe4f.")



# ---- metrics: one prediction against one gold answer, in [0, 1] ----------------------------------------

def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop ASCII punctuation, drop articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


MetricFn = Callable[..., float]


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


def normalize_zh_answer(text: str) -> str:
    """LongBench's Chinese normalisation: lowercase, drop ASCII and CJK punctuation, drop all whitespace."""
    return "".join(ch for ch in text.lower() if ch not in _ZH_PUNCTUATION and not ch.isspace())


def qa_f1_zh_score(prediction: str, ground_truth: str, **_) -> float:
    """Token F1 over jieba words, each normalised, empty ones dropped (multifieldqa_zh)."""
    def words(text: str) -> list[str]:
        return [w for w in (normalize_zh_answer(t) for t in jieba.cut(text, cut_all=False)) if w]

    return token_f1(words(prediction), words(ground_truth))


def rouge_score(prediction: str, ground_truth: str, **_) -> float:
    """ROUGE-L F of the ``rouge`` package (``Rouge().get_scores``), 0 where it raises (empty texts), as
    LongBench computes it."""
    try:
        return Rouge().get_scores([prediction], [ground_truth], avg=True)["rouge-l"]["f"]
    except Exception:  # LongBench scores 0 whenever the package raises (e.g. on an empty text)
        return 0.0


def rouge_zh_score(prediction: str, ground_truth: str, **_) -> float:
    """ROUGE-L over jieba words joined by spaces (dureader, vcsum)."""
    return rouge_score(" ".join(jieba.cut(prediction, cut_all=False)),
                       " ".join(jieba.cut(ground_truth, cut_all=False)))


def classification_score(prediction: str, ground_truth: str, *, all_classes: Sequence[str] | None, **_) -> float:
    """1/k if the gold class is among the k class names found in the prediction, else 0 (trec, lsht).

    LongBench's rule verbatim: found names that are proper substrings of the gold class are removed from the
    list while iterating over it, which skips the element after each removal (kept for comparability).
    """
    if all_classes is None:
        raise ValueError("classification_score needs the task's all_classes")
    found = [c for c in all_classes if c in prediction]
    for name in found:
        if name in ground_truth and name != ground_truth:
            found.remove(name)
    return 1.0 / len(found) if ground_truth in found else 0.0


def count_score(prediction: str, ground_truth: str, **_) -> float:
    """Fraction of the integers in the prediction that equal the gold count (passage_count)."""
    return _fraction_equal(re.findall(r"\d+", prediction), ground_truth)


def _retrieval(pattern: str) -> MetricFn:
    def score(prediction: str, ground_truth: str, **_) -> float:
        match = re.search(pattern, ground_truth)
        if match is None:
            raise ValueError(f"retrieval answer {ground_truth!r} does not match {pattern!r}")
        return _fraction_equal(re.findall(r"\d+", prediction), match.group(1))

    score.__doc__ = f"Fraction of the integers in the prediction equal to k of the gold ``{pattern}``."
    return score


def _fraction_equal(numbers: list[str], gold: str) -> float:
    return sum(n == gold for n in numbers) / len(numbers) if numbers else 0.0


def code_sim_score(prediction: str, ground_truth: str, **_) -> float:
    """``fuzzywuzzy.fuzz.ratio / 100`` of the first predicted line that contains no backtick, ``#`` or
    ``//`` (lcc, repobench-p); LongBench skips lines *containing* those markers, not only starting with them."""
    line = next((ln for ln in prediction.lstrip("\n").split("\n")
                 if "`" not in ln and "#" not in ln and "//" not in ln), "")
    return fuzz.ratio(line, ground_truth) / 100


retrieval_score = _retrieval(r"Paragraph (\d+)")
retrieval_zh_score = _retrieval("\u6bb5\u843d(\\d+)")  # 段落k

# LongBench's dataset2metric (all 21 tasks).
DATASET_TO_METRIC: dict[str, MetricFn] = {
    "narrativeqa": qa_f1_score, "qasper": qa_f1_score, "multifieldqa_en": qa_f1_score,
    "multifieldqa_zh": qa_f1_zh_score, "hotpotqa": qa_f1_score, "2wikimqa": qa_f1_score, "musique": qa_f1_score,
    "dureader": rouge_zh_score, "gov_report": rouge_score, "qmsum": rouge_score, "multi_news": rouge_score,
    "vcsum": rouge_zh_score, "trec": classification_score, "triviaqa": qa_f1_score, "samsum": rouge_score,
    "lsht": classification_score, "passage_retrieval_en": retrieval_score, "passage_count": count_score,
    "passage_retrieval_zh": retrieval_zh_score, "lcc": code_sim_score, "repobench-p": code_sim_score,
}

# Few-shot tasks: the model keeps generating more "examples", so only its first line is the answer.
FIRST_LINE_DATASETS = frozenset({"trec", "triviaqa", "samsum", "lsht"})
# pred.py stops samsum at a newline too (after at least one token): it would repeat "\nDialogue" forever.
NEWLINE_STOP_DATASETS = frozenset({"samsum"})
# LongBench-E's buckets of the sample's ``length``: (name, upper bound, exclusive).
LENGTH_BUCKETS = (("0-4k", 4000), ("4-8k", 8000), ("8k+", float("inf")))


def task_of(dataset: str) -> str:
    """The LongBench task of a data file's ``dataset`` field (LongBench-E's ``qasper_e`` -> ``qasper``)."""
    return dataset.removesuffix("_e")


def score_prediction(dataset: str, prediction: str, answers: Sequence[str],
                     all_classes: Sequence[str] | None = None) -> float:
    """Best score over the gold answers for one prediction, in [0, 1]."""
    task = task_of(dataset)
    if task not in DATASET_TO_METRIC:
        raise ValueError(f"unknown LongBench dataset {dataset!r}; known: {', '.join(DATASET_TO_METRIC)}")
    if task in FIRST_LINE_DATASETS:
        prediction = prediction.lstrip("\n").split("\n")[0]
    metric = DATASET_TO_METRIC[task]
    return max((metric(prediction, gold, all_classes=all_classes) for gold in answers), default=0.0)


def scorer(dataset: str, predictions: Sequence[str], answers: Sequence[Sequence[str]],
           all_classes: Sequence[str] | None = None) -> float:
    """LongBench task score: 100 x the mean over samples of the best score over gold answers, 2 decimals."""
    if len(predictions) != len(answers) or not predictions:
        raise ValueError(f"need one answer list per prediction and at least one prediction: got "
                         f"{len(predictions)} predictions and {len(answers)} answer lists")
    total = sum(score_prediction(dataset, p, a, all_classes) for p, a in zip(predictions, answers, strict=True))
    return round(100 * total / len(predictions), 2)


def scorer_e(dataset: str, predictions: Sequence[str], answers: Sequence[Sequence[str]], lengths: Sequence[int],
             all_classes: Sequence[str] | None = None) -> dict[str, float]:
    """LongBench-E: the task score per length bucket (``0-4k``, ``4-8k``, ``8k+``); empty buckets are absent."""
    buckets: dict[str, list[float]] = {}
    for prediction, gold, length in zip(predictions, answers, lengths, strict=True):
        name = next(name for name, upper in LENGTH_BUCKETS if length < upper)
        buckets.setdefault(name, []).append(score_prediction(dataset, prediction, gold, all_classes))
    return {name: round(100 * sum(v) / len(v), 2) for name, _ in LENGTH_BUCKETS if (v := buckets.get(name))}
