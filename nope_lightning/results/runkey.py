"""Where a run sits in a pipeline: its method, replicate seed, matrix point, stage and step — one record, written
as MLflow tags by the pipeline and read back from them by the report with the same code.

Tags (the names runs have carried since pipelines first tagged them, so older stores read the same):
``method`` (the step's label, else its id), ``seed`` (absent without ``seeds``), ``matrix.<key>`` per matrix
value, ``stage``, ``step_id`` and ``pipeline_step`` (the instance id, ``eval_nope[n_layer=2,seed=1234]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MATRIX = "matrix."


@dataclass(frozen=True)
class RunKey:
    """``method`` at replicate ``seed`` (None: no ``seeds``) and matrix ``point`` ((key, value) pairs, the file's
    key order), run by step ``step`` of stage ``stage``."""

    method: str
    seed: int | None = None
    point: tuple[tuple[str, str], ...] = ()
    stage: str = ""
    step: str = ""

    @property
    def suffix(self) -> str:
        """``[n_layer=2,seed=1234]``, or '' without seed and matrix point."""
        parts = [f"{k}={v}" for k, v in self.point] + ([f"seed={self.seed}"] if self.seed is not None else [])
        return f"[{','.join(parts)}]" if parts else ""

    @property
    def instance(self) -> str:
        """The instance id: the step id plus the suffix (the bare step id without seed and matrix)."""
        return f"{self.step}{self.suffix}"

    def tags(self) -> dict[str, str]:
        """The MLflow tags that place the run (empty fields are left out)."""
        tags = {"method": self.method, "stage": self.stage, "step_id": self.step, "pipeline_step": self.instance}
        tags = {k: v for k, v in tags.items() if v}
        if self.seed is not None:
            tags["seed"] = str(self.seed)
        tags.update({f"{MATRIX}{k}": v for k, v in self.point})
        return tags

    @classmethod
    def from_tags(cls, tags: Mapping[str, str], name: str = "") -> RunKey:
        """The key ``tags()`` wrote; matrix keys in sorted order (tags keep none). A run no pipeline tagged has
        no ``method``: its run ``name`` stands in."""
        point = tuple(sorted((k.removeprefix(MATRIX), v) for k, v in tags.items() if k.startswith(MATRIX)))
        seed = tags.get("seed")
        return cls(method=tags.get("method") or name, seed=None if seed is None else int(seed), point=point,
                   stage=tags.get("stage", ""), step=tags.get("step_id", ""))
