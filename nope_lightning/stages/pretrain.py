"""``pretrain``: a causal LM trained from scratch at ``train_len`` with the chosen position encoding.

Outputs, under ``out_dir`` (default ``mlruns/checkpoints/pretrain/<name>``):
``checkpoints/step*.ckpt`` (periodic) and ``checkpoints/last.ckpt`` (resume), ``config.yaml`` (the resolved
config), ``mlflow_run_id`` (a resumed run continues the same MLflow run) and ``model/`` (the export:
safetensors + config + tokenizer, also logged as the MLflow artifact ``model``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lightning.pytorch import seed_everything

from nope_lightning.config.stages import PretrainConfig
from nope_lightning.data.datamodule import PackedDataModule
from nope_lightning.data.prepare import prepare
from nope_lightning.data.retrieval import recipe_mix
from nope_lightning.model.checkpoint import export_model
from nope_lightning.model.gpt import GPT, count_parameters, non_embedding_parameters
from nope_lightning.runtime import tracking
from nope_lightning.training.budget import default_name, output_dir, training_tokens, with_budget
from nope_lightning.training.module import CausalLM, trained_model
from nope_lightning.training.trainer import ResumableFit, check_strategy, fit_result_keys, resumable_fit

#: Sections that must match for a run to continue from a checkpoint (max_steps may grow, tracking may move).
RESUME_KEYS = ("model", "data", "optim", "retrieval", "train_len", "batch_size", "seed")


def run(cfg: PretrainConfig) -> dict[str, Any]:
    check_strategy(cfg.trainer)
    cfg = with_budget(cfg)
    with resumable_fit(output_dir(cfg), cfg, RESUME_KEYS, cfg.resume) as resumable:
        return train(cfg, resumable)


def train(cfg: PretrainConfig, resumable: ResumableFit) -> dict[str, Any]:
    """Train into ``resumable.out`` (resuming its checkpoint, if any), then export the model."""
    name, out = cfg.name or default_name(cfg), resumable.out
    prepared = prepare(cfg.data)

    seed_everything(cfg.seed, workers=True, verbose=False)
    model = GPT(cfg.model, prepared.tokenizer.vocab_size, cfg.train_len)
    module = CausalLM(model, cfg.optim, cfg.trainer.max_steps, cfg.trainer.compile)
    data = PackedDataModule(prepared, cfg.train_len, cfg.batch_size, cfg.seed, cfg.trainer.val_batches,
                            cfg.data.num_workers, recipe_mix(prepared.tokenizer, cfg.retrieval, cfg.train_len))

    trainer = resumable.fit(module, data, stage="pretrain", name=name, max_steps=cfg.trainer.max_steps,
                            metrics=lambda _: {"model/parameters": count_parameters(model),
                                               "model/non_embedding_parameters": non_embedding_parameters(
                                                   cfg.model, cfg.train_len),
                                               "train/tokens": training_tokens(cfg.trainer, cfg.trainer.max_steps,
                                                                               cfg.batch_size, cfg.train_len)})
    trained = trained_model(trainer, model)  # every rank: under FSDP the shards are gathered here

    run_id = trainer.logger.run_id if trainer.is_global_zero else None
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    result = {"run_id": run_id, "out_dir": str(out),
              "step": trainer.global_step, "world_size": trainer.world_size, **metrics}
    if trainer.is_global_zero:
        export = export_model(out / "model", trained, dataclasses.replace(cfg, name=name),
                              prepared.root / "tokenizer.json",
                              {"step": trainer.global_step, "data_key": prepared.key,
                               "run_id": run_id, "metrics": metrics})
        tracking.log_artifacts(cfg.tracking, run_id, export, "model")
        result["model"] = str(export)
    return result


# --- declared results: the registry's ``Stage.results`` (what a later step may reference; the dry run) ---


def result_keys(cfg: PretrainConfig, train_len: int | None = None) -> dict[str, type]:
    """What ``train`` returns on rank 0: the fit's results at ``train_len`` and the exported model's folder."""
    return {**fit_result_keys(cfg.train_len), "model": str}
