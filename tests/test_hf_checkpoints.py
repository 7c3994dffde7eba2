"""Hugging Face Llama folders in and out, with ``transformers`` as the oracle: tiny random models built in the
test (``tests.helpers.tiny_llama_folder``), nothing downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from nope_lightning.config.parts import AttentionTemperature, RopeScalingConfig, TrackingConfig
from nope_lightning.model.checkpoint import export_hf, import_hf, load_model
from nope_lightning.model.hf import hf_model_config
from nope_lightning.stages.registry import run_stage, stage_config
from tests.helpers import tiny_llama_folder

TRACKING = TrackingConfig()


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Imports by reference land in a cache of the test's own."""
    monkeypatch.setenv("NOPE_LIGHTNING_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def no_rotary(monkeypatch):
    """transformers' Llama with its rotary step replaced by the identity: the authors' NoPE switch."""
    from transformers.models.llama import modeling_llama

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", lambda q, k, cos, sin, unsqueeze_dim=1: (q, k))


def ids_for(model, length: int = 48, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (2, length), generator=generator)


def ours(ref: str, **settings):
    return load_model(ref, TRACKING, **settings).model.eval()


@torch.no_grad()
def max_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize(("tie", "kv_heads"), [(False, 2), (True, 2), (False, 4), (True, 1)])
@torch.no_grad()
def test_imported_rope_logits_are_llamas(tmp_path, tie, kv_heads):
    hf = tiny_llama_folder(tmp_path / "hf", tie=tie, kv_heads=kv_heads)
    ids = ids_for(hf)
    model = ours(f"rope:{tmp_path / 'hf'}")
    assert model.config.padded_vocab_size == hf.config.vocab_size == 301  # unpadded: no untrained rows
    assert max_gap(model(ids), hf(ids).logits) < 1e-5


@torch.no_grad()
def test_imported_nope_is_llama_without_its_rotary_step(tmp_path, no_rotary):
    hf = tiny_llama_folder(tmp_path / "hf")
    ids = ids_for(hf, 100)  # past max_position_embeddings (64): NoPE has no table to run out of
    model = ours(f"nope:{tmp_path / 'hf'}")
    assert model.cfg.pos_encoding == "nope" and model.cfg.max_positions == 16 * 64
    assert max_gap(model(ids), hf(ids).logits) < 1e-5


@pytest.mark.parametrize(("rope", "method"), [
    ({"rope_type": "linear", "factor": 4.0}, "pi"),
    ({"rope_type": "dynamic", "factor": 4.0}, "dynamic_ntk"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, "yarn"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64, "beta_fast": 16.0,
      "beta_slow": 2.0}, "yarn"),
])
@torch.no_grad()
def test_each_rope_scaling_is_transformers_on_the_same_weights(tmp_path, rope, method):
    hf = tiny_llama_folder(tmp_path / "hf", rope=rope)
    model = ours(f"rope:{tmp_path / 'hf'}")
    scaling = model.cfg.rope_scaling
    assert (scaling.method, scaling.factor, model.train_len) == (method, rope["factor"], 64)
    ids = ids_for(hf, 200)  # 3x past the training length: where the methods differ
    assert max_gap(model(ids), hf(ids).logits) < 1e-5


@torch.no_grad()
def test_zero_shot_scaling_of_an_imported_model_is_transformers_with_that_config(tmp_path):
    """Our ``extension.rope_scaling`` on a plain import = transformers given the same scaling in its config."""
    tiny_llama_folder(tmp_path / "plain")
    scaled = tiny_llama_folder(tmp_path / "scaled", rope={"rope_type": "yarn", "factor": 4.0,
                                                          "original_max_position_embeddings": 64})
    extended = ours(f"rope:{tmp_path / 'plain'}",
                    rope_scaling=RopeScalingConfig(method="yarn", factor=4.0))
    ids = ids_for(scaled, 160)
    assert max_gap(extended(ids), scaled(ids).logits) < 1e-5


@torch.no_grad()
def test_a_headscale_model_scales_each_heads_queries_by_its_scale(tmp_path, no_rotary):
    """The authors' ``scale_param`` multiplies q by scale / sqrt(d): the same as transformers' model with each
    head's q_proj rows scaled by hand (transformers divides by sqrt(d) itself)."""
    table = [[1.0, 1.5, 2.0, 0.75], [1.25, 1.0, 3.0, 1.1]]
    hf = tiny_llama_folder(tmp_path / "hf", scale_param=table)
    model = ours(f"nope:{tmp_path / 'hf'}")
    stored = torch.tensor(table).to(torch.bfloat16).float()  # the folder holds bf16, as the authors' does
    assert torch.equal(torch.stack([a.temperature.per_head for a in model.attention_layers]), stored)
    with torch.no_grad():
        for layer, row in zip(hf.model.layers, stored, strict=True):
            layer.self_attn.q_proj.weight.mul_(row.repeat_interleave(16)[:, None])
    ids = ids_for(hf, 80)
    assert max_gap(model(ids), hf(ids).logits) < 1e-5
    plain = ours(f"nope:{tmp_path / 'hf'}", temperature=AttentionTemperature())  # evaluate's default
    assert torch.equal(plain(ids), model(ids))  # the model's own table stays under a default extension


def random_model(tmp_path: Path, pos_encoding: str, **extension):
    """One of our own exports (a random 2-layer GPT with GQA, its vocabulary padded to a multiple of 64 as a
    pretrained model's is, its norms perturbed) and the model loaded from it under ``extension``."""
    from nope_lightning.config.parts import ModelConfig
    from nope_lightning.config.stages import PretrainConfig
    from nope_lightning.data.tokenizer import TextTokenizer
    from nope_lightning.model.checkpoint import export_model
    from nope_lightning.model.gpt import GPT
    from tests.helpers import WORDS

    tokenizer = TextTokenizer.train([" ".join(WORDS)] * 3, 301)
    tokenizer.save(tmp_path / "tokenizer.json")
    cfg = ModelConfig(n_layer=2, n_head=4, n_query_groups=2, n_embd=64, intermediate_size=128,
                      pos_encoding=pos_encoding, max_positions=1024)
    torch.manual_seed(0)
    model = GPT(cfg, tokenizer.vocab_size, 64)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("norm_1.weight", "norm_2.weight", "ln_f.weight")):
                param.add_(0.1 * torch.randn_like(param))
    export = export_model(tmp_path / "ours", model, PretrainConfig(model=cfg, train_len=64), tmp_path / "tokenizer.json",
                          {"step": 0})
    return export, ours(str(export), **extension)


@pytest.mark.parametrize("pos_encoding", ["rope", "nope"])
@torch.no_grad()
def test_export_loads_in_transformers_with_the_same_logits(tmp_path, pos_encoding, monkeypatch):
    from transformers import AutoTokenizer, LlamaForCausalLM
    from transformers.models.llama import modeling_llama

    export, model = random_model(tmp_path, pos_encoding)
    loaded = load_model(str(export), TRACKING)
    export_hf(loaded, tmp_path / "hf_out")
    if pos_encoding == "nope":  # how a user runs an exported NoPE model in transformers (docs/checkpoints.md)
        monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", lambda q, k, cos, sin, unsqueeze_dim=1: (q, k))
    hf = LlamaForCausalLM.from_pretrained(tmp_path / "hf_out", dtype=torch.float32).eval()
    ids = ids_for(hf, 100 if pos_encoding == "nope" else 60)
    assert max_gap(model(ids), hf(ids).logits) < 1e-5
    text = "the water of the first day, 42 times\nand more"
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf_out")
    from nope_lightning.data.tokenizer import TextTokenizer

    assert tokenizer(text, add_special_tokens=False)["input_ids"] == TextTokenizer.load(
        loaded.tokenizer_file).encode(text)


@torch.no_grad()
def test_a_temperature_exports_folded_into_the_queries(tmp_path):
    from transformers import LlamaForCausalLM

    export, _ = random_model(tmp_path, "rope")
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"head_scale": [[1.0, 1.5, 2.0, 0.8], [1.2, 1.0, 1.7, 1.1]]}))
    loaded = load_model(str(export), TRACKING, temperature=AttentionTemperature(uniform=1.2, table=str(table)))
    export_hf(loaded, tmp_path / "hf_out")
    hf = LlamaForCausalLM.from_pretrained(tmp_path / "hf_out", dtype=torch.float32).eval()
    ids = ids_for(hf, 40)
    assert max_gap(loaded.model.eval()(ids), hf(ids).logits) < 1e-5
    assert max_gap(hf(ids).logits, ours(str(export))(ids)) > 1e-3  # the lambdas did change the model


@torch.no_grad()
def test_static_ntk_exports_as_the_rope_base_it_is(tmp_path):
    from transformers import LlamaForCausalLM

    export, _ = random_model(tmp_path, "rope")
    loaded = load_model(str(export), TRACKING, rope_scaling=RopeScalingConfig(method="ntk", factor=4.0))
    export_hf(loaded, tmp_path / "hf_out")
    hf = LlamaForCausalLM.from_pretrained(tmp_path / "hf_out", dtype=torch.float32).eval()
    ids = ids_for(hf, 120)
    assert max_gap(loaded.model.eval()(ids), hf(ids).logits) < 1e-5


@pytest.mark.parametrize("pos_encoding", ["rope", "nope"])
def test_import_of_an_export_is_the_model_bit_for_bit(tmp_path, pos_encoding):
    export, model = random_model(tmp_path, pos_encoding)
    export_hf(load_model(str(export), TRACKING), tmp_path / "hf_out")
    again = ours(str(tmp_path / "hf_out"))  # the folder records its encoding: no prefix needed
    assert again.cfg.pos_encoding == pos_encoding
    first, second = model.state_dict(), again.state_dict()
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert again.config.padded_vocab_size == model.config.padded_vocab_size == 320
    ids = torch.randint(0, 301, (2, 50))
    with torch.no_grad():
        assert torch.equal(model(ids), again(ids))


def test_import_stage_then_evaluate(tmp_path, tracking_overrides, no_rotary):
    """The documented path: ``nope-lightning run import`` on a folder built by transformers, then ``evaluate``
    on the result; the imported model's tokenizer tokenizes the evaluation corpus."""
    tiny_llama_folder(tmp_path / "hf", max_positions=64)
    imported = run_stage("import", stage_config("import", None, [
        f"source={tmp_path / 'hf'}", f"out_dir={tmp_path / 'export'}", "pos_encoding=nope", "data.corpus=tiny"]))
    assert imported["checkpoint"] == str(tmp_path / "export") and imported["train_len"] == 64
    assert imported["pos_encoding"] == "nope" and not imported["headscale"]
    result = run_stage("evaluate", stage_config("evaluate", None, [
        f"checkpoint={imported['checkpoint']}", *tracking_overrides, "trainer.progress_bar=false", "ppl_tokens=512",
        "passkey_keys=0", "longctx_samples=0", "position_windows=0", "eval_lengths=[64,128]"]))
    assert 1.0 < result["test/len64/ppl"] < 1e6 and "test/len128/ppl" in result


# --- bad input: one line each, before any compute ------------------------------------------------------------


def sharded(tmp_path: Path) -> Path:
    """A folder whose weights are two shards and an index, as large checkpoints ship."""
    folder = tmp_path / "hf"
    tiny_llama_folder(folder)
    weights = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        save_file({k: weights[k] for k in keys}, str(folder / shard), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


@torch.no_grad()
def test_sharded_folders_load_and_their_damage_is_named(tmp_path):
    folder = sharded(tmp_path)
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = ids_for(hf)
    assert max_gap(ours(f"rope:{folder}")(ids), hf(ids).logits) < 1e-5
    shard = folder / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"^shard .*00002-of-00002.safetensors is truncated or corrupt .*re-download"):
        import_hf(folder, tmp_path / "out", "rope")
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=r"index.json names model-00002-of-00002.safetensors, which is not"):
        import_hf(folder, tmp_path / "out", "rope")
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_bad_folders_are_refused_in_one_line(tmp_path):
    folder = tmp_path / "hf"
    tiny_llama_folder(folder)
    with pytest.raises(ValueError, match=r"does not say whether it is NoPE or RoPE; name it: pos_encoding=nope\|rope"):
        load_model(str(folder), TRACKING)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match=r"model_type 'gpt2' \(GPT2LMHeadModel\) is not Llama-family"):
        hf_model_config(folder, "rope")
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 200}))
    with pytest.raises(ValueError, match=r"the tokenizer has 301 ids and the model's embedding 200 rows"):
        import_hf(folder, tmp_path / "out", "rope")
    (folder / "config.json").write_text(json.dumps({**config, "rope_parameters": {"rope_type": "longrope"}}))
    with pytest.raises(ValueError, match=r"rope scaling .* is not one we implement"):
        hf_model_config(folder, "rope")
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"tokenizer"):
        import_hf(folder, tmp_path / "out", "rope")
    with pytest.raises(ValueError, match=r"import needs source="):
        stage_config("import", None, [f"source={folder}"])
    with pytest.raises(ValueError, match=r"pos_encoding"):
        stage_config("import", None, [f"source={folder}", "out_dir=x", "pos_encoding=alibi"])


@torch.no_grad()
def test_export_stage_on_a_pretrained_model_with_a_searched_lambda(tmp_path, tiny_pretrained, no_rotary):
    """``nope-lightning run export`` on a model the suite pretrained (NoPE, vocabulary padded to 64), a uniform
    lambda baked in: transformers without its rotary step computes the model's logits."""
    from transformers import LlamaForCausalLM

    result = run_stage("export", stage_config("export", None, [
        f"checkpoint={tiny_pretrained['model']}", f"out_dir={tmp_path / 'hf'}", *tiny_pretrained["tracking"],
        "extension.temperature.uniform=1.3"]))
    assert result == {"out_dir": str(tmp_path / "hf"), "pos_encoding": "nope"}
    hf = LlamaForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    model = ours(tiny_pretrained["model"], temperature=AttentionTemperature(uniform=1.3))
    ids = ids_for(hf, 96)
    assert max_gap(model(ids), hf(ids).logits) < 1e-4


@torch.no_grad()
def test_pickled_shards_load_weights_only_with_their_own_rope_theta(tmp_path):
    """``pytorch_model.bin`` (read with ``torch.load(weights_only=True)``) and a ``rope_theta`` other than 10,000."""
    hf = tiny_llama_folder(tmp_path / "hf", rope={"rope_theta": 500.0})
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    (tmp_path / "hf" / "model.safetensors").unlink()
    torch.save(weights, tmp_path / "hf" / "pytorch_model.bin")
    model = ours(f"rope:{tmp_path / 'hf'}")
    assert model.cfg.rope_base == 500.0
    ids = ids_for(hf, 60)
    assert max_gap(model(ids), hf(ids).logits) < 1e-5
    torch.save({"weights": weights, "code": print}, tmp_path / "hf" / "pytorch_model.bin")  # a pickled callable
    with pytest.raises(ValueError, match=r"pytorch_model.bin holds more than tensors, which torch.load\(weights_only"):
        import_hf(tmp_path / "hf", tmp_path / "out2", "rope")
