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
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from omegaconf import OmegaConf
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from nope_lightning.config.core import load_config, to_yaml
from nope_lightning.config.data import DataConfig, RetrievalConfig
from nope_lightning.config.parts import AttentionTemperature, RopeScalingConfig, TrackingConfig
from nope_lightning.config.stages import PretrainConfig
from nope_lightning.data.tokenizer import TextTokenizer, hf_special_tokens, hf_tokenizer_json
from nope_lightning.model.gpt import GPT
from nope_lightning.model.hf import (
    HEADSCALE_TABLE,
    export_state,
    hf_config,
    hf_model_config,
    import_state,
    is_hf_folder,
    parse_reference,
)
from nope_lightning.model.temperature import apply_settings, save_table
from nope_lightning.runtime import tracking as tr
from nope_lightning.runtime.locks import file_lock

WEIGHTS, CONFIG, TOKENIZER, META = "model.safetensors", "config.yaml", "tokenizer.json", "meta.json"


def export_model(out: str | Path, model: GPT, cfg: Any, tokenizer_file: str | Path, meta: dict) -> Path:
    """Write an export folder (see module doc) and return it."""
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    return write_export(out, state, cfg, Path(tokenizer_file).read_text(),
                        {**meta, "vocab_size": model.config.vocab_size, "train_len": model.train_len})


def write_export(out: str | Path, state: dict[str, torch.Tensor], cfg: Any, tokenizer_text: str, meta: dict) -> Path:
    """Write an export folder from a state dict, the config, the tokenizer.json text and ``meta`` (which names
    ``vocab_size`` and ``train_len``); the tokenizer's sha256 is added to the meta."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / WEIGHTS))
    (out / CONFIG).write_text(to_yaml(cfg))
    (out / WEIGHTS).chmod((out / CONFIG).stat().st_mode & 0o777)  # safetensors writes 0600; match the rest
    (out / TOKENIZER).write_text(tokenizer_text)
    meta = {**meta, "tokenizer_sha256": hashlib.sha256(tokenizer_text.encode()).hexdigest()}
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
    """A local export folder for ``ref``: a folder path, ``runs:/<id>/<path>``, ``mlflow:<id>``, or a Hugging
    Face Llama folder (``nope:<folder>``, ``rope:<folder>``, or a plain folder that says its encoding), imported
    once into the cache (``imported_copy``)."""
    if ref.startswith("runs:/"):
        run_id, _, artifact = ref.removeprefix("runs:/").partition("/")
        return tr.download(tracking, run_id, artifact or "model")
    if ref.startswith("mlflow:"):
        return tr.download(tracking, ref.removeprefix("mlflow:"), "model")
    encoding, ref = parse_reference(ref)
    path = Path(ref)
    if path.is_file() and path.name == WEIGHTS:
        path = path.parent
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint={ref}: no such export folder; pass the folder a pretrain run "
                                f"wrote (it holds {WEIGHTS}), runs:/<run_id>/model, or a Hugging Face Llama "
                                f"folder as nope:<folder> / rope:<folder>")
    return imported_copy(path, encoding) if encoding or is_hf_folder(path) else path


def import_hf(source: str | Path, out: str | Path, pos_encoding: str | None = None, max_positions: int = 0,
              data: DataConfig | None = None) -> Path:
    """Turn a Hugging Face Llama folder into an export folder ``out`` (``model/hf.py`` says how), written under
    a temporary name and renamed into place. ``data``: the data section later stages read as the model's own
    (the corpus whose validation split a search selects on); its tokenizer is the imported one. A HeadScale
    model's table is ``HEADSCALE_TABLE`` in the folder, named by the config's ``model.temperature.table``."""
    source, out = Path(source), Path(out)
    model_cfg, vocab_size, train_len = hf_model_config(source, pos_encoding, max_positions)
    tokenizer_text = hf_tokenizer_json(source)
    ids = Tokenizer.from_str(tokenizer_text).get_vocab_size(with_added_tokens=True)
    if ids > vocab_size:
        raise ValueError(f"{source}: the tokenizer has {ids} ids and the model's embedding {vocab_size} rows; "
                         f"the tokenizer belongs to another model: put the model's own tokenizer in the folder")
    state, table = import_state(source, model_cfg, vocab_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        if table is not None:
            save_table(tmp / HEADSCALE_TABLE, table, {"source": source.resolve()})
            model_cfg = dataclasses.replace(model_cfg, temperature=AttentionTemperature(table=HEADSCALE_TABLE))
        # No retrieval mix: the model's "recipe" (HeadScale's and the fine-tunes' default data) is its corpus text.
        cfg = PretrainConfig(model=model_cfg, data=data or DataConfig(), train_len=train_len, name=source.name,
                             retrieval=RetrievalConfig(fraction=0.0))
        meta = {"vocab_size": vocab_size, "train_len": train_len, "imported_from": str(source.resolve())}
        write_export(tmp, state, cfg, tokenizer_text, meta)
        special = hf_special_tokens(source)
        if special:  # the BOS/EOS pair the source names, for the tokenizer beside it (TextTokenizer.load)
            (tmp / "tokenizer_config.json").write_text(json.dumps({"bos_token": special[0], "eos_token": special[1]}))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def export_hf(loaded: LoadedModel, out: str | Path) -> Path:
    """Write ``loaded`` (its evaluation-time settings applied) as a Hugging Face Llama folder ``out``:
    ``config.json`` (``hf.hf_config``), ``model.safetensors`` (``hf.export_state``: lambdas folded into the
    queries), and the tokenizer (``tokenizer.json`` with a ``tokenizer_config.json`` naming BOS and EOS)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(loaded.tokenizer_file))
    bos, eos = (tokenizer.id_to_token(i) for i in special_ids(loaded.tokenizer_file))
    model = loaded.model
    config = hf_config(model.cfg, model.config.padded_vocab_size, model.train_len, *special_ids(loaded.tokenizer_file))
    save_file(export_state(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    shutil.copyfile(loaded.tokenizer_file, out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
         "model_max_length": model.cfg.max_positions}, indent=2))
    return out


def special_ids(tokenizer_file: Path) -> tuple[int, int]:
    """(BOS id, EOS id) of a tokenizer file, as the suite's tokenizer wrapper finds them."""
    tokenizer = TextTokenizer.load(tokenizer_file)
    return tokenizer.bos_id, tokenizer.eos_id


def imported_copy(source: Path, pos_encoding: str | None) -> Path:
    """The export of Hugging Face folder ``source`` in the cache (``$NOPE_LIGHTNING_CACHE`` or
    ``~/.cache/nope_lightning``, under ``imported/``), imported on first use. Its key hashes the encoding, the
    config and tokenizer files' contents and the weight files' names, sizes and modification times (hashing
    gigabytes of weights at every load would cost seconds): a changed folder gets a fresh import."""
    digest = hashlib.sha256(f"{pos_encoding}\n{source.resolve()}\n".encode())
    for path in sorted(source.iterdir()):
        if path.suffix in (".json", ".model"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        elif path.suffix in (".safetensors", ".bin"):
            stat = path.stat()
            digest.update(f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    folder = DataConfig().cache_path / "imported" / f"{source.name}-{digest.hexdigest()[:16]}"
    with file_lock(folder.with_name(f"{folder.name}.lock")):  # DDP ranks and parallel stages import once
        if not (folder / META).is_file():
            import_hf(source, folder, pos_encoding)
    return folder


def load_model(ref: str, tracking: TrackingConfig, *, temperature: AttentionTemperature | None = None,
               rope_scaling: RopeScalingConfig | None = None, attention_backend: str | None = None) -> LoadedModel:
    """Rebuild and load an exported model with the evaluation-time settings given (None keeps the export's
    own); they never change the architecture. ``temperature`` must be resolved: local files, no fit
    (``nope_lightning.model.extension`` resolves a user's ``extension.temperature``). An export's own per-head
    table (an imported HeadScale model's) stays unless ``temperature`` names another table; a uniform lambda
    multiplies it."""
    folder = resolve_reference(ref, tracking)
    for name in (WEIGHTS, CONFIG, META):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"checkpoint={ref}: {folder} has no {name}; is it an export folder?")
    cfg = own_files(export_config(folder / CONFIG), folder)
    meta = json.loads((folder / META).read_text())
    if temperature is not None and not temperature.table and cfg.model.temperature.table:
        temperature = dataclasses.replace(temperature, table=cfg.model.temperature.table)  # keep the model's own
    settings = {"temperature": temperature, "rope_scaling": rope_scaling, "attention_backend": attention_backend}
    model_cfg = dataclasses.replace(cfg.model, **{k: v for k, v in settings.items() if v is not None})
    model = GPT(model_cfg, meta["vocab_size"], cfg.train_len)
    load_weights(model, folder / WEIGHTS)
    apply_settings(model, model_cfg.temperature)  # the weights file holds the export's own lambdas
    return LoadedModel(model, dataclasses.replace(cfg, model=model_cfg), meta, folder)


def own_files(cfg: PretrainConfig, folder: Path) -> PretrainConfig:
    """``cfg`` with the files an export holds itself named by their paths: its per-head table (relative to the
    folder in the config) and, for an imported model, its tokenizer as the data's (later stages tokenize their
    corpora with it rather than training one)."""
    model, data = cfg.model, cfg.data
    table = model.temperature.table
    if table and not os.path.isabs(table) and (folder / table).is_file():
        model = dataclasses.replace(model, temperature=dataclasses.replace(model.temperature, table=str(folder / table)))
    if is_imported(folder):
        data = dataclasses.replace(data, tokenizer=str(folder / TOKENIZER))
    return dataclasses.replace(cfg, model=model, data=data)


def is_imported(folder: Path) -> bool:
    """Whether an export folder was imported from a Hugging Face folder (its meta names the source)."""
    return "imported_from" in json.loads((Path(folder) / META).read_text())


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
