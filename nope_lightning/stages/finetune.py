"""``finetune``: the RoPE baselines of paper 001 Table 2 — full fine-tuning at ``target_len`` with Position
Interpolation or YaRN (App. A: lr 1e-4, 200 steps, batch 8).

The RoPE scaling is s = ``target_len / original_len`` unless ``rope_scaling.factor`` gives another value,
with ``original_len`` = the model's ``train_len`` unless set. The model is trained with that scaling and
exported with it: the exported ``PretrainConfig.model.rope_scaling`` holds method, factor and original_len,
and its ``train_len`` stays the *original* pre-training length (RoPE scaling's reference length and what
evaluation's default lengths are multiples of), so ``load_model`` of the export rebuilds exactly the
fine-tuned model.

Token budget (App. A): ``fair`` trains ``steps`` x ``batch_size`` x ``target_len`` tokens per process, the
budget HeadScale uses with the same settings; ``raw`` trains ``raw_multiplier`` times as many steps (the
paper's 1000 steps vs 200). Outputs: ``<out_dir>/model`` (the export, also the MLflow artifact ``model``),
the MLflow run (tag ``stage=finetune``) with the config, ``train/loss``, ``val/len{T}/loss`` and ``…/ppl``,
and ``finetune/tokens``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer, seed_everything

from nope_lightning.config.core import load_config
from nope_lightning.config.parts import RopeScalingConfig
from nope_lightning.config.stages import FinetuneConfig, PretrainConfig
from nope_lightning.data.datamodule import PackedDataModule
from nope_lightning.data.prepare import PreparedData, prepare
from nope_lightning.data.retrieval import recipe_mix
from nope_lightning.model.checkpoint import CONFIG, LoadedModel, export_model, load_model, resolve_reference
from nope_lightning.runtime import tracking
from nope_lightning.training.budget import check_rope_model, check_target_len
from nope_lightning.training.module import CausalLM, check_tokenizer, trained_model
from nope_lightning.training.trainer import ResumableFit, check_strategy, fit_result_keys, resumable_fit

#: Sections that must match for a run to continue from the checkpoint in its out_dir.
RESUME_KEYS = ("checkpoint", "target_len", "rope_scaling", "data_mix", "budget", "raw_multiplier", "steps", "batch_size",
               "seed", "optim")


def target_scaling(cfg: FinetuneConfig, train_len: int) -> RopeScalingConfig:
    """``cfg.rope_scaling`` with original_len (default ``train_len``) and factor (default
    target_len / original_len) filled in."""
    original = cfg.rope_scaling.original_len or train_len
    factor = cfg.rope_scaling.factor if cfg.rope_scaling.factor != 1.0 else cfg.target_len / original
    return dataclasses.replace(cfg.rope_scaling, factor=factor, original_len=original)


def default_name(cfg: FinetuneConfig, base: PretrainConfig, folder: Path) -> str:
    return (f"finetune-{base.name or folder.parent.name}-{cfg.rope_scaling.method}-L{cfg.target_len}-"
            f"{cfg.budget}")


def trained_tokens(cfg: FinetuneConfig, trainer: Trainer) -> int:
    """Tokens trained on, over all processes: ``total_steps`` x ``batch_size`` x ``target_len`` per process."""
    return cfg.total_steps * cfg.batch_size * cfg.target_len * trainer.world_size


def run(cfg: FinetuneConfig) -> dict[str, Any]:
    check_strategy(cfg.trainer)
    folder = resolve_reference(cfg.checkpoint, cfg.tracking)
    base = load_config(PretrainConfig, folder / CONFIG)  # the architecture, checked before loading weights
    check_rope_model(base, cfg.checkpoint)
    check_target_len(base, cfg.target_len)
    scaling = target_scaling(cfg, base.train_len)
    loaded = load_model(str(folder), cfg.tracking, rope_scaling=scaling)
    prepared = prepare(loaded.config.data)
    check_tokenizer(prepared, loaded)

    name = cfg.name or default_name(cfg, base, folder)
    out = Path(cfg.out_dir or f"mlruns/checkpoints/finetune/{name}")
    with resumable_fit(out, cfg, RESUME_KEYS) as resumable:
        return train(cfg, resumable, loaded, prepared, scaling, name)


def train(cfg: FinetuneConfig, resumable: ResumableFit, loaded: LoadedModel, prepared: PreparedData,
          scaling: RopeScalingConfig, name: str) -> dict[str, Any]:
    """Fine-tune into ``resumable.out``, resuming its last checkpoint when a killed run of the same config left
    one, then export the model."""
    seed_everything(cfg.seed, workers=True, verbose=False)
    steps = cfg.total_steps
    module = CausalLM(loaded.model, cfg.optim, steps, cfg.trainer.compile)
    mix = recipe_mix(prepared.tokenizer, loaded.config.retrieval, cfg.target_len) if cfg.data_mix == "recipe" else None
    data = PackedDataModule(prepared, cfg.target_len, cfg.batch_size, cfg.seed, cfg.trainer.val_batches,
                            loaded.config.data.num_workers, mix)
    settings = {"finetune/steps": steps, "finetune/rope_factor": scaling.factor,
                "finetune/retrieval_fraction": mix.fraction if mix else 0.0}
    trainer = resumable.fit(module, data, stage="finetune", name=name, max_steps=steps,
                            metrics=lambda trainer: {"finetune/tokens": trained_tokens(cfg, trainer), **settings})
    model = trained_model(trainer, loaded.model)
    if not trainer.is_global_zero:
        return {}
    out, run_id, tokens = resumable.out, trainer.logger.run_id, trained_tokens(cfg, trainer)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    meta = {"step": trainer.global_step, "data_key": prepared.key, "run_id": run_id, "metrics": metrics,
            "finetune": {"base_checkpoint": cfg.checkpoint, "base_fingerprint": loaded.fingerprint,
                         "target_len": cfg.target_len, "rope_scaling": dataclasses.asdict(scaling),
                         "budget": cfg.budget, "steps": steps, "tokens": tokens, "data_mix": cfg.data_mix}}
    export = export_model(out / "model", model, dataclasses.replace(loaded.config, name=name),
                          loaded.tokenizer_file, meta)
    tracking.log_artifacts(cfg.tracking, run_id, export, "model")
    return {"run_id": run_id, "out_dir": str(out), "model": str(export), "step": trainer.global_step,
            "world_size": trainer.world_size, "tokens": tokens, "rope_scaling": dataclasses.asdict(scaling),
            **metrics}


# --- declared results: the registry's ``Stage.results`` (what a later step may reference; the dry run) ---


def result_keys(cfg: FinetuneConfig, train_len: int | None = None) -> dict[str, type]:
    """What ``train`` returns on rank 0 that a later step can use (its ``rope_scaling`` is a dict): the fit's
    results at ``target_len``, the exported model's folder and the tokens trained on."""
    return {**fit_result_keys(cfg.target_len), "model": str, "tokens": int}
