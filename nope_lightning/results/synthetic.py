"""The synthetic tasks' results (Kazemnejad et al. 2023): one (task, position encoding, seed) cell
(``synthetic``'s ``results.json``) and the grid's aggregate (``synthetic-grid``'s ``results.json``).
Accuracies are exact match in [0, 1], lengths the task's own (e.g. digits), times in seconds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nope_lightning.results.core import ResultFile, int_keys


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


@dataclass(frozen=True)
class SyntheticCell(ResultFile):
    """One trained and evaluated (task, PE, seed): ID and OOD accuracy of the weights selected on ID
    validation (``best_val_acc`` at ``best_step`` of ``steps``), per length bucket, and the first failures."""

    KIND = "synthetic"

    run_id: str
    task: str
    pos_encoding: str
    seed: int
    scratchpad: bool
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

    def body(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("run_id", "task", "pos_encoding", "seed", "scratchpad",
                                             "train_max_len", "test_max_len", "id_acc", "ood_acc", "best_val_acc",
                                             "best_step", "steps", "train_seconds", "eval_seconds", "parameters")}
        return {**out, "buckets": [vars(b) for b in self.buckets], "errors": [vars(e) for e in self.errors]}

    @classmethod
    def parse(cls, data: dict[str, Any]) -> SyntheticCell:
        fields = {k: v for k, v in data.items() if k not in ("version", "buckets", "errors")}
        return cls(**fields, buckets=[BucketAccuracy(**b) for b in data["buckets"]],
                   errors=[Failure(**e) for e in data.get("errors", [])])


@dataclass(frozen=True)
class TaskAttention:
    """One task's attention analysis, per PE (its paper name): the layer-mean min-head JSD to NoPE (nats) per
    length, the same per layer, and the attended-distance histogram over ``edges``."""

    jsd: dict[str, dict[int, float]]
    jsd_by_layer: dict[str, dict[int, list[float]]]
    hist: dict[str, list[int]]
    edges: list[float]


@dataclass(frozen=True)
class SyntheticGridResult(ResultFile):
    """The grid: the PEs' mean reciprocal rank, the mean OOD accuracy per task and PE, the markdown tables
    (``ood``, ``id``), the attention analysis per task and every cell (without its failures)."""

    KIND = "synthetic-grid"

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

    @classmethod
    def parse(cls, data: dict[str, Any]) -> SyntheticGridResult:
        attention = {task: TaskAttention({pe: int_keys(v) for pe, v in a["jsd"].items()},
                                         {pe: int_keys(v) for pe, v in a["jsd_by_layer"].items()}, a["hist"],
                                         a["edges"])
                     for task, a in data["attention"].items()}
        return cls(data["parent_run_id"], data["mrr"], data["ood"], data["tables"], attention,
                   [SyntheticCell.parse(r) for r in data["runs"]])
