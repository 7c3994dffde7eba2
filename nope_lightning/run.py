"""The stage registry and dispatcher every entry point goes through.

The CLI, Optuna objectives, pipelines and tests all call ``run_stage(name, cfg)``, so a search trial is
exactly a CLI run with overrides and can be replayed from the command line. Stages are named by
``module:name`` strings and imported only when used: reading a config needs no torch or Lightning, and the
stage modules (which call ``run_stage`` themselves, e.g. a pipeline) import this module without a circle.
The Trainer is built in ``training.trainer``.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import Any

from nope_lightning.config import load_config
from nope_lightning.tracking import check_store


@dataclass(frozen=True)
class Stage:
    """A stage: its config dataclass and its entry function, both as ``module:name`` (imported lazily)."""

    config: str
    entry: str
    summary: str

    def config_class(self) -> type:
        return _resolve(self.config)

    def function(self):
        return _resolve(self.entry)


def _resolve(ref: str):
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


STAGES: dict[str, Stage] = {
    "prepare": Stage("nope_lightning.config:PrepareConfig", "nope_lightning.stages.prepare:run",
                     "tokenizer + packed token files for a corpus (cached)"),
    "pretrain": Stage("nope_lightning.config:PretrainConfig", "nope_lightning.stages.pretrain:run",
                      "causal LM from scratch with a chosen position encoding"),
    "evaluate": Stage("nope_lightning.config:EvaluateConfig", "nope_lightning.stages.evaluate:run",
                      "PPL, per-position curves, attention entropy, passkey, long-context tasks"),
    "scale-search": Stage("nope_lightning.config:ScaleSearchConfig", "nope_lightning.stages.scale_search:run",
                          "Optuna grid over a uniform temperature per target length; lambda = 1 + a ln s fit"),
    "headscale": Stage("nope_lightning.config:HeadScaleConfig", "nope_lightning.stages.headscale:run",
                       "per-head temperatures (n_layer x n_head) on a frozen model, focus constraint"),
    "headscale-search": Stage("nope_lightning.stages.headscale_search:HeadScaleSearchConfig",
                              "nope_lightning.stages.headscale_search:run",
                              "Optuna TPE over HeadScale's init and lr, pruned on validation loss"),
    "finetune": Stage("nope_lightning.config:FinetuneConfig", "nope_lightning.stages.finetune:run",
                      "RoPE baselines: full PI / YaRN fine-tuning at the target length"),
    "synthetic": Stage("nope_lightning.synthetic.config:SyntheticConfig", "nope_lightning.stages.synthetic:run",
                       "paper-002 task suite: one (task, PE, seed), exact match per length bucket"),
    "synthetic-grid": Stage("nope_lightning.synthetic.config:SyntheticGridConfig",
                            "nope_lightning.stages.synthetic_grid:run",
                            "tasks x PEs x seeds under one parent run: OOD table, MRR (ties averaged)"),
    "pipeline": Stage("nope_lightning.config:PipelineConfig", "nope_lightning.stages.pipeline:run",
                      "an experiment file: stages chained through MLflow, resumable, one parent run"),
    "report": Stage("nope_lightning.config:ReportConfig", "nope_lightning.stages.report:run",
                    "markdown tables + PNG plots of a pipeline run, papers' numbers beside ours"),
}


def get_stage(name: str) -> Stage:
    if name not in STAGES:
        close = difflib.get_close_matches(name, STAGES, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"unknown stage {name!r}; {hint}stages: {', '.join(STAGES)}")
    return STAGES[name]


def stage_config(name: str, yaml_path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """The validated config of stage ``name`` (defaults <- YAML <- overrides)."""
    return load_config(get_stage(name).config_class(), yaml_path, overrides)


def run_stage(name: str, cfg: Any) -> dict[str, Any]:
    """Run stage ``name`` with a validated config; returns the stage's result summary."""
    stage = get_stage(name)
    if not isinstance(cfg, stage.config_class()):
        raise TypeError(f"stage {name} takes a {stage.config}, got {type(cfg).__name__}")
    check_store(cfg)  # seconds and one line for an unusable store, before any data or compute
    return stage.function()(cfg)
