"""The synthetic tasks' results (Kazemnejad et al. 2023): one (task, position encoding, seed) cell
(``synthetic``'s ``results.json``), one (task, seed)'s attention analysis (the grid's
``attention_by_seed/<task>_s<seed>.json``) and the grid's aggregate (``synthetic-grid``'s ``results.json``).
Accuracies are exact match in [0, 1], lengths the task's own (e.g. digits), times in seconds.

Format versions: a cell (and the grid holding cells) of version 1 has no per-example record (``ood_correct``,
``test_digest``: read as empty); version 2 adds them, so that PE-vs-PE differences can be paired on the test
examples (``analysis.synthetic.claims``). The attention analysis's NoPE-vs-NoPE floor and per-seed values
(``TaskAttention``) came later without a new version (they only add keys): a file without them reads them empty.
So did a cell's held-out in-distribution test split (``id_test_acc``, ``id_test_buckets``) and how its training
ended (``stopped_by_rule``): a cell without them reads None / empty, and its ID numbers are the validation
split's (``SyntheticCell.id_score``)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nope_lightning.config.synthetic import PAPER_PES
from nope_lightning.results.core import ResultFile, int_keys
from nope_lightning.synthetic.core import Example


@dataclass(frozen=True)
class BucketAccuracy:
    """Exact match over the examples of one length bucket (``"24"`` or ``"21-25"``), in (``id``) or out of
    (``ood``) the training lengths."""

    bucket: str
    split: str
    n: int
    acc: float


@dataclass(frozen=True)
class Failure:
    """A wrong out-of-distribution prediction, as readable tokens."""

    length: int
    prompt: str
    target: str
    prediction: str


def problems_digest(examples: Sequence[Example]) -> str:
    """16 hex digits naming a test split's problems, in order: their prompts and final answers, not the
    scratchpad format (a (task, seed)'s split is the same problems in every format and for every PE)."""
    text = "\n".join(" ".join(e.prompt) + " => " + " ".join(e.answer) for e in examples)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class SyntheticCell(ResultFile):
    """One trained and evaluated (task, PE, seed): ID and OOD accuracy of the weights selected on ID
    validation (``best_val_acc`` at ``best_step`` of ``steps``), per length bucket, and the first failures.

    ``ood_correct``: each test (OOD) example's exact match, in the test split's order; ``test_digest``: that
    split's ``problems_digest``. Every PE and scratchpad format of a (task, seed) is scored on the same split,
    which the digest lets a reader check before pairing two cells example by example. Both are empty in a
    version-1 file. On disk ``ood_correct`` is a string of ``0``/``1``, one character per example (a JSON list
    of booleans takes six).

    ``id_test_acc`` / ``id_test_buckets``: exact match on the held-out in-distribution test split (problems at the
    training lengths kept apart from the validation split that selected the weights), overall and per length
    bucket; None / empty for a cell run without one. ``steps`` is where training ended; ``stopped_by_rule``: True
    when the stopping rule ended it (validation ID exact match held at its threshold), False when it ran to its
    cap, None when the cell did not record it. ``scratchpad_errors``: for a scratchpad cell, where its wrong OOD
    outputs first went wrong (``eval.synthetic_scoring.scratchpad_errors``: kind -> the steps, 1-based); empty
    without a scratchpad, or in a cell run before it was recorded. The four keys are written only when set, so a
    cell without them writes what it always did."""

    KIND = "synthetic"
    VERSION = 2

    run_id: str
    task: str
    pos_encoding: str
    seed: int
    scratchpad: str
    train_max_len: int
    test_max_len: int
    id_acc: float
    ood_acc: float
    best_val_acc: float
    best_step: int
    steps: int
    train_seconds: float
    eval_seconds: float
    parameters: int
    buckets: list[BucketAccuracy]
    errors: list[Failure] = field(default_factory=list)
    ood_correct: tuple[bool, ...] = ()
    test_digest: str = ""
    id_test_acc: float | None = None
    id_test_buckets: list[BucketAccuracy] = field(default_factory=list)
    stopped_by_rule: bool | None = None
    scratchpad_errors: dict[str, list[int]] = field(default_factory=dict)

    @property
    def id_score(self) -> tuple[float, str]:
        """The cell's in-distribution exact match and the split it comes from: the held-out ID test split's
        (``"id_test"``) when the cell has one, else the validation split's (``"validation"``), which also
        selected the weights and so reads a little high."""
        return (self.id_test_acc, "id_test") if self.id_test_acc is not None else (self.id_acc, "validation")

    def body(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("run_id", "task", "pos_encoding", "seed", "scratchpad",
                                             "train_max_len", "test_max_len", "id_acc", "ood_acc", "best_val_acc",
                                             "best_step", "steps", "train_seconds", "eval_seconds", "parameters",
                                             "test_digest")}
        later = {**({"id_test_acc": self.id_test_acc} if self.id_test_acc is not None else {}),
                 **({"id_test_buckets": [vars(b) for b in self.id_test_buckets]} if self.id_test_buckets else {}),
                 **({"stopped_by_rule": self.stopped_by_rule} if self.stopped_by_rule is not None else {}),
                 **({"scratchpad_errors": self.scratchpad_errors} if self.scratchpad_errors else {})}
        return {**out, **later, "ood_correct": "".join("1" if ok else "0" for ok in self.ood_correct),
                "buckets": [vars(b) for b in self.buckets], "errors": [vars(e) for e in self.errors]}

    @classmethod
    def parse(cls, data: dict[str, Any]) -> SyntheticCell:
        fields = {k: v for k, v in data.items()
                  if k not in ("version", "buckets", "errors", "ood_correct", "id_test_buckets")}
        return cls(**fields, buckets=[BucketAccuracy(**b) for b in data["buckets"]],
                   errors=[Failure(**e) for e in data.get("errors", [])],
                   ood_correct=tuple(c == "1" for c in data.get("ood_correct", "")),
                   id_test_buckets=[BucketAccuracy(**b) for b in data.get("id_test_buckets", [])])


@dataclass(frozen=True)
class TaskAttention:
    """One task's attention analysis, per PE (its paper name in a grid, ours in a ``SeedAttention``): the layer-mean
    min-head JSD to NoPE (nats) per length, the same per layer, and the attended-distance histogram over ``edges``.

    The NoPE-vs-NoPE floor (``analysis.synthetic.grid.floor_partner``): ``floor_by_layer[length]``, per layer, the same JSD
    between the NoPE models of two seeds on the same inputs (a grid's: the mean over its seeds that have one);
    ``floor_partners[seed]``: the seed whose NoPE model that seed's NoPE was compared with. ``by_seed[seed][pe]`` and
    ``floor_by_seed[seed]``: each seed's per-layer JSD and floor, mean over the analysed lengths (what intervals
    across seeds read; a grid's only: a ``SeedAttention`` is one seed). A file written before these reads them empty;
    a grid's first seed has no floor (``floor_partners`` lacks it), so a grid of one seed has none."""

    jsd: dict[str, dict[int, float]]
    jsd_by_layer: dict[str, dict[int, list[float]]]
    hist: dict[str, list[int]]
    edges: list[float]
    floor_by_layer: dict[int, list[float]] = field(default_factory=dict)
    floor_partners: dict[int, int] = field(default_factory=dict)
    by_seed: dict[int, dict[str, list[float]]] = field(default_factory=dict)
    floor_by_seed: dict[int, list[float]] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: dict[str, Any]) -> TaskAttention:
        return cls({pe: int_keys(v) for pe, v in data["jsd"].items()},
                   {pe: int_keys(v) for pe, v in data["jsd_by_layer"].items()}, data["hist"], data["edges"],
                   *(int_keys(data.get(key, {})) for key in ("floor_by_layer", "floor_partners", "by_seed",
                                                              "floor_by_seed")))


@dataclass(frozen=True)
class SeedAttention(ResultFile):
    """The attention analysis of one (task, seed), per PE (our names, NoPE the reference, its JSD absent); the
    grid stores it as soon as it is computed, so a resumed grid needs no model of a (task, seed) already done."""

    KIND = "synthetic-attention"

    task: str
    seed: int
    attention: TaskAttention

    def body(self) -> dict[str, Any]:
        return {"task": self.task, "seed": self.seed, "attention": vars(self.attention)}

    @classmethod
    def parse(cls, data: dict[str, Any]) -> SeedAttention:
        return cls(data["task"], data["seed"], TaskAttention.parse(data["attention"]))


@dataclass(frozen=True)
class SyntheticGridResult(ResultFile):
    """The grid: the PEs' mean reciprocal rank, the mean OOD accuracy per task and PE, the markdown tables
    (``ood``, ``id``), the attention analysis per task and every cell (without its failures)."""

    KIND = "synthetic-grid"
    VERSION = 2  # its cells' version (``SyntheticCell``)

    parent_run_id: str
    mrr: dict[str, float]
    ood: dict[str, dict[str, float]]
    tables: dict[str, str]
    attention: dict[str, TaskAttention]
    runs: list[SyntheticCell]

    def body(self) -> dict[str, Any]:
        runs = [{k: v for k, v in cell.body().items() if k != "errors"} for cell in self.runs]
        return {"parent_run_id": self.parent_run_id, "mrr": self.mrr, "ood": self.ood, "tables": self.tables,
                "attention": {task: vars(a) for task, a in self.attention.items()}, "runs": runs}

    def label(self) -> tuple[tuple[str, str], ...]:
        """``(("task", t),)``, with ``("scratchpad", f)`` unless ``none``, when every cell is of one (task,
        format), as a task file's seed slice is (nothing for a grid of several: its file name would list them);
        then ``("pe", "nope_t5")`` when its cells hold other PEs than the paper's five, as a PE slice of one seed
        does, so that two slices of one (task, format, seed) are named by their PEs, not numbered by join order."""
        held = {(cell.task, cell.scratchpad) for cell in self.runs}
        task_label: tuple[tuple[str, str], ...] = ()
        if len(held) == 1:
            task, scratchpad = next(iter(held))
            task_label = (("task", task),) + ((("scratchpad", scratchpad),) if scratchpad != "none" else ())
        pes = list(dict.fromkeys(cell.pos_encoding for cell in self.runs))
        return task_label + ((("pe", "_".join(pes)),) if pes and set(pes) != set(PAPER_PES) else ())

    @classmethod
    def parse(cls, data: dict[str, Any]) -> SyntheticGridResult:
        attention = {task: TaskAttention.parse(a) for task, a in data["attention"].items()}
        return cls(data["parent_run_id"], data["mrr"], data["ood"], data["tables"], attention,
                   [SyntheticCell.parse(r) for r in data["runs"]])
