"""Synthetic long-context tasks built offline from any list of text documents (LongBench/RULER-like).

Every task returns ``LongContextSample``s whose ``prompt_ids`` have at most ``length`` tokens (exactly
``length`` for the two tasks with a filler haystack), are deterministic in ``seed``, and end with a cue that
a base LM completes with the answer. ``sample.score(prediction)`` grades a continuation in [0, 1] with the
sample's ``metric``. Prompts are concatenations of separately encoded segments (as in ``passkey``: all but
the opening task line as they read in running text, ``TextTokenizer.encode_continuation``), so lengths are
exact sums; the haystack is made of the documents' sentences, whitespace collapsed, each piece
at most ``MAX_UNIT_WORDS`` words with one leading space.

Formats (``{...}`` is filled per sample; ``\\n`` is a newline):

* ``multikey_retrieval``: ``MULTIKEY_TASK\\n`` + text with ``num_keys`` needles
  ``" The pass key of {NAME} is {key}. Remember it."`` at random sentence boundaries + ``"\\nWhat is the
  pass key of {NAME}? The pass key of {NAME} is"``. Answer: the asked key; metric ``first_integer``.
* ``passage_retrieval``: ``RETRIEVAL_TASK\\n\\n`` + ``"Paragraph {k}: {paragraph}\\n\\n"`` for k = 1..n +
  ``"Sentence: {sentence}\\nThe sentence comes from Paragraph"``; the sentence is copied from exactly one
  paragraph. Answer: ``"Paragraph k"``; metric LongBench ``retrieval_score``.
* ``passage_count``: ``COUNT_TASK\\n\\n`` + numbered paragraphs, each distinct one repeated 1-3 times, in
  random order + ``"How many different paragraphs are there? The answer is:"``. Answer: the count;
  metric LongBench ``count_score``.
* ``variable_tracking`` (RULER): ``TRACKING_TASK\\n`` + text with ``num_chains`` chains
  ``" VAR {A} = {value}."``, ``" VAR {B} = VAR {A}."``, ... (``num_hops`` links each, chains interleaved,
  each in order) + ``"\\nQuestion: which variables are assigned the value {value}, directly or through
  other variables? Answer: the variables assigned the value {value} are:"``. Answers: every name of the
  asked chain; metric ``string_match_all`` (fraction of them in the prediction).
"""

from __future__ import annotations

import random
import re
import string
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tqdm.auto import tqdm

from nope_lightning.config.stages import EvaluateConfig
from nope_lightning.data.passkey import continuation_encoder
from nope_lightning.data.tokenizer import TextTokenizer
from nope_lightning.eval.generate import greedy_generate
from nope_lightning.eval.longbench_metrics import count_score, retrieval_score
from nope_lightning.eval.passkey import score_passkey

MAX_UNIT_WORDS = 50  # caps haystack pieces so needles can land anywhere, even in text without full stops
#: Generation budget (new tokens) of each task's answer; variable tracking's grows with its hops.
ANSWER_TOKENS = {"multikey_retrieval": 10, "passage_retrieval": 32, "passage_count": 32}
TRACKING_TOKENS_PER_NAME = 8


def answer_tokens(task: str, num_hops: int = 4) -> int:
    """New tokens generated for ``task``'s answer (variable tracking names ``num_hops + 1`` variables)."""
    return TRACKING_TOKENS_PER_NAME * (num_hops + 1) if task == "variable_tracking" else ANSWER_TOKENS[task]

MULTIKEY_TASK = ("There are pass keys of several people hidden inside a lot of irrelevant text. Find them and "
                 "memorize them. I will quiz you about one of them.")
RETRIEVAL_TASK = ("Below are numbered paragraphs, followed by a sentence copied from one of them. Find the "
                  "paragraph the sentence comes from.")
COUNT_TASK = ("Below are numbered paragraphs. Some of them are exact copies of others. Count how many "
              "different paragraphs there are.")
TRACKING_TASK = ("Memorize the variable assignments hidden inside the text below. I will ask you about "
                 "them.")


def string_match_all(prediction: str, answers: Sequence[str]) -> float:
    """RULER's metric: fraction of the answers found (case-insensitively) in the prediction."""
    return sum(a.lower() in prediction.lower() for a in answers) / len(answers)


def _best_over_answers(metric: Callable[[str, str], float]) -> Callable[[str, Sequence[str]], float]:
    return lambda prediction, answers: max(metric(prediction, a) for a in answers)


METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {
    "first_integer": _best_over_answers(lambda p, a: float(score_passkey(p, a))),
    "retrieval_score": _best_over_answers(retrieval_score),
    "count_score": _best_over_answers(count_score),
    "string_match_all": string_match_all,
}


@dataclass(frozen=True)
class LongContextSample:
    """One prompt (``len(prompt_ids) <= length``) with its gold ``answers`` and the name of its metric."""

    task: str
    prompt_ids: list[int]
    answers: list[str]
    metric: str
    length: int
    max_new_tokens: int

    def score(self, prediction: str) -> float:
        """Grade a generated continuation in [0, 1]."""
        return METRICS[self.metric](prediction, self.answers)


def split_sentences(documents: Sequence[str], max_words: int = MAX_UNIT_WORDS) -> list[str]:
    """Haystack pieces: sentences (split after . ! ?) of at most ``max_words`` words, each as ``" " + text``."""
    pieces = []
    for doc in documents:
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(doc.split())):
            words = sentence.split()
            pieces += [" " + " ".join(words[i:i + max_words]) for i in range(0, len(words), max_words)]
    return pieces


def split_paragraphs(documents: Sequence[str], min_words: int = 30, max_words: int = 150) -> list[str]:
    """Distinct paragraphs (blank-line separated; longer ones cut into ``max_words``-word pieces), whitespace
    collapsed, ``min_words`` words or more, in document order."""
    seen: dict[str, None] = {}
    for doc in documents:
        for block in re.split(r"\n\s*\n", doc):
            words = block.split()
            for i in range(0, len(words), max_words):
                piece = words[i:i + max_words]
                if len(piece) >= min_words:
                    seen.setdefault(" ".join(piece))
    return list(seen)


class _EncodedPieces:
    """Token ids of text pieces, encoded on first use (a corpus can hold millions of sentences)."""

    def __init__(self, tokenizer: TextTokenizer, texts: Sequence[str], what: str) -> None:
        if not texts:
            raise ValueError(f"the documents contain no {what}")
        self.encode, self.texts, self._ids = continuation_encoder(tokenizer), texts, {}

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> list[int]:
        if i not in self._ids:
            self._ids[i] = self.encode(self.texts[i])
        return self._ids[i]


def _haystack(pieces: _EncodedPieces, rng: random.Random, budget: int, needles: list[list[int]]) -> list[int]:
    """``budget`` tokens of consecutive pieces from a random start (the last one cut to fit, wrapping around
    the corpus if needed), with ``needles`` inserted in their order at random piece boundaries."""
    units, total, i = [], 0, rng.randrange(len(pieces))
    while total < budget:
        units.append(pieces[i % len(pieces)])
        total += len(units[-1])
        i += 1
    if units:
        units[-1] = units[-1][:len(units[-1]) - (total - budget)]
    # Boundary b is "before units[b]": never after the cut last piece.
    slots = sorted(rng.randint(0, max(len(units) - 1, 0)) for _ in needles)
    ids: list[int] = []
    placed = 0
    for b in range(len(units) + 1):
        while placed < len(needles) and slots[placed] == b:
            ids += needles[placed]
            placed += 1
        if b < len(units):
            ids += units[b]
    return ids


def _filled(tokenizer: TextTokenizer, task: str, length: int, head: list[int], needles: list[list[int]],
            tail: list[int], pieces: _EncodedPieces, rng: random.Random) -> list[int]:
    budget = length - len(head) - sum(map(len, needles)) - len(tail)
    if budget < 0:
        raise ValueError(f"length={length} is too short for {task}: the prompt needs {length - budget} tokens "
                         "without any haystack")
    ids = [*head, *_haystack(pieces, rng, budget, needles), *tail]
    assert len(ids) == length
    return ids


def _names(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct random 5-letter upper-case names."""
    names: dict[str, None] = {}
    while len(names) < n:
        names.setdefault("".join(rng.choices(string.ascii_uppercase, k=5)))
    return list(names)


def _numbers(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct random 5-digit numbers."""
    return [str(v) for v in rng.sample(range(10000, 100000), n)]


def multikey_retrieval(tokenizer: TextTokenizer, documents: Sequence[str], length: int, num_samples: int,
                       num_keys: int = 4, seed: int | str = 0) -> list[LongContextSample]:
    """Several named pass keys hidden in real text; the prompt asks for one. Exactly ``length`` tokens."""
    if num_keys < 1:
        raise ValueError(f"num_keys={num_keys} must be >= 1")
    rng = random.Random(seed)
    pieces = _EncodedPieces(tokenizer, split_sentences(documents), "sentences")
    head, continuation = tokenizer.encode(MULTIKEY_TASK + "\n"), continuation_encoder(tokenizer)
    samples = []
    for _ in range(num_samples):
        names, keys = _names(rng, num_keys), _numbers(rng, num_keys)
        needles = [continuation(f" The pass key of {n} is {k}. Remember it.")
                   for n, k in zip(names, keys, strict=True)]
        asked = rng.randrange(num_keys)
        tail = continuation(f"\nWhat is the pass key of {names[asked]}? The pass key of {names[asked]} is")
        ids = _filled(tokenizer, "multikey_retrieval", length, head, needles, tail, pieces, rng)
        samples.append(LongContextSample("multikey_retrieval", ids, [keys[asked]], "first_integer", length,
                                         answer_tokens("multikey_retrieval")))
    return samples


def variable_tracking(tokenizer: TextTokenizer, documents: Sequence[str], length: int, num_samples: int,
                      num_chains: int = 2, num_hops: int = 4, seed: int | str = 0) -> list[LongContextSample]:
    """RULER's variable tracking: chains of ``VAR`` assignments in real text. Exactly ``length`` tokens."""
    if num_chains < 1 or num_hops < 0:
        raise ValueError(f"num_chains={num_chains} must be >= 1 and num_hops={num_hops} >= 0")
    rng = random.Random(seed)
    pieces = _EncodedPieces(tokenizer, split_sentences(documents), "sentences")
    head, continuation = tokenizer.encode(TRACKING_TASK + "\n"), continuation_encoder(tokenizer)
    samples = []
    for _ in range(num_samples):
        names = _names(rng, num_chains * (num_hops + 1))
        chains = [names[c * (num_hops + 1):(c + 1) * (num_hops + 1)] for c in range(num_chains)]
        values = _numbers(rng, num_chains)
        # Hop-major order keeps every chain in order while interleaving the chains.
        statements = [f" VAR {chain[0]} = {value}." for chain, value in zip(chains, values, strict=True)]
        statements += [f" VAR {chain[h]} = VAR {chain[h - 1]}." for h in range(1, num_hops + 1) for chain in chains]
        asked = rng.randrange(num_chains)
        tail = continuation(f"\nQuestion: which variables are assigned the value {values[asked]}, directly "
                            f"or through other variables? Answer: the variables assigned the value "
                            f"{values[asked]} are:")
        needles = [continuation(s) for s in statements]
        ids = _filled(tokenizer, "variable_tracking", length, head, needles, tail, pieces, rng)
        samples.append(LongContextSample("variable_tracking", ids, chains[asked], "string_match_all", length,
                                         answer_tokens("variable_tracking", num_hops)))
    return samples


class _NumberedParagraphs:
    """Builds ``"Paragraph {k}: {text}\\n\\n"`` blocks from encoded paragraphs."""

    def __init__(self, tokenizer: TextTokenizer, paragraphs: _EncodedPieces) -> None:
        self.continuation, self.paragraphs = continuation_encoder(tokenizer), paragraphs
        self.separator = self.continuation("\n\n")

    def block(self, k: int, index: int) -> list[int]:
        return [*self.continuation(f"Paragraph {k}:"), *self.paragraphs[index], *self.separator]

    def body(self, order: Sequence[int]) -> list[int]:
        return [t for k, index in enumerate(order, 1) for t in self.block(k, index)]

    def fit(self, order: list[int], budget: int, keep: int | None = None) -> list[int]:
        """Drop paragraphs from the end of ``order`` (never ``keep``) until the body fits in ``budget``."""
        while len(self.body(order)) > budget:
            removable = [i for i, index in enumerate(order) if index != keep]
            if not removable:
                raise ValueError(f"the paragraphs do not fit in {budget} tokens: increase the length")
            order.pop(removable[-1])
        return order


def passage_retrieval(tokenizer: TextTokenizer, documents: Sequence[str], length: int, num_samples: int,
                      seed: int | str = 0, min_words: int = 30, max_words: int = 150) -> list[LongContextSample]:
    """Which numbered paragraph was a sentence copied from? As many paragraphs as fit in ``length``."""
    rng = random.Random(seed)
    texts = split_paragraphs(documents, min_words, max_words)
    numbered = _NumberedParagraphs(tokenizer, _EncodedPieces(tokenizer, [" " + p for p in texts], "paragraphs"))
    head = tokenizer.encode(RETRIEVAL_TASK + "\n\n")
    samples = []
    for _ in range(num_samples):
        target = rng.randrange(len(texts))
        sentence = _query_sentence(texts[target], rng)
        tail = numbered.continuation(f"Sentence: {sentence}\nThe sentence comes from Paragraph")
        budget = length - len(head) - len(tail)
        # Paragraphs that also contain the sentence would make the answer ambiguous.
        others = [i for i in _candidates(rng, len(texts), budget, min_words)
                  if i != target and sentence not in texts[i]]
        order = _greedy_fill(numbered, others, budget - len(numbered.block(1, target)))
        order.insert(rng.randint(0, len(order)), target)
        order = numbered.fit(order, budget, keep=target)
        if len(order) < 2:
            raise ValueError(f"length={length} is too short for passage_retrieval: fewer than 2 paragraphs fit")
        ids = [*head, *numbered.body(order), *tail]
        samples.append(LongContextSample("passage_retrieval", ids, [f"Paragraph {order.index(target) + 1}"],
                                         "retrieval_score", length, answer_tokens("passage_retrieval")))
    return samples


def passage_count(tokenizer: TextTokenizer, documents: Sequence[str], length: int, num_samples: int,
                  seed: int | str = 0, max_copies: int = 3, min_words: int = 30,
                  max_words: int = 150) -> list[LongContextSample]:
    """How many different paragraphs among numbered ones with duplicates? As many as fit in ``length``."""
    if max_copies < 1:
        raise ValueError(f"max_copies={max_copies} must be >= 1")
    rng = random.Random(seed)
    texts = split_paragraphs(documents, min_words, max_words)
    numbered = _NumberedParagraphs(tokenizer, _EncodedPieces(tokenizer, [" " + p for p in texts], "paragraphs"))
    head = tokenizer.encode(COUNT_TASK + "\n\n")
    tail = numbered.continuation("How many different paragraphs are there? The answer is:")
    budget = length - len(head) - len(tail)
    samples = []
    for _ in range(num_samples):
        copies = [i for i in _candidates(rng, len(texts), budget, min_words)
                  for _ in range(rng.randint(1, max_copies))]
        order = _greedy_fill(numbered, copies, budget)
        rng.shuffle(order)
        order = numbered.fit(order, budget)
        if not order:
            raise ValueError(f"length={length} is too short for passage_count: no paragraph fits")
        ids = [*head, *numbered.body(order), *tail]
        samples.append(LongContextSample("passage_count", ids, [str(len(set(order)))], "count_score", length,
                                         answer_tokens("passage_count")))
    return samples


def _candidates(rng: random.Random, n: int, budget: int, min_words: int) -> list[int]:
    """Distinct random paragraph indices, no more than can fit: a block holds >= ``min_words`` tokens."""
    return rng.sample(range(n), min(n, max(budget, 0) // min_words + 1))


def _greedy_fill(numbered: _NumberedParagraphs, candidates: Sequence[int], budget: int) -> list[int]:
    """The longest prefix of ``candidates`` whose numbered blocks fit in ``budget`` tokens."""
    chosen, used = [], 0
    for index in candidates:
        used += len(numbered.block(len(chosen) + 1, index))
        if used > budget:
            break
        chosen.append(index)
    return chosen


def _query_sentence(paragraph: str, rng: random.Random) -> str:
    """A random sentence of at least 6 words from the paragraph (its longest one if none is that long)."""
    sentences = re.split(r"(?<=[.!?])\s+", paragraph)
    long_enough = [s for s in sentences if len(s.split()) >= 6]
    return rng.choice(long_enough) if long_enough else max(sentences, key=len)


#: The tasks by ``EvaluateConfig.longctx_tasks`` name.
TASKS = {"multikey_retrieval": multikey_retrieval, "variable_tracking": variable_tracking,
         "passage_retrieval": passage_retrieval, "passage_count": passage_count}


def task_samples(tokenizer: TextTokenizer, documents: list[str], lengths: list[int], cfg: EvaluateConfig) -> dict:
    """``evaluate``'s long-context samples: ``{"samples": {(task, length): [...]}, "skipped": {...}}`` built from
    the split's documents and seeded by the split (``<split>-<seed>``). A task whose fixed parts do not fit a
    (short) length is skipped for that length with one line on stderr, and listed under ``skipped``."""
    tasks, skipped = {}, {}
    for task in cfg.longctx_tasks:
        for length in lengths:
            try:
                tasks[task, length] = TASKS[task](tokenizer, documents, length, cfg.longctx_samples,
                                                  seed=f"{cfg.split}-{cfg.seed}")
            except ValueError as err:
                skipped[f"{task}/len{length}"] = str(err)
                print(f"evaluate: long-context task {task} skipped at length {length}: {err}", file=sys.stderr)
    return {"samples": tasks, "skipped": skipped}


def run_tasks(model, tokenizer, tasks: dict,
              cfg: EvaluateConfig) -> tuple[dict[str, dict[int, float]], dict[str, str], dict[str, float]]:
    """Greedy answers to the long-context samples: ``(scores, skipped, metrics)`` with the mean score in [0, 1]
    per task and length, and why a task was skipped at a length (``task/len{L}`` -> reason)."""
    metrics, scores = {}, {}
    for (task, length), samples in tqdm(tasks["samples"].items(), desc="long-context tasks", leave=False):
        new = max(s.max_new_tokens for s in samples)
        # BOS first, as every training document starts (NoPE models lean on it to count positions).
        generated = greedy_generate(model, [[tokenizer.bos_id, *s.prompt_ids] for s in samples], new,
                                    cfg.batch_size, tokenizer.vocab_size)
        score = sum(s.score(tokenizer.decode(g)) for s, g in zip(samples, generated, strict=True)) / len(samples)
        metrics[f"longctx/{task}/len{length}/score"] = score
        scores.setdefault(task, {})[length] = score
    return scores, tasks["skipped"], metrics
