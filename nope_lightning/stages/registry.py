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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nope_lightning.config.core import Layer, load_config
from nope_lightning.runtime.tracking import check_store


@dataclass(frozen=True)
class Stage:
    """A stage: its config dataclass, its entry function and the declaration of its results, each as
    ``module:name`` (imported lazily). ``results`` is ``(config, train_len | None) -> {name: kind} | None``, in
    the stage's module beside the code that returns them; '' for a stage whose result names are only known
    once it ran.

    What a pipeline step of the stage needs to know, declared here so that no stage config grows a copy of a
    setting it already has (the synthetic grid's store is its cells' ``base.tracking``):

    - ``tracking``: the dotted key of the config's ``TrackingConfig``, which a pipeline sets to its store and
      parent run; '' for a stage that tracks nothing.
    - ``seed``: the config key that takes a replicate's seed (``seed`` trains one model at that seed), and
      ``seed_list``: whether it is a list of seeds (a grid's ``seeds``: ``[seed]`` runs its cells at that seed
      alone); '' for a stage that keeps its own seeds in every replicate (an evaluation's prompts, HeadScale's
      data order). ``seed_layer`` gives the seed as a typed config layer, never as text.
    - ``run``: the result key naming the run the stage started, when it is not ``run_id``: ``run_stage`` returns
      it as ``run_id`` too, the key by which a pipeline tags, records and reuses a step's run.
    """

    config: str
    entry: str
    summary: str
    results: str = ""
    tracking: str = "tracking"
    seed: str = ""
    seed_list: bool = False
    run: str = "run_id"

    def seed_layer(self, seed: int) -> dict[str, Any]:
        """The config layer that gives replicate ``seed`` to a stage with a (top-level) ``seed`` key:
        ``{"seed": 1234}``, ``{"seeds": [1234]}`` for a list."""
        return {self.seed: [seed] if self.seed_list else seed}

    def config_class(self) -> type:
        return _resolve(self.config)

    def function(self):
        return _resolve(self.entry)

    def result_keys(self, cfg: Any, train_len: int | None = None) -> dict[str, type] | None:
        """``name -> kind`` (str, int, float, bool) of what a run of this stage with ``cfg`` returns, on a model
        pre-trained at ``train_len`` tokens (None: not known), as a later step references it
        (``@{step.name}``); None when only known once it ran."""
        return _resolve(self.results)(cfg, train_len) if self.results else None


def _resolve(ref: str):
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def _stage(module: str, config: str, summary: str, declared: bool = True, **pipeline: Any) -> Stage:
    """The stage whose ``run`` and ``result_keys`` live in ``nope_lightning.stages.<module>``; ``pipeline``:
    its ``tracking``, ``seed``, ``seed_list`` and ``run`` where they differ from the defaults."""
    where = f"nope_lightning.stages.{module}"
    return Stage(config, f"{where}:run", summary, f"{where}:result_keys" if declared else "", **pipeline)


STAGES: dict[str, Stage] = {
    "prepare": _stage("prepare", "nope_lightning.config:PrepareConfig",
                      "tokenizer + packed token files for a corpus (cached)", tracking=""),
    "pretrain": _stage("pretrain", "nope_lightning.config:PretrainConfig",
                       "causal LM from scratch with a chosen position encoding", seed="seed"),
    "evaluate": _stage("evaluate", "nope_lightning.config:EvaluateConfig",
                       "PPL, per-position curves, attention entropy, passkey, long-context tasks"),
    "scale-search": _stage("scale_search", "nope_lightning.config:ScaleSearchConfig",
                           "Optuna grid over a uniform temperature per target length; lambda = 1 + a ln s fit"),
    "headscale": _stage("headscale", "nope_lightning.config:HeadScaleConfig",
                        "per-head temperatures (n_layer x n_head) on a frozen model, focus constraint"),
    "headscale-search": _stage("headscale_search", "nope_lightning.config:HeadScaleSearchConfig",
                               "Optuna TPE over HeadScale's init and lr, pruned on validation loss",
                               tracking="base.tracking"),
    "finetune": _stage("finetune", "nope_lightning.config:FinetuneConfig",
                       "RoPE baselines: full PI / YaRN fine-tuning at the target length"),
    "synthetic": _stage("synthetic", "nope_lightning.config:SyntheticConfig",
                        "paper-002 task suite: one (task, PE, seed), exact match per length bucket",
                        seed="seed"),
    "synthetic-grid": _stage("synthetic_grid", "nope_lightning.config:SyntheticGridConfig",
                             "tasks x PEs x seeds under one parent run: OOD table, MRR (ties averaged)",
                             declared=False, tracking="base.tracking", seed="seeds", seed_list=True,
                             run="parent_run_id"),
    "import": _stage("import_model", "nope_lightning.config:ImportConfig",
                     "a Hugging Face Llama folder (e.g. paper 001's released models) as an export folder",
                     tracking=""),
    "export": _stage("export_model", "nope_lightning.config:ExportConfig",
                     "one of our models as a Hugging Face Llama folder (lambdas folded into the queries)"),
    "pipeline": Stage("nope_lightning.config:PipelineConfig", "nope_lightning.pipeline.runner:run",
                      "an experiment file: stages chained through MLflow, resumable, one parent run",
                      "nope_lightning.pipeline.runner:result_keys"),
    "report": _stage("report", "nope_lightning.config:ReportConfig",
                     "markdown tables + PNG plots of a pipeline run, papers' numbers beside ours"),
}


def get_stage(name: str) -> Stage:
    if name not in STAGES:
        close = difflib.get_close_matches(name, STAGES, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"unknown stage {name!r}; {hint}stages: {', '.join(STAGES)}")
    return STAGES[name]


def stage_config(name: str, yaml_path: str | None = None, overrides: list[str] | tuple[str, ...] = (), *,
                 layers: Sequence[Layer] = ()) -> Any:
    """The validated config of stage ``name`` (defaults <- YAML <- ``layers`` <- overrides: ``load_config``)."""
    return load_config(get_stage(name).config_class(), yaml_path, overrides, layers=layers)


def run_stage(name: str, cfg: Any, **extra: Any) -> dict[str, Any]:
    """Run stage ``name`` with a validated config; returns the stage's result summary. ``extra`` goes to the
    stage's entry as keyword arguments (a search's trial passes its Optuna pruning callback this way)."""
    stage = get_stage(name)
    if not isinstance(cfg, stage.config_class()):
        raise TypeError(f"stage {name} takes a {stage.config}, got {type(cfg).__name__}")
    check_store(cfg)  # seconds and one line for an unusable store, before any data or compute
    result = stage.function()(cfg, **extra)
    return result if stage.run == "run_id" else {**result, "run_id": result[stage.run]}
