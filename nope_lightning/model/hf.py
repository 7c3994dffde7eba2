"""Hugging Face Llama folders in and out: config and weights mapped onto our GPT (litgpt's blocks) both ways.

A Llama-family folder holds ``config.json``, the weights (``model.safetensors``, or shards named by
``model.safetensors.index.json``; ``pytorch_model.bin`` shards are read with ``torch.load(weights_only=True)``)
and a tokenizer (``tokenizer.json``, or a SentencePiece ``tokenizer.model``). The weight names are mapped by
litgpt's own converters (``copy_weights_hf_llama`` in, ``copy_weights_llama`` out): our blocks are litgpt's, so
q, k and v concatenate into ``attn.qkv`` in that order and RoPE's half-split layout is the same on both sides.

Choices, each tested (``tests/test_hf_checkpoints.py``):

* **NoPE is chosen at import**, as paper 001's authors load their models: their ``TinyLlama-NoPE-1.1B`` is an
  ordinary ``LlamaForCausalLM`` folder and NoPE a load-time switch that replaces transformers'
  ``apply_rotary_pos_emb`` by the identity. Nothing in such a folder says NoPE, so a reference names it
  (``nope:<folder>`` / ``rope:<folder>``, ``parse_reference``); a folder this suite exported records it under
  ``POS_ENCODING_KEY`` in its ``config.json`` (transformers keeps unknown keys), so it needs no prefix.
* **HeadScale tables**: the authors' HeadScale models carry ``model.layers.N.self_attn.scale_param`` (n_head,)
  and multiply q by ``scale_param / sqrt(head_dim)`` before a softmax of scale 1: our lambda in units of
  1/sqrt(d) is that number itself. They become the (n_layer, n_head) table ``HEADSCALE_TABLE``.
* **The vocabulary is not padded** (``ModelConfig.padding_multiple=1``): untrained padding rows would take
  softmax mass from the real tokens.
* **Tied embeddings** (``tie_word_embeddings``) are imported as two equal tables, ``lm_head`` a copy of the
  token embeddings: logits are identical, and a fine-tune then trains the two apart (transformers would keep
  them tied). An export always writes untied tables.
* **RoPE scaling** in ``config.json`` (``rope_scaling``, or transformers 5's ``rope_parameters``) carries over:
  ``linear`` -> ``pi``, ``dynamic`` -> ``dynamic_ntk``, ``yarn`` -> ``yarn`` (its default attention factor
  0.1 ln s + 1 only); any other type is refused. Our static ``ntk`` exports as a plain RoPE with the enlarged
  base it is, so transformers computes the same frequencies.
* **The training length** L is ``original_max_position_embeddings`` where the scaling names it, else
  ``max_position_embeddings``; ``max_positions`` (the longest sequence the model accepts) defaults to 16 L.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from litgpt.scripts.convert_hf_checkpoint import copy_weights_hf_llama
from litgpt.scripts.convert_lit_checkpoint import copy_weights_llama
from safetensors import SafetensorError
from safetensors.torch import load_file

from nope_lightning.config.parts import ModelConfig, RopeScalingConfig
from nope_lightning.model.gpt import GPT, litgpt_config

#: The ``config.json`` key under which an export records its position encoding (``nope`` or ``rope``).
POS_ENCODING_KEY = "nope_lightning_pos_encoding"
#: The per-head lambda table an imported HeadScale model's export holds (``temperature.save_table`` format).
HEADSCALE_TABLE = "headscale.safetensors"
#: The tensor suffix of the authors' per-head scales.
SCALE_PARAM = ".self_attn.scale_param"
#: Hugging Face RoPE types -> ours, and back.
ROPE_TYPES = {"default": "none", "linear": "pi", "dynamic": "dynamic_ntk", "yarn": "yarn"}
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def parse_reference(ref: str) -> tuple[str | None, str]:
    """``"nope:/x"`` -> ``("nope", "/x")``, ``"rope:/x"`` -> ``("rope", "/x")``, anything else -> ``(None, ref)``."""
    for encoding in ("nope", "rope"):
        if ref.startswith(f"{encoding}:"):
            return encoding, ref.removeprefix(f"{encoding}:")
    return None, ref


def is_hf_folder(path: str | Path) -> bool:
    """Whether ``path`` is a Hugging Face model folder (``config.json``) rather than one of our exports."""
    path = Path(path)
    return (path / "config.json").is_file() and not (path / "config.yaml").is_file()


def read_config(folder: Path) -> dict:
    """``folder``'s ``config.json``, refused in one line when missing, unreadable or not Llama-family."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json; is it a Hugging Face model folder?")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); re-download the model") from None
    architectures = cfg.get("architectures") or []
    if cfg.get("model_type") != "llama" and "LlamaForCausalLM" not in architectures:
        named = ", ".join(architectures) or "no architectures"
        raise ValueError(f"{folder}: model_type {cfg.get('model_type')!r} ({named}) is not Llama-family; only "
                         f"LlamaForCausalLM folders can be imported")
    return cfg


def rope_settings(cfg: dict) -> tuple[float, dict]:
    """(base theta, scaling dict) of a config in either format: transformers 5's ``rope_parameters`` (theta
    inside) or the older top-level ``rope_theta`` + ``rope_scaling``."""
    params = dict(cfg.get("rope_parameters") or {})
    theta = params.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0
    scaling = params or dict(cfg.get("rope_scaling") or {})
    return float(theta), scaling


def hf_model_config(folder: str | Path, pos_encoding: str | None,
                    max_positions: int = 0) -> tuple[ModelConfig, int, int]:
    """(our ``ModelConfig``, vocabulary size, training length L) of a Llama folder, read from ``config.json``
    alone (no weights). ``pos_encoding`` None takes the folder's own (``POS_ENCODING_KEY``); ``max_positions`` 0
    means 16 L."""
    cfg = read_config(Path(folder))
    encoding = pos_encoding or cfg.get(POS_ENCODING_KEY)
    if encoding not in ("nope", "rope"):
        raise ValueError(f"{folder}: the folder does not say whether it is NoPE or RoPE; name it: "
                         f"pos_encoding=nope|rope (import), or checkpoint=nope:{folder} / rope:{folder}")
    n_embd, n_head = cfg["hidden_size"], cfg["num_attention_heads"]
    unsupported = {"hidden_act": cfg.get("hidden_act", "silu") != "silu",
                   "attention_bias": bool(cfg.get("attention_bias")), "mlp_bias": bool(cfg.get("mlp_bias")),
                   "head_dim": cfg.get("head_dim", n_embd // n_head) != n_embd // n_head}
    if any(unsupported.values()):
        raise ValueError(f"{folder}: config.json sets {', '.join(k for k, v in unsupported.items() if v)} beyond "
                         f"the Llama block (silu MLP, no biases, head_dim = hidden_size / heads) our GPT builds")
    theta, scaling = rope_settings(cfg)
    rope_scaling = RopeScalingConfig()
    train_len = cfg["max_position_embeddings"]
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if encoding == "rope" and kind != "default":
        if kind not in ROPE_TYPES or scaling.get("attention_factor") or scaling.get("mscale"):
            raise ValueError(f"{folder}: rope scaling {scaling} is not one we implement (types "
                             f"{', '.join(ROPE_TYPES)}; YaRN with its default attention factor)")
        train_len = scaling.get("original_max_position_embeddings") or train_len
        rope_scaling = RopeScalingConfig(method=ROPE_TYPES[kind], factor=float(scaling["factor"]),
                                         original_len=train_len, beta_fast=float(scaling.get("beta_fast") or 32),
                                         beta_slow=float(scaling.get("beta_slow") or 1))
    model = ModelConfig(n_layer=cfg["num_hidden_layers"], n_head=n_head, n_embd=n_embd,
                        n_query_groups=cfg.get("num_key_value_heads") or n_head,
                        intermediate_size=cfg["intermediate_size"], norm_eps=cfg.get("rms_norm_eps", 1e-6),
                        pos_encoding=encoding, max_positions=max_positions or 16 * train_len, rope_base=theta,
                        rope_scaling=rope_scaling, padding_multiple=1)
    return model, cfg["vocab_size"], train_len


def read_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Llama folder, by its Hugging Face name, in its stored dtype. Shards come from the
    index when there is one; a missing or truncated shard, or an index naming a file that is not there, is
    one ``ValueError`` naming the file."""
    folder = Path(folder)
    index = next((folder / name for name in WEIGHT_INDEXES if (folder / name).is_file()), None)
    if index is not None:
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as err:
            raise ValueError(f"{index} is not a weight index ({err}); re-download the model") from None
    else:
        files = [name for name in WEIGHT_FILES if (folder / name).is_file()][:1]
        if not files:
            raise FileNotFoundError(f"{folder}: no weights ({' or '.join(WEIGHT_FILES + WEIGHT_INDEXES)})")
    weights: dict[str, torch.Tensor] = {}
    for name in files:
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"{index} names {name}, which is not in {folder}; re-download that shard")
        try:
            weights.update(load_file(str(path)) if name.endswith(".safetensors")
                           else torch.load(path, map_location="cpu", weights_only=True))
        except pickle.UnpicklingError as err:
            first = str(err).splitlines()[-1].strip()
            raise ValueError(f"shard {path} holds more than tensors, which torch.load(weights_only=True) refuses "
                             f"({first[:160]}); use the model's safetensors files") from None
        except (SafetensorError, OSError, RuntimeError, EOFError, ValueError) as err:
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ValueError(f"shard {path} is truncated or corrupt ({first}); re-download it") from None
    return weights


def import_state(folder: str | Path, model_cfg: ModelConfig, vocab_size: int
                 ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """(our GPT's state dict, the HeadScale table (n_layer, n_head) float32 or None) of a Llama folder. Tensors
    keep their stored dtype (a bf16 checkpoint stays bf16 on disk; loading casts to the model's dtype); the
    per-head lambdas of the state are 1 (a table applies through the config, ``HEADSCALE_TABLE``)."""
    weights = read_weights(folder)
    scales = {name: weights.pop(name) for name in [n for n in weights if n.endswith(SCALE_PARAM)]}
    for name in [n for n in weights if n.endswith("rotary_emb.inv_freq")]:
        del weights[name]  # a buffer older transformers saved; RoPE's tables are ours to compute
    lit_cfg = litgpt_config(model_cfg, vocab_size)
    state: dict[str, torch.Tensor] = {}
    try:
        copy_weights_hf_llama(lit_cfg, {}, state, weights)
    except KeyError as err:
        raise ValueError(f"{folder}: tensor names unknown to a Llama block ({err}); is it Llama-family?") from None
    if "lm_head.weight" in state and state["lm_head.weight"] is state["transformer.wte.weight"]:
        state["lm_head.weight"] = state["transformer.wte.weight"].clone()  # tied: two tables (module doc)
    for layer in range(model_cfg.n_layer):
        state[f"transformer.h.{layer}.attn.temperature.per_head"] = torch.ones(model_cfg.n_head)
    table = None
    if scales:
        names = [f"model.layers.{layer}{SCALE_PARAM}" for layer in range(model_cfg.n_layer)]
        if sorted(scales) != sorted(names):
            raise ValueError(f"{folder}: scale_param on {len(scales)} of {model_cfg.n_layer} layers; a HeadScale "
                             f"model has one per attention layer")
        table = torch.stack([scales[name].float() for name in names])
    check_state(state, model_cfg, vocab_size, str(folder))
    return state, table


def check_state(state: dict[str, torch.Tensor], model_cfg: ModelConfig, vocab_size: int, where: str) -> None:
    """Refuse a state whose names or shapes differ from our GPT's for ``model_cfg`` (built on the meta device:
    no memory), in one line naming the first differences."""
    with torch.device("meta"):
        expected = GPT(model_cfg, vocab_size, 1).state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = [k for k in state if k in expected and tuple(state[k].shape) != tuple(expected[k].shape)]
    if missing or unexpected or wrong:
        raise ValueError(f"{where}: weights do not match config.json: missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}, wrong shape {wrong[:3]}; is the folder complete and Llama-family?")


def hf_config(model_cfg: ModelConfig, vocab_size: int, train_len: int, bos_id: int | None,
              eos_id: int | None) -> dict:
    """The Llama ``config.json`` of our model (``vocab_size`` = its padded table size); refuses what a
    LlamaForCausalLM cannot express."""
    refused = {"pos_encoding": model_cfg.pos_encoding not in ("nope", "rope"), "ssmax": model_cfg.ssmax,
               "layer_pattern / nope_every": len(set(model_cfg.layer_encodings)) > 1,
               "windows": any(w is not None for w in model_cfg.windows),
               "rope_scaling yarn_paper": model_cfg.rope_scaling.method == "yarn_paper"}
    if any(refused.values()):
        raise ValueError(f"format=hf writes a Llama folder: this model's {', '.join(k for k, v in refused.items() if v)} "
                         f"has no Llama equivalent (export NoPE or RoPE models without hybrids, windows or SSMax)")
    scaling, theta = model_cfg.rope_scaling, model_cfg.rope_base
    rope: dict = {"rope_type": "default"}
    if model_cfg.pos_encoding == "rope" and scaling.method != "none" and scaling.factor != 1.0:
        d, original = model_cfg.head_size, scaling.original_len or train_len
        if scaling.method == "ntk":
            theta = theta * scaling.factor ** (d / (d - 2))  # static NTK is RoPE with this base (rope_scaling.py)
        else:
            kind = {ours: theirs for theirs, ours in ROPE_TYPES.items()}[scaling.method]
            rope = {"rope_type": kind, "factor": scaling.factor, "original_max_position_embeddings": original}
            if kind == "yarn":
                rope.update(beta_fast=scaling.beta_fast, beta_slow=scaling.beta_slow)
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": model_cfg.n_embd, "intermediate_size": model_cfg.intermediate_size,
            "num_hidden_layers": model_cfg.n_layer, "num_attention_heads": model_cfg.n_head,
            "num_key_value_heads": model_cfg.kv_heads, "head_dim": model_cfg.head_size,
            "max_position_embeddings": train_len, "rms_norm_eps": model_cfg.norm_eps,
            "rope_theta": theta, "rope_scaling": None if rope["rope_type"] == "default" else rope,
            "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "vocab_size": vocab_size,
            "bos_token_id": bos_id, "eos_token_id": eos_id, "torch_dtype": "float32",
            POS_ENCODING_KEY: model_cfg.pos_encoding}


def export_state(model: GPT) -> dict[str, torch.Tensor]:
    """Our GPT's weights under Llama names, with each head's position-free lambda (uniform x table) folded into
    its query rows, as attention folds it (``Temperature.query_rows``): q_h = lambda_h W_q,h x, so the folder
    computes the same logits with no temperature of its own. A position-dependent temperature cannot fold and is
    refused."""
    temperatures = [attn.temperature for attn in model.attention_layers]
    if not all(t.folds for t in temperatures):
        raise ValueError("format=hf folds a position-free lambda (uniform, per-head table) into the queries; this "
                         "model's temperature depends on the position (log-length, SSMax, iRoPE's, past L only)")
    lit: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("attn.temperature.per_head"):
            continue
        lit[name] = tensor.detach().float().cpu().clone()
    head_size = model.cfg.head_size
    for layer, temperature in enumerate(temperatures):
        rows = temperature.query_rows(head_size).detach().float().cpu()
        qkv = lit[f"transformer.h.{layer}.attn.qkv.weight"]
        qkv[: rows.numel()] *= rows[:, None]
    hf: dict[str, torch.Tensor] = {}
    copy_weights_llama(model.config, hf, lit)
    return {name: tensor.contiguous() for name, tensor in hf.items()}

