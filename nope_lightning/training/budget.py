"""What a training config implies before any compute, shared by the stages and the pipeline's dry run: the
tokens a run reads, a pre-training's step budget from ``tokens_per_parameter`` and its out_dir, and the checks of
a length-extension target and of a fine-tune's base model. Configs in, numbers and one-line errors out: nothing
here builds a model (the parameter count is taken on the meta device) or touches data."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from nope_lightning.config.parts import ModelConfig, TrainerConfig
from nope_lightning.config.stages import PretrainConfig
from nope_lightning.data.corpus import corpus_label
from nope_lightning.model.gpt import non_embedding_parameters


def training_tokens(trainer: TrainerConfig, steps: int, batch_size: int, length: int) -> int:
    """Tokens a training run reads: optimizer steps x per-process batch x processes x accumulation x length."""
    return steps * batch_size * trainer.devices * trainer.num_nodes * trainer.accumulate_grad_batches * length


def default_name(cfg: PretrainConfig) -> str:
    """``pretrain-<pe>[-ssmax][-<layout>]-<corpus>-L<train_len>-s<seed>``: replicates of one recipe (seeds) never
    share an out_dir, nor does a hybrid share its RoPE base's (``layout_label``); other differences need their own
    ``name=`` (a resumed out_dir refuses another config)."""
    corpus = corpus_label(cfg.data.corpus)
    ssmax = "-ssmax" if cfg.model.ssmax else ""
    layout = f"-{layout_label(cfg.model)}" if layout_label(cfg.model) else ""
    return f"pretrain-{cfg.model.pos_encoding}{ssmax}{layout}-{corpus}-L{cfg.train_len}-s{cfg.seed}"


def layout_label(model: ModelConfig) -> str:
    """A hybrid's per-layer layout in a name: ``nope4`` (one NoPE layer in 4), ``swa64`` (64-token windows on the
    RoPE layers), ``layers-<hash>`` for an explicit per-layer list; '' for a model with one encoding everywhere."""
    parts = [f"nope{model.nope_every}" if model.nope_every else "",
             f"swa{model.rope_window}" if model.rope_window else ""]
    if model.layer_pattern or model.layer_windows:
        listed = json.dumps([model.layer_pattern, model.layer_windows])
        parts.append(f"layers-{hashlib.sha256(listed.encode()).hexdigest()[:8]}")
    return "-".join(part for part in parts if part)


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
