"""What a training config implies before any compute, shared by the stages and the pipeline's dry run: the
tokens a run reads, a pre-training's step budget from ``tokens_per_parameter`` and its out_dir, and the checks of
a length-extension target and of a fine-tune's base model. Configs in, numbers and one-line errors out: nothing
here builds a model (the parameter count is taken on the meta device) or touches data."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from nope_lightning.config.parts import TrainerConfig
from nope_lightning.config.stages import PretrainConfig
from nope_lightning.data.corpus import corpus_label
from nope_lightning.model.gpt import non_embedding_parameters


def training_tokens(trainer: TrainerConfig, steps: int, batch_size: int, length: int) -> int:
    """Tokens a training run reads: optimizer steps x per-process batch x processes x accumulation x length."""
    return steps * batch_size * trainer.devices * trainer.num_nodes * trainer.accumulate_grad_batches * length


def default_name(cfg: PretrainConfig) -> str:
    """``pretrain-<pe>[-ssmax]-<corpus>-L<train_len>-s<seed>``: replicates of one recipe (seeds) never share
    an out_dir; other differences need their own ``name=`` (a resumed out_dir refuses another config)."""
    corpus = corpus_label(cfg.data.corpus)
    ssmax = "-ssmax" if cfg.model.ssmax else ""
    return f"pretrain-{cfg.model.pos_encoding}{ssmax}-{corpus}-L{cfg.train_len}-s{cfg.seed}"


def with_budget(cfg: PretrainConfig) -> PretrainConfig:
    """``cfg`` with ``trainer.max_steps`` set from ``tokens_per_parameter`` (when given): that many tokens per
    non-embedding parameter, in whole steps; one line when the budget rounds to no step at all."""
    if cfg.tokens_per_parameter is None:
        return cfg
    parameters = non_embedding_parameters(cfg.model, cfg.train_len)
    per_step = training_tokens(cfg.trainer, 1, cfg.batch_size, cfg.train_len)
    steps = round(cfg.tokens_per_parameter * parameters / per_step)
    if steps < 1:
        raise ValueError(f"tokens_per_parameter={cfg.tokens_per_parameter:g} x {parameters} non-embedding parameters "
                         f"is less than one optimizer step of {per_step} tokens: a token budget of 0; raise it")
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, max_steps=steps))


def output_dir(cfg: PretrainConfig) -> Path:
    return Path(cfg.out_dir or f"mlruns/checkpoints/pretrain/{cfg.name or default_name(cfg)}")


def check_target_len(cfg: PretrainConfig, target_len: int) -> None:
    """``target_len`` must extend the model (> train_len) and fit it (<= model.max_positions)."""
    if target_len <= cfg.train_len:
        raise ValueError(f"target_len={target_len} must exceed the model's train_len={cfg.train_len}: "
                         f"length extension tunes for sequences longer than pre-training's")
    if target_len > cfg.model.max_positions:
        raise ValueError(f"target_len={target_len} exceeds the model's max_positions={cfg.model.max_positions}")


def check_rope_model(cfg: PretrainConfig, ref: str) -> None:
    """Only a RoPE model without a scaling of its own can be fine-tuned with PI/YaRN."""
    model = cfg.model
    if model.pos_encoding != "rope":
        raise ValueError(f"checkpoint={ref} is a {model.pos_encoding} model; finetune extends RoPE models with "
                         f"PI/YaRN (extend a NoPE model with the headscale stage or evaluate extension.temperature.uniform=)")
    if model.rope_scaling.method != "none":
        raise ValueError(f"checkpoint={ref} already uses rope_scaling={model.rope_scaling.method} "
                         f"(factor {model.rope_scaling.factor:g}); fine-tune the original RoPE export instead")
