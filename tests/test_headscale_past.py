"""HeadScale past L: a per-head lambda applied at query positions i >= L only. Inside L the model is NoPE bit for
bit (full forward, KV-cached decoding, the positions < L of a longer sequence); past L the attention equals an
explicit softmax with lambda_h on those queries; lambda's gradient comes from the queries past L only; the stage
trains and saves a table that evaluate reloads with ``past_only``; bad input is refused in one line before any
compute. The two claims about the method are tested on synthetic runs in ``tests/test_claims.py``."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from nope_lightning.config import (
    AttentionTemperature,
    ExtensionConfig,
    ModelConfig,
    PretrainConfig,
    TrackingConfig,
)
from nope_lightning.model import GPT, set_temperatures, temperatures
from nope_lightning.model.checkpoint import export_model, load_model
from nope_lightning.model.extension import extension_label, load_extended
from nope_lightning.model.probes import attention_probs
from nope_lightning.model.temperature import PER_HEAD_PAST, save_table, set_past_only, train_only
from nope_lightning.results import HeadScaleResult
from nope_lightning.runtime.tracking import download
from nope_lightning.stages import headscale
from tests.test_headscale import TARGET, Recorder, config
from tests.test_position_temperature import (
    HS,
    LAMBDAS,
    VOCAB,
    H,
    L,
    explicit_attention,
    layer_output,
    one_line_error,
)

#: A hybrid with one NoPE layer (layer 1) and one RoPE layer: it has NoPE layers, so lambda past L applies (to both).
HYBRID = {"pos_encoding": "rope", "layer_pattern": ["rope", "nope"]}


def model(past: bool, n_layer: int = 2, **kw) -> GPT:
    """A random tiny model (seeded: every call builds the same weights) at L = 8; ``past``: with the per-head
    lambdas ``LAMBDAS`` applied past L only (else plain NoPE/hybrid, lambda 1)."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=n_layer, n_head=H, n_embd=H * HS, intermediate_size=64, max_positions=128,
                      init_std=0.3, **{"pos_encoding": "nope", **kw})
    gpt = GPT(cfg, VOCAB, train_len=L).eval()
    if past:
        set_temperatures(gpt, LAMBDAS[:n_layer])
        set_past_only(gpt, True)
    return gpt


def ids(T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kw", [{}, HYBRID], ids=["nope", "hybrid"])
def test_inside_L_the_model_is_the_plain_one_bit_for_bit(kw):
    plain, past = model(False, **kw), model(True, **kw)
    long = ids(3 * L)
    with torch.no_grad():
        for T in (1, L // 2, L):
            assert torch.equal(past(long[:, :T]), plain(long[:, :T]))
        # In a longer sequence the positions < L see keys < L only (causal), so theirs are identical too ...
        assert torch.equal(past(long)[:, :L], plain(long)[:, :L])
        # ... and from L on lambda acts: every later position differs.
        gap = (past(long)[:, L:] - plain(long)[:, L:]).abs().amax(dim=(0, 2))
    assert bool((gap > 1e-3).all()), gap


def test_cached_decoding_applies_lambda_by_absolute_position():
    """Prefill 5 tokens, then decode one at a time to 3L: positions < L equal the plain model's cached decode bit
    for bit; every position equals the full forward's (float64, so no rounding is left to tolerate)."""
    plain, past = model(False).double(), model(True).double()
    tokens = ids(3 * L, seed=2)

    def decode(gpt: GPT) -> torch.Tensor:
        with torch.no_grad(), gpt.kv_cache(3 * L):
            first = gpt(tokens[:, :5], input_pos=torch.zeros(3, dtype=torch.long))
            steps = [gpt(tokens[:, t:t + 1], input_pos=torch.full((3,), t))[:, 0] for t in range(5, 3 * L)]
        return torch.cat([first, torch.stack(steps, 1)], 1)

    cached, cached_plain = decode(past), decode(plain)
    with torch.no_grad():
        full = past(tokens)
    assert torch.equal(cached[:, :L], cached_plain[:, :L])
    assert torch.allclose(cached, full, atol=1e-10, rtol=0)
    assert not torch.allclose(cached[:, L:], cached_plain[:, L:], atol=1e-4)


@pytest.mark.parametrize("kw", [{}, HYBRID], ids=["nope", "hybrid-rope-layer"])
def test_past_L_the_attention_is_the_softmax_with_lambda_on_those_queries(kw):
    """Layer 0's output and the probe's probabilities against ``softmax(m_h(i) q_i.k_j / sqrt(d))`` written out
    (``explicit_attention``), m_h(i) = lambda_h for i >= L and 1 inside (its tau is 1 / lambda_h there); in the
    hybrid, layer 0 is its RoPE layer, which lambda past L scales too."""
    gpt = model(True, **kw)
    lambdas = LAMBDAS[0].tolist()
    tokens = ids(4 * L, seed=3)
    with torch.no_grad():
        probs, out, x = explicit_attention(gpt, tokens, lambda h, i: 1.0 if i >= L else 1.0 / lambdas[h])
        assert torch.allclose(layer_output(gpt, x), out, atol=1e-5)
        assert torch.allclose(attention_probs(gpt, tokens, 0), probs, atol=1e-6)
        everywhere, _, _ = explicit_attention(gpt, tokens, lambda h, i: 1.0)  # lambda at every position
    assert torch.allclose(probs[:, :, L:], everywhere[:, :, L:], atol=1e-6)
    assert not torch.allclose(probs[:, :, :L], everywhere[:, :, :L], atol=1e-3)


def test_lambda_gets_its_gradient_from_the_queries_past_L_only():
    gpt = model(True)
    train_only(gpt, "per_head")
    tokens = ids(3 * L, seed=4)

    def grad(positions: slice) -> torch.Tensor:
        gpt.zero_grad()
        gpt(tokens)[:, positions].logsumexp(-1).sum().backward()
        return torch.stack([layer.attn.temperature.per_head.grad.clone() for layer in gpt.transformer.h])

    inside, past, every = grad(slice(0, L)), grad(slice(L, None)), grad(slice(None))
    assert torch.equal(inside, torch.zeros_like(inside))  # exactly zero, not small
    assert bool((past.abs() > 0).all())
    assert torch.allclose(every, past, atol=1e-6, rtol=1e-5)


# --- the stage -------------------------------------------------------------------------------------------


def test_the_stage_tunes_lambda_past_L_and_evaluate_reloads_it(tiny_pretrained, tmp_path):
    probe = ids(TARGET, seed=5)
    recorder = Recorder(probe)
    result = headscale.run(config(tiny_pretrained, tmp_path, "steps=3", "parameterization=lambda_past"),
                           callbacks=[recorder])
    tracking = TrackingConfig(**{k.removeprefix("tracking."): v for k, v in
                                 (o.split("=", 1) for o in tiny_pretrained["tracking"])})
    base = load_model(tiny_pretrained["model"], tracking).model
    n_layer, n_head, train_len = base.cfg.n_layer, base.cfg.n_head, base.train_len
    names = {f"transformer.h.{i}.attn.temperature.per_head" for i in range(n_layer)}
    assert recorder.with_grad == [names] * 3 and result["table"].endswith("headscale/lambda_past.safetensors")
    assert all(bool((t >= headscale.CONSTRAINED_FLOOR).all()) for t in recorder.tables)
    assert not torch.equal(recorder.tables[-1], torch.ones(n_layer, n_head))

    with safe_open(result["table"], "pt") as f:
        assert f.metadata()["past_only"] == "true" and f.metadata()["target_len"] == str(TARGET)
    summary = json.loads((tmp_path / "hs/headscale/lambda_past.json").read_text())
    assert summary["units"] == PER_HEAD_PAST.units
    ext = ExtensionConfig(temperature=AttentionTemperature(table=result["table"], past_only=True))
    reloaded = load_extended(tiny_pretrained["model"], ext, tracking).model
    assert torch.equal(temperatures(reloaded), recorder.tables[-1])
    with torch.no_grad():
        assert torch.equal(reloaded(probe), recorder.logits)
        # the tuned model is the untuned one on every position < L of the tuning windows
        assert torch.equal(recorder.logits[:, :train_len], base(probe)[:, :train_len])
        assert not torch.allclose(recorder.logits[:, train_len:], base(probe)[:, train_len:], atol=1e-4)
    assert extension_label(ext) == "table-past"
    one_line_error(lambda: load_extended(tiny_pretrained["model"], ExtensionConfig(
        temperature=AttentionTemperature(table=result["table"])), tracking), "tuned past L only.*past_only=true")
    headscale_json = HeadScaleResult.load(download(tracking, result["run_id"], "headscale.json"))
    assert (headscale_json.units, headscale_json.symbol) == (PER_HEAD_PAST.units, "lambda")
    assert len(headscale_json.converged_entropy.per_head) == n_layer


# --- bad input ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [{"pos_encoding": "rope"}, {"pos_encoding": "alibi"},
                                {"pos_encoding": "rope", "layer_pattern": ["rope", "rope"]}],
                         ids=["rope", "alibi", "hybrid-all-rope"])
def test_a_model_without_nope_layers_is_refused_at_load(kw):
    settings = AttentionTemperature(uniform=1.5, past_only=True)
    one_line_error(lambda: model(False, temperature=settings, **kw), "past_only=true: .* has no NoPE layer")


def test_past_only_without_a_lambda_to_apply_is_refused_at_config_time():
    one_line_error(lambda: ExtensionConfig(temperature=AttentionTemperature(past_only=True)),
                   r"extension.temperature.past_only=true .* none to apply")
    ExtensionConfig(temperature=AttentionTemperature(uniform=1.3, past_only=True))  # a uniform lambda past L is one


def test_the_stage_refuses_a_rope_model_before_any_compute(tmp_path):
    cfg = PretrainConfig(model=ModelConfig(n_layer=2, n_head=H, n_embd=H * HS, intermediate_size=64,
                                           pos_encoding="rope", max_positions=128), train_len=L)
    (tmp_path / "tokenizer.json").write_text("{}")
    export = export_model(tmp_path / "model", GPT(cfg.model, VOCAB, L), cfg, tmp_path / "tokenizer.json", {})
    hs = headscale.HeadScaleConfig(checkpoint=str(export), target_len=4 * L, init="default",
                                   parameterization="lambda_past", out_dir=str(tmp_path / "hs"))
    one_line_error(lambda: headscale.run(hs), "parameterization=lambda_past: .* has no NoPE layer")
    assert not (tmp_path / "hs").exists()


def test_a_hand_made_table_applies_past_L_or_everywhere(tmp_path):
    """A table without HeadScale past L's metadata may be applied either way; only a past-L table needs past_only."""
    save_table(tmp_path / "t.safetensors", LAMBDAS)
    table = str(tmp_path / "t.safetensors")
    past = model(False, temperature=AttentionTemperature(table=table, past_only=True))
    everywhere = model(False, temperature=AttentionTemperature(table=table))
    with torch.no_grad():
        assert torch.equal(past(ids(3 * L)), model(True)(ids(3 * L)))
        assert not torch.allclose(everywhere(ids(L)), model(False)(ids(L)), atol=1e-4)
