"""The one place a Lightning ``Trainer`` is built, and the stage dispatcher every entry point goes through.

The CLI, Optuna objectives, pipelines and tests all call ``run_stage(name, cfg)``, so a search trial is
exactly a CLI run with overrides and can be replayed from the command line.
"""

from __future__ import annotations

import difflib
import importlib
import os
from dataclasses import dataclass
from typing import Any

from nope_lightning.config import TrainerConfig, load_config


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
                            "nope_lightning.stages.synthetic:run_grid",
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
    from nope_lightning.tracking import check_store

    check_store(cfg)  # seconds and one line for an unusable store, before any data or compute
    return stage.function()(cfg)


def configure_threads(cfg: TrainerConfig) -> int:
    """Set torch's intra-op threads: ``cfg.threads``, or for 0 the CPU cores shared out among the processes.

    Measured on 2 cores with the small model (``experiments/benchmark_pretrain.py``, README): one process
    trains faster on 2 threads than on 1, and 2 DDP processes x 1 thread are faster still; so ``threads=0``
    gives each of the ``devices`` processes ``cores // devices`` threads. GPU runs keep torch's default.
    """
    import torch

    threads = cfg.threads
    if threads == 0:
        if _uses_gpu(cfg):
            return torch.get_num_threads()
        threads = max(1, (os.cpu_count() or 1) // cfg.devices)
    torch.set_num_threads(threads)
    return threads


def _uses_gpu(cfg: TrainerConfig) -> bool:
    import torch

    return cfg.accelerator in ("gpu", "cuda") or (cfg.accelerator == "auto" and torch.cuda.is_available())


#: What FSDP2's ``MixedPrecisionPolicy`` expresses: fp32 throughout, or bf16 compute over fp32 master weights.
FSDP2_PRECISIONS = ("32-true", "bf16-mixed")


def check_strategy(cfg: TrainerConfig) -> None:
    """Fail before any compute on a strategy this machine cannot run."""
    import torch

    if cfg.strategy == "fsdp" and not (_uses_gpu(cfg) and torch.cuda.is_available()):
        raise ValueError("trainer.strategy=fsdp needs CUDA GPUs (it is Lightning's FSDP1); on CPU use "
                         "trainer.strategy=fsdp2 (FSDP2 runs on gloo) or ddp, with trainer.devices=2")
    if cfg.strategy == "fsdp2" and cfg.precision not in FSDP2_PRECISIONS:
        raise ValueError(f"trainer.strategy=fsdp2 takes trainer.precision={' or '.join(FSDP2_PRECISIONS)} "
                         f"(bf16-mixed: bf16 compute, fp32 weights and gradient reduction), not {cfg.precision}")
    if cfg.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError(f"trainer.accelerator={cfg.accelerator} but no CUDA GPU is visible; use accelerator=cpu")


def _strategy(cfg: TrainerConfig):
    if cfg.strategy == "fsdp2":
        from nope_lightning.stages.lm import FSDP2Strategy

        return FSDP2Strategy(cfg.devices * cfg.num_nodes, cfg.activation_checkpointing,
                             bf16=cfg.precision == "bf16-mixed")
    if cfg.strategy != "fsdp":
        return cfg.strategy
    from lightning.pytorch.strategies import FSDPStrategy

    from nope_lightning.model.attention import Block

    # One FSDP unit per transformer block; orig params so frozen (HeadScale) and trainable tensors mix.
    return FSDPStrategy(auto_wrap_policy={Block},
                        activation_checkpointing_policy={Block} if cfg.activation_checkpointing else None,
                        state_dict_type="full", use_orig_params=True, sharding_strategy="FULL_SHARD")


def _precision(cfg: TrainerConfig) -> str:
    # Under fsdp2, bf16-mixed is FSDP2's MixedPrecisionPolicy (FSDP2Strategy.shard), not Lightning's autocast:
    # parameters are all-gathered in bf16, so every matmul already runs in bf16.
    return "32-true" if cfg.strategy == "fsdp2" else cfg.precision


def build_trainer(cfg: TrainerConfig, *, logger: Any = None, callbacks: list | None = None,
                  default_root_dir: str | None = None, grad_clip: float = 0.0, max_steps: int | None = None,
                  enable_checkpointing: bool = True):
    """A ``lightning.pytorch.Trainer`` from ``TrainerConfig``: step-based, no epochs, no sanity check.

    Validation runs every ``val_every_n_steps`` optimizer steps (0: only at the end) on ``val_batches``.
    With ``progress_bar`` on, progress goes to stderr in optimizer steps (``progress.StepProgressBar``).
    """
    from lightning.pytorch import Trainer

    from nope_lightning.progress import StepProgressBar

    check_strategy(cfg)
    configure_threads(cfg)
    steps = max_steps or cfg.max_steps
    val_every = cfg.val_every_n_steps if 0 < cfg.val_every_n_steps < steps else steps
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return Trainer(
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        num_nodes=cfg.num_nodes,
        strategy=_strategy(cfg),
        precision=_precision(cfg),
        max_steps=steps,
        max_epochs=-1,
        val_check_interval=val_every,
        check_val_every_n_epoch=None,
        limit_val_batches=cfg.val_batches,
        num_sanity_val_steps=0,
        log_every_n_steps=cfg.log_every_n_steps,
        gradient_clip_val=grad_clip or None,
        accumulate_grad_batches=cfg.accumulate_grad_batches,
        enable_progress_bar=cfg.progress_bar,
        enable_model_summary=False,
        enable_checkpointing=enable_checkpointing,
        use_distributed_sampler=False,  # our data modules shard by rank themselves
        logger=logger if logger is not None else False,
        callbacks=[*(callbacks or []), *([StepProgressBar()] if cfg.progress_bar else [])],
        default_root_dir=default_root_dir,
    )
