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
from typing import TYPE_CHECKING, Any

from nope_lightning import tracking
from nope_lightning.checkpoint import CONFIG, LoadedModel, export_model, load_model, resolve_reference
from nope_lightning.config import FinetuneConfig, PretrainConfig, RopeScalingConfig, load_config
from nope_lightning.stages.lm import (
    check_resumable,
    check_target_len,
    check_tokenizer,
    checkpoint_callback,
    out_dir_lock,
    record_run,
    resumed_run_id,
    trained_model,
)

#: Sections that must match for a run to continue from the checkpoint in its out_dir.
RESUME_KEYS = ("checkpoint", "target_len", "rope_scaling", "budget", "raw_multiplier", "steps", "batch_size", "seed",
               "optim")

if TYPE_CHECKING:
    from nope_lightning.data import PreparedData


def check_rope_model(cfg: PretrainConfig, ref: str) -> None:
    """Only a RoPE model without a scaling of its own can be fine-tuned with PI/YaRN."""
    model = cfg.model
    if model.pos_encoding != "rope":
        raise ValueError(f"checkpoint={ref} is a {model.pos_encoding} model; finetune extends RoPE models with "
                         f"PI/YaRN (extend a NoPE model with the headscale stage or evaluate extension.temperature=)")
    if model.rope_scaling.method != "none":
        raise ValueError(f"checkpoint={ref} already uses rope_scaling={model.rope_scaling.method} "
                         f"(factor {model.rope_scaling.factor:g}); fine-tune the original RoPE export instead")


def target_scaling(cfg: FinetuneConfig, train_len: int) -> RopeScalingConfig:
    """``cfg.rope_scaling`` with original_len (default ``train_len``) and factor (default
    target_len / original_len) filled in."""
    original = cfg.rope_scaling.original_len or train_len
    factor = cfg.rope_scaling.factor if cfg.rope_scaling.factor != 1.0 else cfg.target_len / original
    return dataclasses.replace(cfg.rope_scaling, factor=factor, original_len=original)


def default_name(cfg: FinetuneConfig, base: PretrainConfig, folder: Path) -> str:
    return (f"finetune-{base.name or folder.parent.name}-{cfg.rope_scaling.method}-L{cfg.target_len}-"
            f"{cfg.budget}")


def run(cfg: FinetuneConfig) -> dict[str, Any]:
    from nope_lightning.data import prepare
    from nope_lightning.run import check_strategy

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
    with out_dir_lock(out):
        return train(cfg, loaded, prepared, base, scaling, name, out)


def train(cfg: FinetuneConfig, loaded: LoadedModel, prepared: PreparedData, base: PretrainConfig, scaling: RopeScalingConfig, name: str,
          out: Path) -> dict[str, Any]:
    """Fine-tune into ``out``, resuming its last checkpoint when a killed run of the same config left one."""
    from lightning.pytorch import seed_everything
    from lightning.pytorch.utilities import rank_zero_only

    from nope_lightning.data import PackedDataModule
    from nope_lightning.run import build_trainer
    from nope_lightning.stages.lm import CausalLM

    resume_from = check_resumable(out, cfg, RESUME_KEYS)
    run_id = resumed_run_id(out, cfg, resume_from)
    seed_everything(cfg.seed, workers=True, verbose=False)
    steps = cfg.total_steps
    module = CausalLM(loaded.model, cfg.optim, steps, cfg.trainer.compile)
    data = PackedDataModule(prepared, cfg.target_len, cfg.batch_size, cfg.seed, cfg.trainer.val_batches,
                            loaded.config.data.num_workers)
    logger = tracking.lightning_logger(cfg.tracking, "finetune", name, run_id)
    checkpoints = checkpoint_callback(out, cfg.trainer.checkpoint_every_n_steps, steps)
    trainer = build_trainer(cfg.trainer, logger=logger, callbacks=[checkpoints], default_root_dir=str(out),
                            grad_clip=cfg.optim.grad_clip, max_steps=steps)
    tokens = steps * cfg.batch_size * cfg.target_len * trainer.world_size
    if rank_zero_only.rank == 0:
        record_run(out, cfg, logger.run_id)
        if run_id is None:
            tracking.log_config(cfg.tracking, logger.run_id, cfg)
            tracking.log_metrics(cfg.tracking, logger.run_id, {"finetune/tokens": tokens, "finetune/steps": steps,
                                                                "finetune/rope_factor": scaling.factor})
    trainer.fit(module, datamodule=data, ckpt_path=resume_from, weights_only=True)
    model = trained_model(trainer, loaded.model)
    if not trainer.is_global_zero:
        return {}
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    meta = {"step": trainer.global_step, "data_key": prepared.key, "run_id": logger.run_id, "metrics": metrics,
            "finetune": {"base_checkpoint": cfg.checkpoint, "base_fingerprint": loaded.fingerprint,
                         "target_len": cfg.target_len, "rope_scaling": dataclasses.asdict(scaling),
                         "budget": cfg.budget, "steps": steps, "tokens": tokens}}
    export = export_model(out / "model", model, dataclasses.replace(loaded.config, name=name),
                          loaded.tokenizer_file, meta)
    tracking.log_artifacts(cfg.tracking, logger.run_id, export, "model")
    return {"run_id": logger.run_id, "out_dir": str(out), "model": str(export), "step": trainer.global_step,
            "world_size": trainer.world_size, "tokens": tokens, "rope_scaling": dataclasses.asdict(scaling),
            **metrics}
