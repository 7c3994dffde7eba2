"""LongBench (Bai et al., 2023) run the LongBench way: its prompts, budgets, stops, truncation and metrics.

No LongBench data or configuration ships with us. A user who has LongBench's files passes data files from
its archive (``data.zip`` of THUDM/LongBench on the Hugging Face hub, which unpacks to ``data/<task>.jsonl``,
and ``data/<task>_e.jsonl`` for LongBench-E: one sample per line with ``input, context, answers, length,
all_classes, dataset, language, _id``, LongBench-E's ``dataset`` ending in ``_e``) and LongBench's config
folder (``config/`` of github.com/THUDM/LongBench: ``dataset2prompt.json``, the per-task prompt template with
``{context}``/``{input}`` fields; ``dataset2maxlen.json``, the per-task generation budget).
``check_longbench`` checks all of them before any compute. ``run_longbench`` then follows LongBench's
``pred.py`` and ``eval.py`` for a base (non-chat) model:

* the prompt is the task's template, tokenised and cut in the middle to ``max_length`` tokens (BOS, which we
  put first as every training document starts, included). LongBench's ``max_length`` is per model: its
  window minus 500 tokens (``config/model2maxlen.json``, on nominal windows: 3500 for the 4k Llama-2-chat,
  7500 for 8k, 31500 for 32k models), which leaves room for the longest answers (512 tokens). Here the
  default is ``max_positions - 500`` (``longbench_max_length``; a 4,096-token model gets 3,596: pass 3500 to
  match LongBench's 4k row). A task's prompt is cut further only where prompt plus answer budget would not
  fit the window, and a window of 500 tokens or fewer, too small for the rule, gives every prompt the window
  minus the answer budget. The budget used is recorded per task (``longbench/{dataset}/max_length``);
* decoding is greedy (or beam search, ``num_beams`` > 1), stops at EOS, and for samsum also at a newline
  after at least one token (LongBench's extra ``eos_token_id`` and ``min_length``);
* trec, triviaqa, samsum and lsht are scored on the prediction's first line; each task's metric is
  LongBench's: token F1 (jieba words for Chinese), ROUGE-L F from the ``rouge`` package (on jieba words for
  Chinese), ``fuzzywuzzy``'s ratio for code, class / count / paragraph matches; the task score is 100 x the
  mean over samples of the best score over gold answers, and for LongBench-E also per length bucket
  (``0-4k``, ``4-8k``, ``8k+`` of the sample's ``length``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from nope_lightning.eval.generate import beam_search, greedy_generate
from nope_lightning.eval.longbench_metrics import (
    DATASET_TO_METRIC,
    NEWLINE_STOP_DATASETS,
    scorer,
    scorer_e,
    task_of,
)

#: Tokens LongBench keeps free of the prompt in a model's window (``config/model2maxlen.json``: window - 500).
LONGBENCH_RESERVE = 500
DATA_LAYOUT = ("LongBench's data archive (data.zip of THUDM/LongBench on the Hugging Face hub) unpacks to "
               "data/<task>.jsonl, and data/<task>_e.jsonl for LongBench-E")
CONFIG_LAYOUT = ("LongBench's config folder (config/ in github.com/THUDM/LongBench) holds dataset2prompt.json and "
                 "dataset2maxlen.json")
REQUIRED_FIELDS = ("input", "context", "answers", "length", "all_classes", "dataset", "language", "_id")
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
    """Read a LongBench-format JSONL file; raise ``ValueError`` naming file, line and field on bad input, and
    ``FileNotFoundError`` naming LongBench's data layout for a missing file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LongBench file {path} does not exist: pass files from {DATA_LAYOUT}")
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
    if task_of(str(record["dataset"])) not in DATASET_TO_METRIC:
        raise ValueError(f"{where}: unknown LongBench task {record['dataset']!r}; known: {', '.join(DATASET_TO_METRIC)}")
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


# ---- LongBench's configuration and the run ---------------------------------------------------------------

@dataclass(frozen=True)
class LongBenchConfig:
    """LongBench's per-task prompt templates and generation budgets (tokens), from its config folder."""

    prompts: dict[str, str]
    max_new_tokens: dict[str, int]

    @classmethod
    def load(cls, folder: str | Path) -> LongBenchConfig:
        """Read ``dataset2prompt.json`` (task -> template) and ``dataset2maxlen.json`` (task -> tokens) from
        LongBench's ``config`` folder; one line naming the file for a missing file or a wrong content."""
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"longbench_config={folder}: no such folder; {CONFIG_LAYOUT}")
        tables = {}
        for name, kind in (("dataset2prompt", str), ("dataset2maxlen", int)):
            path = folder / f"{name}.json"
            if not path.is_file():
                raise FileNotFoundError(f"LongBench config {path} does not exist; {CONFIG_LAYOUT}")
            try:
                table = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                raise ValueError(f"LongBench config {path}: not valid JSON ({err})") from None
            if not isinstance(table, dict) or not all(type(v) is kind for v in table.values()):
                raise ValueError(f"LongBench config {path}: expected a JSON object of task -> {kind.__name__}")
            tables[name] = table
        return cls(tables["dataset2prompt"], tables["dataset2maxlen"])

    def task(self, dataset: str, where: str = "") -> tuple[str, int]:
        """(template, budget) of ``dataset``'s task; a ValueError (prefixed by ``where``) if the config
        lacks it."""
        task = task_of(dataset)
        missing = [name for name, table in (("dataset2prompt.json", self.prompts),
                                            ("dataset2maxlen.json", self.max_new_tokens)) if task not in table]
        if missing:
            raise ValueError(f"{where}LongBench config has no prompt and budget for task {task!r} (not in "
                             f"{' and '.join(missing)}); use LongBench's own config folder or add the task")
        return self.prompts[task], self.max_new_tokens[task]


def check_longbench(files: Sequence[str | Path], config_dir: str | Path) -> None:
    """Check every LongBench input before any compute: each file exists, parses and holds samples, the config
    folder holds both JSON files, and each file's tasks have a prompt and a budget in them. Raises one line
    (``FileNotFoundError`` for what is missing, ``ValueError`` for what is wrong) naming the fix."""
    config = LongBenchConfig.load(config_dir)
    for path in files:
        samples = load_longbench(path)
        if not samples:
            raise ValueError(f"LongBench file {path} holds no samples; {DATA_LAYOUT}")
        for dataset in dict.fromkeys(s.dataset for s in samples):
            config.task(dataset, where=f"{path}: ")


def longbench_max_length(window: int) -> int:
    """LongBench's prompt budget for a model with a ``window``-token context: ``window - 500`` (its
    ``config/model2maxlen.json``), or the whole window where that leaves nothing (``run_longbench`` then
    cuts each prompt to leave room for the task's answer)."""
    return window - LONGBENCH_RESERVE if window > LONGBENCH_RESERVE else window


def prompt_ids(sample: LongBenchSample, template: str, tokenizer, max_length: int) -> list[int]:
    """BOS + the filled template, cut in the middle to ``max_length`` tokens in all (``TextTokenizer``-like)."""
    return [tokenizer.bos_id, *truncate_middle(tokenizer.encode(sample.prompt(template)), max_length - 1)]


def run_longbench(model: torch.nn.Module, tokenizer, path: str | Path, max_positions: int, *,
                  config_dir: str | Path, max_length: int = 0, num_beams: int = 1,
                  batch_size: int = 1) -> dict[str, float]:
    """Predict and score a LongBench(-E) data file with LongBench's protocol (module doc).

    ``tokenizer``: ``encode``/``decode`` plus ``bos_id``, ``eos_id``, ``vocab_size``; ``max_positions``:
    the model's window (prompt + generated tokens); ``max_length``: the prompt budget in tokens (0:
    LongBench's rule, ``longbench_max_length``), cut per task to ``max_positions`` minus the task's answer
    budget. Returns ``longbench/{dataset}/score`` (0..100) and ``longbench/{dataset}/max_length`` (the prompt
    budget used) per dataset in the file and, for LongBench-E files, ``longbench/{dataset}/{bucket}/score``.
    Every task's budgets are checked before the first generation.
    """
    if num_beams < 1:
        raise ValueError(f"num_beams={num_beams} must be >= 1")
    config = LongBenchConfig.load(config_dir)
    samples = load_longbench(path)
    max_length = max_length or longbench_max_length(max_positions)
    tasks = {}
    for dataset in dict.fromkeys(s.dataset for s in samples):
        template, budget = config.task(dataset, where=f"{path}: ")
        if budget >= max_positions - 1:
            raise ValueError(f"{path}: {dataset}'s {budget}-token answer budget leaves no room for a prompt in "
                             f"this model's window of {max_positions} tokens")
        tasks[dataset] = template, budget, min(max_length, max_positions - budget)
    metrics: dict[str, float] = {}
    for dataset, (template, budget, prompt_budget) in tasks.items():
        group = [s for s in samples if s.dataset == dataset]
        prompts = [prompt_ids(s, template, tokenizer, prompt_budget) for s in group]
        stops = {tokenizer.eos_id}
        newline = task_of(dataset) in NEWLINE_STOP_DATASETS
        if newline:
            stops.add(tokenizer.encode("\n")[-1])
        options = dict(vocab_size=tokenizer.vocab_size, eos_id=stops, min_new_tokens=int(newline))
        if num_beams == 1:
            generated = greedy_generate(model, prompts, budget, batch_size, **options)
        else:
            generated = [beam_search(model, p, budget, num_beams, **options) for p in prompts]
        predictions = [tokenizer.decode(g) for g in generated]
        answers = [s.answers for s in group]
        metrics[f"longbench/{dataset}/score"] = scorer(dataset, predictions, answers, group[0].all_classes)
        metrics[f"longbench/{dataset}/max_length"] = prompt_budget
        if dataset != task_of(dataset):
            buckets = scorer_e(dataset, predictions, answers, [s.length for s in group], group[0].all_classes)
            metrics.update({f"longbench/{dataset}/{name}/score": v for name, v in buckets.items()})
    return metrics
