"""``pretrain``: a causal LM trained from scratch at ``train_len`` with the chosen position encoding.

Outputs, under ``out_dir`` (default ``mlruns/checkpoints/pretrain/<name>``):
``checkpoints/step*.ckpt`` (periodic) and ``checkpoints/last.ckpt`` (resume), ``config.yaml`` (the resolved
config), ``mlflow_run_id`` (a resumed run continues the same MLflow run) and ``model/`` (the export:
safetensors + config + tokenizer, also logged as the MLflow artifact ``model``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from nope_lightning import tracking
from nope_lightning.checkpoint import export_model, torch_load
from nope_lightning.config import PretrainConfig, flatten, load_config, to_dict, to_yaml

#: Sections that must match for a run to continue from a checkpoint (max_steps may grow, tracking may move).
RESUME_KEYS = ("model", "data", "optim", "train_len", "batch_size", "seed")


def default_name(cfg: PretrainConfig) -> str:
    corpus = Path(cfg.data.corpus).name or "corpus"
    return f"pretrain-{cfg.model.pos_encoding}-{corpus}-L{cfg.train_len}"


def output_dir(cfg: PretrainConfig) -> Path:
    return Path(cfg.out_dir or f"mlruns/checkpoints/pretrain/{cfg.name or default_name(cfg)}")


def config_differences(saved: PretrainConfig, cfg: PretrainConfig) -> list[str]:
    """Flattened keys under ``RESUME_KEYS`` whose values differ between two configs."""
    a, b = flatten(to_dict(saved)), flatten(to_dict(cfg))
    return sorted(k for k in b if k.split(".")[0] in RESUME_KEYS and a.get(k) != b[k])


def check_resumable(out: Path, cfg: PretrainConfig) -> Path | None:
    """The checkpoint to resume from, or None for a fresh run; raises before any compute when the folder
    holds a run with another config, a corrupt checkpoint, or a run that ``resume=false`` would overwrite.
    """
    last = out / "checkpoints" / "last.ckpt"
    if not last.exists():
        return None
    if not cfg.resume:
        raise ValueError(f"{out} already holds a run; set resume=true to continue it, or choose another "
                         f"name=/out_dir= (nothing was overwritten)")
    saved = load_config(PretrainConfig, out / "config.yaml")
    diff = config_differences(saved, cfg)
    if diff:
        raise ValueError(f"checkpoint {last} comes from another config (differs in {', '.join(diff[:6])}); "
                         f"use another name=/out_dir= for the new config")
    torch_load(last)  # a corrupt file fails here, with a clear message, before anything starts
    return last


def run(cfg: PretrainConfig) -> dict[str, Any]:
    from lightning.pytorch import seed_everything
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.utilities import rank_zero_only

    from nope_lightning.data import PackedDataModule, prepare
    from nope_lightning.model import GPT, count_parameters
    from nope_lightning.run import build_trainer, check_strategy
    from nope_lightning.stages.lm import CausalLM

    check_strategy(cfg.trainer)
    name = cfg.name or default_name(cfg)
    out = output_dir(cfg)
    resume_from = check_resumable(out, cfg)
    prepared = prepare(cfg.data)

    seed_everything(cfg.seed, workers=True, verbose=False)
    model = GPT(cfg.model, prepared.tokenizer.vocab_size, cfg.train_len)
    module = CausalLM(model, cfg.optim, cfg.trainer.max_steps, cfg.trainer.compile)
    data = PackedDataModule(prepared, cfg.train_len, cfg.batch_size, cfg.seed, cfg.trainer.val_batches,
                            cfg.data.num_workers)

    run_id_file = out / "mlflow_run_id"
    run_id = run_id_file.read_text().strip() if resume_from and run_id_file.exists() else None
    logger = tracking.lightning_logger(cfg.tracking, "pretrain", name, run_id)
    if rank_zero_only.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(to_yaml(cfg))
        run_id_file.write_text(logger.run_id)
        if resume_from is None:
            tracking.log_config(cfg.tracking, logger.run_id, cfg)
        tracking.log_metrics(cfg.tracking, logger.run_id, {"model/parameters": count_parameters(model)})

    every = cfg.trainer.checkpoint_every_n_steps
    checkpoints = ModelCheckpoint(dirpath=out / "checkpoints", filename="step{step:06d}", save_last=True,
                                  every_n_train_steps=every or cfg.trainer.max_steps, save_top_k=-1,
                                  auto_insert_metric_name=False)
    trainer = build_trainer(cfg.trainer, logger=logger, callbacks=[checkpoints], grad_clip=cfg.optim.grad_clip)
    trainer.fit(module, datamodule=data, ckpt_path=resume_from, weights_only=True)

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    result = {"run_id": logger.run_id if trainer.is_global_zero else None, "out_dir": str(out),
              "step": trainer.global_step, "world_size": trainer.world_size, **metrics}
    if trainer.is_global_zero:
        export = export_model(out / "model", model, dataclasses.replace(cfg, name=name),
                              prepared.root / "tokenizer.json",
                              {"step": trainer.global_step, "data_key": prepared.key,
                               "run_id": logger.run_id, "metrics": metrics})
        tracking.log_artifacts(cfg.tracking, logger.run_id, export, "model")
        result["model"] = str(export)
    return result
