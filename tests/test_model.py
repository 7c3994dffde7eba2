"""The model zoo against independent references computed here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from nope_lightning.config import (
    AttentionTemperature,
    EvaluateConfig,
    ModelConfig,
    PretrainConfig,
    RopeScalingConfig,
    load_config,
)
from nope_lightning.config.core import POS_ENCODINGS
from nope_lightning.model import GPT, count_parameters, set_temperatures, temperatures
from nope_lightning.model.attention import alibi_slopes, t5_buckets
from nope_lightning.model.gpt import APE_TOKEN_STD, sinusoidal_table
from nope_lightning.model.probes import attention_probs
from nope_lightning.model.rope_scaling import base_inv_freq, scaled_inv_freq
from nope_lightning.model.temperature import load_table, save_table
from tests.conftest import REPO

VOCAB = 97


def tiny(pe: str, **kw) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=kw.pop("n_layer", 1), n_head=4, n_embd=32, intermediate_size=64, pos_encoding=pe,
                      max_positions=512, **kw)
    return GPT(cfg, VOCAB, train_len=16).eval()


@pytest.mark.parametrize("pe,invariant", [("nope", True), ("rope", False), ("learned", False),
                                          ("sinusoidal", False), ("alibi", False), ("t5", False)])
def test_only_nope_ignores_the_order_of_earlier_tokens(pe, invariant):
    model = tiny(pe, init_std=0.5)  # sharp attention, so any position signal shows well above atol
    idx = torch.randint(0, VOCAB, (1, 12))
    perm = torch.cat([torch.randperm(11), torch.tensor([11])])
    with torch.no_grad():
        last, last_perm = model(idx)[0, -1], model(idx[:, perm])[0, -1]
    assert torch.allclose(last, last_perm, atol=1e-5) is invariant


def test_nope_has_no_positional_parameters_or_buffers():
    model = tiny("nope")
    assert list(model.named_buffers()) == []
    names = [n for n, _ in model.named_parameters()]
    assert not any(key in n for n in names for key in ("wpe", "rel_bias", "cos", "sin"))


def test_per_head_temperature_equals_explicit_softmax():
    model = tiny("nope")
    lam = torch.tensor([[0.5, 1.0, 1.7, 3.0]])
    set_temperatures(model, lam)
    attn, x = model.transformer.h[0].attn, torch.randn(2, 10, 32)
    cos = sin = torch.empty(1, 10, 0)
    with torch.no_grad():
        got = attn(x, cos, sin)
        q, k, v = attn.qkv(x).split(32, dim=-1)
        q, k, v = (t.view(2, 10, 4, 8).transpose(1, 2) for t in (q, k, v))
        logits = lam.view(1, 4, 1, 1) * (q @ k.transpose(-1, -2)) / math.sqrt(8)
        logits = logits.masked_fill(torch.ones(10, 10).triu(1).bool(), float("-inf"))
        want = attn.proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(2, 10, 32))
    assert torch.allclose(got, want, atol=1e-5)


def test_unit_temperature_reproduces_the_base_model_exactly():
    model = tiny("rope", n_layer=2)
    idx = torch.randint(0, VOCAB, (2, 20))
    with torch.no_grad():
        base = model(idx)
        set_temperatures(model, torch.full((2, 4), 1.3))
        scaled = model(idx)
        set_temperatures(model, torch.ones(2, 4))
        again = model(idx)
    assert torch.equal(base, again) and not torch.allclose(base, scaled)


def test_uniform_temperature_and_table_from_config(tmp_path):
    table = torch.tensor([[1.0, 1.1, 1.2, 1.3], [2.0, 1.0, 1.0, 1.5]])
    save_table(tmp_path / "lam.safetensors", table, {"note": "test"})
    assert torch.equal(load_table(tmp_path / "lam.json", 2, 4), table)
    model = tiny("nope", n_layer=2, temperature=AttentionTemperature(1.5, str(tmp_path / "lam.safetensors")))
    assert torch.allclose(temperatures(model), 1.5 * table)
    with pytest.raises(ValueError, match="does not match"):
        load_table(tmp_path / "lam.safetensors", 3, 4)
    # one layer reset to 1: its heads keep the uniform lambda, the other layer its learned row
    reset = AttentionTemperature(1.5, str(tmp_path / "lam.safetensors"), reset_layers=[1])
    expected = 1.5 * torch.stack([table[0], torch.ones(4)])
    assert torch.allclose(temperatures(tiny("nope", n_layer=2, temperature=reset)), expected)
    with pytest.raises(ValueError, match=r"reset_layers=\[2\]: the model has layers 0-1"):
        tiny("nope", n_layer=2, temperature=AttentionTemperature(1.5, str(tmp_path / "lam.json"), reset_layers=[2]))
    with pytest.raises(ValueError, match="reset_layers resets rows of a per-head table: set extension.temperature"):
        load_config(EvaluateConfig, None, ["checkpoint=x", "extension.temperature.reset_layers=[0]"])


def test_alibi_slopes_match_the_papers_recipe():
    def power_of_two(n):  # Press et al.'s reference recursion, written independently of ours
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    assert alibi_slopes(8).tolist() == pytest.approx([2.0**-i for i in range(1, 9)])
    assert alibi_slopes(4).tolist() == pytest.approx(power_of_two(4))
    six = power_of_two(4) + power_of_two(8)[0::2][:2]
    assert alibi_slopes(6).tolist() == pytest.approx(six)


def test_alibi_bias_is_minus_slope_times_distance():
    model = tiny("alibi")
    bias = model.attention_bias(torch.arange(5)[None], 5, torch.float32)[0]
    slopes = alibi_slopes(4)
    assert bias[2, 4, 1].item() == pytest.approx(-3 * slopes[2].item())
    assert torch.isinf(bias[:, 1, 3]).all() and bias[:, 3, 3].eq(0).all()


def test_t5_buckets_by_hand():
    d = torch.tensor([0, 1, 15, 16, 20, 32, 64, 127, 128, 1000])
    # exact below 16; above, 16 + floor(16 * log(d/16) / log(128/16)), capped at 31
    assert t5_buckets(d, 32, 128).tolist() == [0, 1, 15, 16, 17, 21, 26, 31, 31, 31]


def test_rope_scaling_tables_follow_their_formulas():
    d, base, L, s = 16, 10000.0, 64, 4.0
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    assert torch.allclose(base_inv_freq(d, base), theta)
    pi, m = scaled_inv_freq(d, base, RopeScalingConfig("pi", s), L, L)
    assert torch.allclose(pi, theta / s) and m == 1.0
    ntk, _ = scaled_inv_freq(d, base, RopeScalingConfig("ntk", s), L, L)
    assert torch.allclose(ntk, (base * s ** (d / (d - 2))) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d))
    assert ntk[0] == theta[0] and ntk[-1] / theta[-1] == pytest.approx(1 / s)  # NTK: low freq interpolated
    dyn_short, _ = scaled_inv_freq(d, base, RopeScalingConfig("dynamic_ntk", s), L, L)
    dyn_long, _ = scaled_inv_freq(d, base, RopeScalingConfig("dynamic_ntk", s), L, 3 * L)
    alpha = s * 3 - (s - 1)
    assert torch.allclose(dyn_short, theta)
    assert torch.allclose(dyn_long, (base * alpha ** (d / (d - 2))) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d))
    # YaRN (both ramps) is held against its references in test_yarn.py.


def test_pi_with_factor_s_equals_positions_divided_by_s():
    # PI at factor 2: position 2p gets the angles of position p without scaling.
    plain, scaled = tiny("rope"), tiny("rope", rope_scaling=RopeScalingConfig("pi", 2.0))
    cos, sin = plain.rope_tables(8, torch.device("cpu"))
    cos2, sin2 = scaled.rope_tables(16, torch.device("cpu"))
    assert torch.allclose(cos2[0, 0::2], cos[0], atol=1e-6) and torch.allclose(sin2[0, 0::2], sin[0], atol=1e-6)


def test_attention_probs_are_causal_distributions():
    model = tiny("t5", n_layer=2)
    probs = attention_probs(model, torch.randint(0, VOCAB, (2, 9)), layer=1)
    assert probs.shape == (2, 4, 9, 9)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 4, 9))
    assert probs.triu(1).abs().max() == 0


def test_grouped_query_attention_and_length_guard():
    model = tiny("nope", n_query_groups=2)
    assert model.transformer.h[0].attn.qkv.out_features == (4 + 2 * 2) * 8
    assert model(torch.randint(0, VOCAB, (1, 7))).shape == (1, 7, model.config.padded_vocab_size)
    with pytest.raises(ValueError, match="max_positions"):
        model(torch.zeros(1, 513, dtype=torch.long))


def test_flash_backend_falls_back_to_sdpa_on_cpu_with_a_warning():
    model = tiny("nope", attention_backend="flash")
    reference = tiny("nope")
    idx = torch.randint(0, VOCAB, (1, 6))
    with pytest.warns(UserWarning, match="falls back to SDPA"):
        out = model(idx)
    assert torch.allclose(out, reference(idx))


def test_tinyllama_config_has_1_1b_parameters_on_meta_device():
    cfg = load_config(PretrainConfig, REPO / "conf/pretrain/tinyllama-1.1b.yaml")
    with torch.device("meta"):
        model = GPT(cfg.model, cfg.data.vocab_size, cfg.train_len)
    n = count_parameters(model) - cfg.model.n_layer * cfg.model.n_head  # minus the 704 temperatures
    assert n == pytest.approx(1_100_048_384, rel=1e-3)  # TinyLlama-1.1B's published count


# --- APE at the reference's scale ---------------------------------------------------------------------


def reference_sinusoid(positions: int, dim: int) -> np.ndarray:
    """The reference's ``FixedAbsolutePositionalEmbedding`` table (McGill-NLP/length-generalization): sin of every
    frequency, then cos of every frequency, in float32 (ours interleaves them; the RMS is the same)."""
    inv_freq = 1.0 / 10000 ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
    angles = np.arange(positions, dtype=np.float32)[:, None] * inv_freq
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)


def test_ape_token_to_position_rms_ratio_is_the_references():
    # The reference adds that table to T5 token embeddings drawn N(0, 1.0 * initializer_factor = 1).
    positions, dim = 512, 64
    table = reference_sinusoid(positions, dim)
    reference_ratio = 1.0 / float(np.sqrt((table**2).mean()))
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=4, n_embd=dim, intermediate_size=128, pos_encoding="sinusoidal",
                            max_positions=positions), 500, train_len=16)
    ours = sinusoidal_table(torch.arange(positions), dim)
    ratio = float(model.transformer.wte.weight.pow(2).mean().sqrt() / ours.pow(2).mean().sqrt())
    assert reference_ratio == pytest.approx(math.sqrt(2), rel=0.01)
    assert ratio == pytest.approx(reference_ratio, rel=0.03)


def gpt2_init(model: GPT) -> None:
    """The GPT-2 init written out here: N(0, init_std), residual output projections / sqrt(2 n_layer)."""
    std, layers = model.cfg.init_std, model.cfg.n_layer
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear | nn.Embedding):
            scaled = name.endswith(("attn.proj", "mlp.proj"))
            nn.init.normal_(module.weight, 0.0, std / math.sqrt(2 * layers) if scaled else std)


@pytest.mark.parametrize("pe", POS_ENCODINGS)
def test_only_ape_leaves_the_gpt2_init_and_only_in_its_token_embeddings(pe):
    model, reference = tiny(pe, n_layer=2), tiny(pe, n_layer=2)
    torch.manual_seed(1)
    model.reset_parameters()
    torch.manual_seed(1)
    gpt2_init(reference)
    idx = torch.randint(0, VOCAB, (2, 20))
    with torch.no_grad():
        same_logits = torch.equal(model(idx), reference(idx))
    differing = [k for k, v in model.state_dict().items() if not torch.equal(v, reference.state_dict()[k])]
    assert same_logits is (pe != "sinusoidal")
    assert differing == ([] if pe != "sinusoidal" else ["transformer.wte.weight"])
    if pe == "sinusoidal":  # the same draw at another scale
        ratio = APE_TOKEN_STD / model.cfg.init_std
        assert torch.allclose(model.transformer.wte.weight, reference.transformer.wte.weight * ratio, rtol=1e-5)
