"""Hybrid models (per-layer NoPE/RoPE, sliding windows) and iRoPE's temperature: bit-identity with today's
models, windows against a brute-force mask, KV-cached decoding, the temperature's formula, export/load,
HeadScale's choice and the bad input refused before compute."""

from __future__ import annotations

import math

import pytest
import torch

from nope_lightning.config import (
    AttentionTemperature,
    ExtensionConfig,
    ModelConfig,
    PretrainConfig,
    TrackingConfig,
)
from nope_lightning.config.core import load_config
from nope_lightning.eval.entropy import mask_bias
from nope_lightning.eval.generate import greedy_decode
from nope_lightning.model import GPT, count_parameters
from nope_lightning.model.checkpoint import export_model, load_model
from nope_lightning.model.extension import extension_label, load_extended
from nope_lightning.model.probes import attention_logits, attention_probe, attention_probs
from nope_lightning.numerics.metrics import attention_entropy_from_qk
from nope_lightning.stages.headscale import LAMBDA, freeze_for_headscale

VOCAB = 61
L = 8  # train_len: iRoPE's F = irope_floor x L tokens


def model(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(**{"n_layer": 4, "n_head": 4, "n_embd": 32, "intermediate_size": 64, "max_positions": 128,
                         "init_std": 0.3, **kw})
    return GPT(cfg, VOCAB, train_len=L).eval()


def tokens(T: int = 40, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(seed))


IROPE = dict(pos_encoding="rope", nope_every=2, temperature=AttentionTemperature(irope_beta=0.4))
RNOPE_SWA = dict(pos_encoding="rope", nope_every=2, rope_window=5, temperature=AttentionTemperature(irope_beta=0.4))


@pytest.mark.parametrize("pattern,plain", [
    (dict(pos_encoding="rope", layer_pattern=["nope"] * 4), "nope"),
    (dict(pos_encoding="rope", nope_every=1), "nope"),
    (dict(pos_encoding="rope", layer_pattern=["rope"] * 4), "rope"),
])
def test_an_all_nope_or_all_rope_pattern_is_todays_model_to_the_bit(pattern, plain):
    hybrid, today = model(**pattern), model(pos_encoding=plain)
    assert hybrid.state_dict().keys() == today.state_dict().keys()
    assert all(torch.equal(v, today.state_dict()[k]) for k, v in hybrid.state_dict().items())
    with torch.no_grad():
        assert torch.equal(hybrid(tokens()), today(tokens()))


def test_nope_every_k_is_one_nope_layer_in_k_and_rope_window_windows_the_rope_layers():
    cfg = model(n_layer=8, **RNOPE_SWA).cfg
    assert ModelConfig(n_layer=8, pos_encoding="rope", nope_every=4).layer_encodings == ("rope",) * 3 + (
        "nope",) + ("rope",) * 3 + ("nope",)
    assert cfg.windows == (5, None) * 4
    hybrid = model(n_layer=8, **RNOPE_SWA)
    assert [a.rotates for a in hybrid.attention_layers] == [True, False] * 4
    assert [a.window for a in hybrid.attention_layers] == [5, None] * 4


def brute_force_window(T: int, window: int) -> torch.Tensor:
    """(T, T) bool: the keys j query i may see, one pair at a time."""
    return torch.tensor([[j <= i and i - j < window for j in range(T)] for i in range(T)])


@pytest.mark.parametrize("window", [1, 3, 7])
def test_a_sliding_window_layer_attends_exactly_to_its_window(window):
    """A windowed RoPE layer's attention (through the entropy probe) equals the global layer's logits of the
    same weights under a brute-force window mask; the probe's mask holds the window too."""
    T = 20
    windowed = model(pos_encoding="rope", layer_windows=[window, None, None, None])
    glob = model(pos_encoding="rope")
    captured = {}

    def keep(layer, q, k, mask):
        if layer == 0:
            captured["logits"] = attention_logits(q, k, mask)

    with torch.no_grad(), attention_probe(glob, keep):
        glob(tokens(T))
    allowed = brute_force_window(T, window)
    want = captured["logits"].masked_fill(~allowed, float("-inf")).softmax(-1)
    got = attention_probs(windowed, tokens(T), 0)
    assert torch.equal(got > 0, allowed.expand_as(got))
    assert torch.allclose(got, want, atol=1e-6)


def test_the_entropy_probe_sees_the_window():
    """The evaluation's entropy (``attention_entropy_from_qk`` with the probe's mask) of a windowed layer equals
    the entropy of its brute-force-windowed attention."""
    T, window = 20, 3
    windowed = model(pos_encoding="rope", layer_windows=[window, None, None, None])
    entropies = {}

    def record(layer, q, k, mask):
        entropies[layer] = attention_entropy_from_qk(q, k, 1.0, 7, mask_bias(mask))

    with torch.no_grad(), attention_probe(windowed, record):
        windowed(tokens(T))
    probs = attention_probs(windowed, tokens(T), 0)
    assert (probs[..., ~brute_force_window(T, window)] == 0).all()
    assert torch.allclose(entropies[0], torch.special.entr(probs).sum(-1), atol=1e-5)
    assert entropies[0].max() <= math.log(window) + 1e-5


def test_a_token_reaches_only_the_queries_whose_window_holds_it():
    """One windowed layer: changing token p changes the logits at p .. p + W - 1 and nowhere else."""
    W, p = 4, 9
    one = model(n_layer=1, pos_encoding="nope", layer_windows=[W])
    idx = tokens(24)[:1]
    changed = idx.clone()
    changed[0, p] = (changed[0, p] + 1) % VOCAB
    with torch.no_grad():
        moved = (one(idx) != one(changed)).any(-1)[0]
    assert moved.nonzero().flatten().tolist() == list(range(p, p + W))


@pytest.mark.parametrize("setting", [IROPE, RNOPE_SWA, dict(pos_encoding="nope", layer_windows=[3, None, 6, None])])
def test_kv_cached_decoding_of_a_hybrid_equals_full_forwards(setting):
    hybrid = model(**setting)
    ids = torch.randint(0, VOCAB, (3, 40), generator=torch.Generator().manual_seed(2))
    prefix = torch.tensor([12, 5, 20])
    with torch.no_grad():
        with hybrid.kv_cache(40):
            first = hybrid(ids[:, :20], input_pos=torch.zeros(3, dtype=torch.long))
            steps = [hybrid(ids[torch.arange(3), prefix + t][:, None], input_pos=prefix + t)[:, 0] for t in range(20)]
        got = torch.stack(steps, 1)
        rows = [hybrid(ids[b:b + 1, : int(prefix[b]) + 20])[0] for b in range(3)]
    for b in range(3):
        n = int(prefix[b])
        assert torch.allclose(first[b, :n], rows[b][:n], atol=1e-4, rtol=1e-5)
        assert torch.allclose(got[b], rows[b][n:n + 20], atol=1e-4, rtol=1e-5)
    prompts = [ids[b, :n].tolist() for b, n in enumerate((30, 9, 17))]
    assert (greedy_decode(hybrid, prompts, 24, vocab_size=VOCAB, eos_id=7)
            == greedy_decode(hybrid, prompts, 24, vocab_size=VOCAB, eos_id=7, use_cache=False))


@pytest.mark.parametrize("floor", [1.0, 0.75, 2.0])
def test_irope_temperature_is_its_formula_on_nope_layers_and_1_inside_floor_scale(floor):
    beta = 0.1
    hybrid = model(**{**IROPE, "temperature": AttentionTemperature(irope_beta=beta, irope_floor=floor)})
    F = floor * L
    positions = torch.tensor([[0, 3, int(F) - 2, int(F) - 1, int(F), 2 * int(F) - 1, 5 * int(F) + 3, 63]])
    for layer in hybrid.attention_layers:
        tau = layer.temperature.position_factor(positions)[0, 0, :, 0]
        if layer.rotates:  # a RoPE layer: no iRoPE temperature
            assert layer.temperature.irope is None and torch.equal(tau, torch.ones_like(tau))
            continue
        want = [1 + beta * math.log(math.floor((i + 1) / F) + 1) for i in positions[0].tolist()]
        assert torch.equal(tau, torch.tensor(want, dtype=torch.float32))
        inside = positions[0] + 1 < F
        assert inside.any() and torch.equal(tau[inside], torch.ones(int(inside.sum())))
    # Inside F the logits are the plain hybrid's to the bit (queries at positions >= F - 1 are scaled).
    plain = model(**{**IROPE, "temperature": AttentionTemperature()})
    with torch.no_grad():
        scaled, base = hybrid(tokens(30)), plain(tokens(30))
    first = math.ceil(F) - 1  # the first query with floor((i + 1) / F) >= 1
    assert torch.equal(scaled[:, :first], base[:, :first]) and not torch.allclose(scaled, base)


@pytest.fixture
def exported(tmp_path) -> str:
    cfg = PretrainConfig(model=ModelConfig(n_layer=4, n_head=4, n_embd=32, intermediate_size=64, max_positions=128,
                                           pos_encoding="rope", nope_every=4, rope_window=4), train_len=L)
    torch.manual_seed(0)
    (tmp_path / "tokenizer.json").write_text("{}")
    return str(export_model(tmp_path / "model", GPT(cfg.model, VOCAB, L), cfg, tmp_path / "tokenizer.json", {}))


def test_a_hybrid_exports_and_loads_with_its_temperature_as_an_extension(exported, tmp_path):
    tracking = TrackingConfig()
    loaded = load_model(exported, tracking)
    assert loaded.config.model.layer_encodings == ("rope", "rope", "rope", "nope")
    assert [a.window for a in loaded.model.attention_layers] == [4, 4, 4, None]
    torch.manual_seed(0)
    original = GPT(loaded.config.model, VOCAB, L).eval()
    with torch.no_grad():
        assert torch.equal(loaded.model.eval()(tokens()), original(tokens()))
    ext = ExtensionConfig(temperature=AttentionTemperature(irope_beta=0.1, irope_floor=2.0))
    extended = load_extended(exported, ext, tracking).model
    assert [a.temperature.irope for a in extended.attention_layers] == [None, None, None, (0.1, 2.0 * L)]
    assert extension_label(ext) == "irope0.1f2"


def test_headscale_trains_every_layer_of_a_hybrid():
    """The documented choice (stages/headscale.py): lambda on the RoPE layers too, not only the NoPE ones."""
    hybrid = model(**RNOPE_SWA)
    freeze_for_headscale(hybrid, LAMBDA)
    assert count_parameters(hybrid, trainable_only=True) == 4 * 4
    assert all(a.temperature.per_head.requires_grad for a in hybrid.attention_layers)


def test_a_hybrid_built_on_the_meta_device_materialises_as_fsdp_does():
    with torch.device("meta"):
        meta = GPT(ModelConfig(n_layer=4, n_head=4, n_embd=32, intermediate_size=64, max_positions=128,
                               **RNOPE_SWA), VOCAB, L)
    meta.to_empty(device="cpu")
    meta.reset_parameters()
    assert [a.window for a in meta.attention_layers] == [5, None] * 2
    assert torch.isfinite(meta(tokens())).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flash-attn needs CUDA")
def test_flash_windowed_layers_match_sdpa_on_cuda():
    pytest.importorskip("flash_attn")
    flash = model(**RNOPE_SWA, attention_backend="flash").cuda().bfloat16()
    sdpa = model(**RNOPE_SWA).cuda().bfloat16()
    with torch.no_grad():
        got, want = flash(tokens().cuda()).float(), sdpa(tokens().cuda()).float()
    assert torch.allclose(got, want, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("overrides,message", [
    (["model.pos_encoding=rope", "model.layer_pattern=[nope,rope,rope,rope,nope]"],
     "model.layer_pattern names 5 layers; the model has n_layer=4"),
    (["model.pos_encoding=rope", "model.nope_every=5"], "model.nope_every=5 names layer 4"),
    (["model.layer_windows=[0,null,null,null]"], "model.layer_windows=0 is out of range"),
    (["model.pos_encoding=rope", "model.rope_window=8193"], "model.rope_window=8193 is out of range: it must be <= 8192"),
    (["model.pos_encoding=rope", "model.temperature.irope_beta=0.1"], "iRoPE's temperature acts on NoPE layers only"),
    (["model.layer_pattern=[nope,rope,rope,rope]"], "need model.pos_encoding=rope"),
    (["model.pos_encoding=rope", "model.nope_every=2", "model.layer_pattern=[nope,rope,rope,rope]"], "give one"),
])
def test_bad_hybrid_input_is_one_line_before_compute(overrides, message):
    with pytest.raises(ValueError, match="^[^\n]+$") as err:
        load_config(PretrainConfig, overrides=overrides)
    assert message in str(err.value)


def test_an_irope_temperature_on_a_model_without_nope_layers_is_refused_at_load(tmp_path):
    cfg = PretrainConfig(model=ModelConfig(n_layer=2, n_head=4, n_embd=32, intermediate_size=64, max_positions=128,
                                           pos_encoding="rope"), train_len=L)
    (tmp_path / "tokenizer.json").write_text("{}")
    folder = export_model(tmp_path / "model", GPT(cfg.model, VOCAB, L), cfg, tmp_path / "tokenizer.json", {})
    ext = ExtensionConfig(temperature=AttentionTemperature(irope_beta=0.1))
    with pytest.raises(ValueError, match="acts on NoPE layers only and this model has none"):
        load_extended(str(folder), ext, TrackingConfig())
