"""Exported models: safetensors weights + the resolved config + the tokenizer, and loading them back.

An export folder holds ``model.safetensors``, ``config.yaml`` (the full resolved stage config that trained
it), ``tokenizer.json`` and ``meta.json`` (vocab size, train length, tokenizer fingerprint, step, metrics).
Later stages name a model as ``checkpoint=<folder>``, ``checkpoint=runs:/<run_id>/model`` or
``checkpoint=mlflow:<run_id>``; weights load with safetensors (no pickle), strictly. Exports written before the
temperatures were renamed (flat ``model.temperature``/``log_scale_*`` keys, ``attn.head_scale`` weights) load
as they are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from omegaconf import OmegaConf
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from nope_lightning.config.core import load_config, to_yaml
from nope_lightning.config.parts import AttentionTemperature, RopeScalingConfig, TrackingConfig
from nope_lightning.config.stages import PretrainConfig
from nope_lightning.model.gpt import GPT
from nope_lightning.model.temperature import apply_settings
from nope_lightning.runtime import tracking as tr

WEIGHTS, CONFIG, TOKENIZER, META = "model.safetensors", "config.yaml", "tokenizer.json", "meta.json"


def export_model(out: str | Path, model: GPT, cfg: Any, tokenizer_file: str | Path, meta: dict) -> Path:
    """Write an export folder (see module doc) and return it."""
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


def load_model(ref: str, tracking: TrackingConfig, *, temperature: AttentionTemperature | None = None,
               rope_scaling: RopeScalingConfig | None = None, attention_backend: str | None = None) -> LoadedModel:
    """Rebuild and load an exported model with the evaluation-time settings given (None keeps the export's
    own); they never change the architecture. ``temperature`` must be resolved: local files, no fit
    (``nope_lightning.model.extension`` resolves a user's ``extension.temperature``)."""
    folder = resolve_reference(ref, tracking)
    for name in (WEIGHTS, CONFIG, META):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"checkpoint={ref}: {folder} has no {name}; is it an export folder?")
    cfg = export_config(folder / CONFIG)
    meta = json.loads((folder / META).read_text())
    settings = {"temperature": temperature, "rope_scaling": rope_scaling, "attention_backend": attention_backend}
    model_cfg = dataclasses.replace(cfg.model, **{k: v for k, v in settings.items() if v is not None})
    model = GPT(model_cfg, meta["vocab_size"], cfg.train_len)
    load_weights(model, folder / WEIGHTS)
    apply_settings(model, model_cfg.temperature)  # the weights file holds the export's own lambdas
    return LoadedModel(model, dataclasses.replace(cfg, model=model_cfg), meta, folder)


#: The flat temperature keys of an export's ``model`` config written before ``model.temperature`` became
#: the ``AttentionTemperature`` section, and their keys there.
LEGACY_TEMPERATURE_KEYS = {"temperature": "uniform", "temperature_table": "table", "log_scale_a": "log_slope",
                           "log_scale_table": "log_slope_table"}
#: Tensor names of exports (and of HeadScale-log's training checkpoints: ``log_scale``) written before the
#: temperatures moved into ``attn.temperature``.
LEGACY_WEIGHT_NAMES = {".attn.head_scale": ".attn.temperature.per_head",
                       ".attn.position_temperature.ssmax": ".attn.temperature.ssmax",
                       ".attn.position_temperature.log_scale": ".attn.temperature.log_slope"}


def export_config(path: Path) -> PretrainConfig:
    """The training config of an export, whose flat legacy temperature keys move into ``model.temperature``."""
    doc = yaml.safe_load(path.read_text())
    model = doc.get("model") or {}
    if isinstance(model.get("temperature", {}), dict):
        return load_config(PretrainConfig, path)
    model["temperature"] = {new: model.pop(old) for old, new in LEGACY_TEMPERATURE_KEYS.items() if old in model}
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PretrainConfig), doc))


def legacy_renamed(name: str) -> str:
    """A tensor's current name for its name before the rename (``LEGACY_WEIGHT_NAMES``)."""
    for old, new in LEGACY_WEIGHT_NAMES.items():
        if name.endswith(old):
            return name.removesuffix(old) + new
    return name


def load_weights(model: GPT, path: Path) -> None:
    """Strict safetensors load with one clear error for a corrupt file or another architecture."""
    try:
        state = {legacy_renamed(k): v for k, v in load_file(str(path)).items()}
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
