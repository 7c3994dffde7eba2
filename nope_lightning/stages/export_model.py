"""``export``: one of our models as a Hugging Face Llama folder that ``transformers`` loads."""

from __future__ import annotations

import sys
from typing import Any

from nope_lightning.config.transfer import ExportConfig
from nope_lightning.model.checkpoint import export_hf
from nope_lightning.model.extension import load_extended


def run(cfg: ExportConfig) -> dict[str, Any]:
    """Load ``cfg.checkpoint`` under ``cfg.extension`` and write it to ``cfg.out_dir``."""
    loaded = load_extended(cfg.checkpoint, cfg.extension, cfg.tracking)
    out = export_hf(loaded, cfg.out_dir)
    summary = {"out_dir": str(out), "pos_encoding": loaded.model.cfg.pos_encoding}
    if summary["pos_encoding"] == "nope":
        print("export: transformers loads this folder as a RoPE model; switch its rotary step off to run it as "
              "NoPE (docs/checkpoints.md)", file=sys.stderr)
    return summary


# --- declared results: the registry's ``Stage.results`` (what a later step may reference; the dry run) ---


def result_keys(cfg: ExportConfig, train_len: int | None = None) -> dict[str, type]:
    """What ``run`` returns: the folder written and the model's position encoding."""
    return {"out_dir": str, "pos_encoding": str}
