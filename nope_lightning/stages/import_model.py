"""``import``: a Hugging Face Llama folder (paper 001's released checkpoints) as one of our export folders."""

from __future__ import annotations

from typing import Any

from nope_lightning.config.parts import TrackingConfig
from nope_lightning.config.transfer import ImportConfig
from nope_lightning.model.checkpoint import import_hf, load_model
from nope_lightning.model.gpt import count_parameters


def run(cfg: ImportConfig) -> dict[str, Any]:
    """Import ``cfg.source`` into ``cfg.out_dir``, then load the result once (strictly, as every stage will)."""
    out = import_hf(cfg.source, cfg.out_dir, cfg.pos_encoding or None, cfg.max_positions, cfg.data)
    loaded = load_model(str(out), TrackingConfig())
    model = loaded.model.cfg
    summary = {"checkpoint": str(out), "pos_encoding": model.pos_encoding, "train_len": loaded.config.train_len,
               "parameters": count_parameters(loaded.model), "headscale": bool(model.temperature.table)}
    return summary


# --- declared results: the registry's ``Stage.results`` (what a later step may reference; the dry run) ---


def result_keys(cfg: ImportConfig, train_len: int | None = None) -> dict[str, type]:
    """What ``run`` returns: the export folder, its encoding, training length, size and whether it has a table."""
    return {"checkpoint": str, "pos_encoding": str, "train_len": int, "parameters": int, "headscale": bool}
