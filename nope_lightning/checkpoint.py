"""Exported models: safetensors weights + the resolved config + the tokenizer, and loading them back.

An export folder holds ``model.safetensors``, ``config.yaml`` (the full resolved stage config that trained
it), ``tokenizer.json`` and ``meta.json`` (vocab size, train length, tokenizer fingerprint, step, metrics).
Later stages name a model as ``checkpoint=<folder>``, ``checkpoint=runs:/<run_id>/model`` or
``checkpoint=mlflow:<run_id>``; weights load with safetensors (no pickle), strictly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nope_lightning.config import PretrainConfig, TrackingConfig, load_config, to_yaml
from nope_lightning.model import GPT, resolve_temperatures, set_head_scales

WEIGHTS, CONFIG, TOKENIZER, META = "model.safetensors", "config.yaml", "tokenizer.json", "meta.json"


def export_model(out: str | Path, model: GPT, cfg: Any, tokenizer_file: str | Path, meta: dict) -> Path:
    """Write an export folder (see module doc) and return it."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / WEIGHTS))
    (out / CONFIG).write_text(to_yaml(cfg))
    (out / WEIGHTS).chmod((out / CONFIG).stat().st_mode & 0o777)  # safetensors writes 0600; match the rest
    tokenizer_text = Path(tokenizer_file).read_text()
    (out / TOKENIZER).write_text(tokenizer_text)
    meta = {**meta, "vocab_size": model.config.vocab_size, "train_len": model.train_len,
            "tokenizer_sha256": hashlib.sha256(tokenizer_text.encode()).hexdigest()}
    (out / META).write_text(json.dumps(meta, indent=1, default=str))
    return out


@dataclass
class LoadedModel:
    model: GPT
    config: PretrainConfig
    meta: dict
    folder: Path

    @property
    def tokenizer_file(self) -> Path:
        return self.folder / TOKENIZER

    @property
    def fingerprint(self) -> str:
        return weights_fingerprint(self.folder)


def weights_fingerprint(folder: Path) -> str:
    """sha256 of an export's weights file: identifies the trained model (results for another one are
    refused), without building the model."""
    digest = hashlib.sha256()
    with open(Path(folder) / WEIGHTS, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def resolve_reference(ref: str, tracking: TrackingConfig) -> Path:
    """A local export folder for ``ref`` (folder path, ``runs:/<id>/<path>`` or ``mlflow:<id>``)."""
    from nope_lightning import tracking as tr

    if ref.startswith("runs:/"):
        run_id, _, artifact = ref.removeprefix("runs:/").partition("/")
        return tr.download(tracking, run_id, artifact or "model")
    if ref.startswith("mlflow:"):
        return tr.download(tracking, ref.removeprefix("mlflow:"), "model")
    path = Path(ref)
    if path.is_file() and path.name == WEIGHTS:
        path = path.parent
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint={ref}: no such export folder; pass the folder a pretrain run "
                                f"wrote (it holds {WEIGHTS}) or runs:/<run_id>/model")
    return path


def load_model(ref: str, tracking: TrackingConfig, **model_overrides: Any) -> LoadedModel:
    """Rebuild and load an exported model; ``model_overrides`` change evaluation-time model fields
    (``temperature``, ``temperature_table``, ``rope_scaling``, ``attention_backend``), never the architecture.
    """
    folder = resolve_reference(ref, tracking)
    for name in (WEIGHTS, CONFIG, META):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"checkpoint={ref}: {folder} has no {name}; is it an export folder?")
    cfg = load_config(PretrainConfig, folder / CONFIG)
    meta = json.loads((folder / META).read_text())
    model_cfg = dataclasses.replace(cfg.model, **model_overrides)
    model = GPT(model_cfg, meta["vocab_size"], cfg.train_len)
    load_weights(model, folder / WEIGHTS)
    set_head_scales(model, resolve_temperatures(model_cfg))
    return LoadedModel(model, dataclasses.replace(cfg, model=model_cfg), meta, folder)


def load_weights(model: GPT, path: Path) -> None:
    """Strict safetensors load with one clear error for a corrupt file or another architecture."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"corrupt checkpoint {path}: {err}; re-export it or train again") from None
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong_shape = [k for k, v in state.items() if k in expected and expected[k].shape != v.shape]
    if missing or unexpected or wrong_shape:
        raise ValueError(f"checkpoint {path} does not match the model config: missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]}, wrong shape {wrong_shape[:4]}")
    model.load_state_dict(state, strict=True)


def damage(path: str | Path) -> str | None:
    """What is wrong with a Lightning checkpoint file, or None when intact. A ``.ckpt`` is a zip whose every
    record carries a CRC-32; flipped bytes in tensor data fail it (``torch.load`` itself never checks)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile, EOFError, RuntimeError) as err:
        return " ".join(f"not a readable checkpoint archive ({type(err).__name__}: {err})".split())
    return None if bad is None else f"record {bad} fails its CRC check (the bytes were damaged)"


def newest_intact(folder: str | Path, exclude: str | Path | None = None) -> Path | None:
    """The most recently written intact ``*.ckpt`` in ``folder`` other than ``exclude``."""
    others = [p for p in Path(folder).glob("*.ckpt") if exclude is None or p.resolve() != Path(exclude).resolve()]
    return next((p for p in sorted(others, key=lambda p: p.stat().st_mtime, reverse=True) if damage(p) is None),
                None)


def torch_load(path: str | Path) -> dict:
    """``torch.load(weights_only=True)`` of a Lightning checkpoint after checking its CRCs; a damaged or
    unloadable file is one ``ValueError`` naming the newest intact checkpoint beside it."""
    problem = damage(path)
    if problem is None:
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 — any unpickling failure (or weights-only refusal) means the same
            problem = " ".join(f"{type(err).__name__}: {err}".split())
    intact = newest_intact(Path(path).parent, path)
    advice = (f"the newest intact checkpoint is {intact}: delete {Path(path).name} and a rerun resumes from it"
              if intact else "no intact checkpoint is beside it")
    raise ValueError(f"corrupt checkpoint {path}: {problem}; {advice}, or delete it and start again "
                     f"(another out_dir=, or resume=false where the stage has it)")
