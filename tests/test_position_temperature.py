"""Position-aware temperatures (log-length scaling, HeadScale-log's slopes, SSMax) against explicit softmaxes
whose per-query temperature is computed here with ``math``; bit-identity inside the training length; KV-cached
decoding; HeadScale-log's gradients; one-line errors for bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from litgpt.model import apply_rope
from safetensors.torch import load_file, save_file

from nope_lightning.config import (
    AttentionTemperature,
    ExtensionConfig,
    HeadScaleConfig,
    ModelConfig,
    PretrainConfig,
    TrackingConfig,
    load_config,
)
from nope_lightning.model import GPT, set_temperatures
from nope_lightning.model.checkpoint import export_model, load_model
from nope_lightning.model.extension import extension_label, fitted_slope, load_extended
from nope_lightning.model.probes import attention_probs
from nope_lightning.model.temperature import (
    LOG_SLOPE,
    load_table,
    log_slopes,
    save_table,
    set_log_slopes,
    ssmax_init,
)
from nope_lightning.results import HeadScaleResult, LogFit, ScaleSearchResult
from nope_lightning.stages.headscale import LOG, HeadScaleLM
from nope_lightning.training.module import lm_loss
from tests.conftest import REPO

VOCAB, L, H, HS = 61, 8, 4, 8
LAMBDAS = torch.tensor([[0.7, 1.0, 1.4, 2.2], [1.2, 0.9, 1.0, 1.6]])  # per-head temperatures (2 layers)
SLOPES = torch.tensor([[0.0, 0.3, 0.9, 2.0], [0.5, 0.1, 1.5, 0.0]])  # per-head log-length slopes a


def tiny(pe: str = "nope", n_layer: int = 1, log_slope: float = 0.0, **kw) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=n_layer, n_head=H, n_embd=H * HS, intermediate_size=64, pos_encoding=pe,
                      max_positions=128, init_std=0.3, temperature=AttentionTemperature(log_slope=log_slope), **kw)
    return GPT(cfg, VOCAB, train_len=L).eval()


def log_tau(a: float, i: int) -> float:
    """The log-length temperature of the query at position i, written out with math."""
    return max(1.0, 1.0 + a * math.log((i + 1) / L))


def explicit_attention(model: GPT, idx: torch.Tensor, tau) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer 0 by hand: probabilities (B, H, T, T) of ``softmax(lambda_h tau(h, i) q_i.k_j / sqrt(d) + bias)``,
    the attention output (B, T, C) and the layer's normalised input x (B, T, C)."""
    block, T = model.transformer.h[0], idx.size(1)
    x = block.norm_1(model.transformer.wte(idx))
    attn = block.attn
    q, k, v = (t.view(idx.size(0), T, H, HS).transpose(1, 2) for t in attn.qkv(x).split(H * HS, dim=-1))
    if model.cfg.pos_encoding == "rope":
        cos, sin = model.rope_tables(T, idx.device)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    temp = torch.tensor([[attn.temperature.per_head[h].item() * tau(h, i) for i in range(T)] for h in range(H)])
    logits = temp[None, :, :, None] * (q @ k.transpose(-1, -2)) / math.sqrt(HS)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    if model.cfg.pos_encoding == "alibi":
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])
        logits = logits - slopes[:, None, None] * (i - j).clamp(min=0)
    probs = logits.masked_fill(j > i, float("-inf")).softmax(-1)
    out = attn.proj((probs @ v).transpose(1, 2).reshape(idx.size(0), T, H * HS))
    return probs, out, x


def layer_output(model: GPT, x: torch.Tensor) -> torch.Tensor:
    T = x.size(1)
    cos, sin = model.rope_tables(T, x.device)
    mask = None if model.cfg.pos_encoding != "alibi" else model.attention_bias(torch.arange(T)[None], T, x.dtype)
    return model.transformer.h[0].attn(x, cos, sin, mask)


@pytest.mark.parametrize("per_head", [False, True], ids=["uniform", "per-head"])
@pytest.mark.parametrize("pe", ["nope", "alibi"])
def test_log_scaling_equals_explicit_softmax_with_position_temperature(pe, per_head):
    """Output and the probe's probabilities (its q carries the temperature) against the hand computation, at
    T = 4L so most queries lie beyond L; per-head: a lambda table and a slope table together."""
    model = tiny(pe, log_slope=0.0 if per_head else 0.8)
    if per_head:
        set_temperatures(model, LAMBDAS[:1])
        set_log_slopes(model, SLOPES[:1])
    slopes = SLOPES[0] if per_head else torch.full((H,), 0.8)
    idx = torch.randint(0, VOCAB, (2, 4 * L), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        probs, out, x = explicit_attention(model, idx, lambda h, i: log_tau(float(slopes[h]), i))
        assert torch.allclose(layer_output(model, x), out, atol=1e-5)
        assert torch.allclose(attention_probs(model, idx, 0), probs, atol=1e-6)
        plain, _, _ = explicit_attention(model, idx, lambda h, i: 1.0)
    assert not torch.allclose(probs[:, :, L:], plain[:, :, L:], atol=1e-3)  # the scaling really acts beyond L


@pytest.mark.parametrize("pe", ["nope", "alibi", "rope"])
def test_ssmax_logits_equal_hand_computation(pe):
    """SSMax multiplies query i's logits by s_h ln(i + 1): ln 1 = 0 makes position 0 uniform over its one
    key; with the init s = 1 / ln L the multiplier is 1 at n = L."""
    model = tiny(pe, ssmax=True)
    layer = model.transformer.h[0].attn.temperature
    assert torch.allclose(layer.ssmax, torch.full((H,), 1 / math.log(L)))
    assert torch.allclose(layer.position_factor(torch.tensor([[L - 1]])), torch.ones(1, H, 1, 1))
    s = [0.3, 0.55, 1.0, 2.5]
    with torch.no_grad():
        layer.ssmax.copy_(torch.tensor(s))
        set_temperatures(model, LAMBDAS[1:])
    idx = torch.randint(0, VOCAB, (2, 3 * L), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        probs, out, x = explicit_attention(model, idx, lambda h, i: s[h] * math.log(i + 1))
        assert torch.allclose(layer_output(model, x), out, atol=1e-5)
        assert torch.allclose(attention_probs(model, idx, 0), probs, atol=1e-6)


@pytest.mark.parametrize("pe", ["nope", "alibi", "rope"])
def test_log_scaling_is_exactly_one_inside_train_len(pe):
    """Logits of sequences of up to L tokens are bit-identical to the plain model's; beyond L they differ."""
    plain = tiny(pe, n_layer=2)
    scaled = tiny(pe, n_layer=2, log_slope=1.5)
    per_head = tiny(pe, n_layer=2)
    set_log_slopes(per_head, SLOPES)
    positions = torch.arange(L)[None]
    assert torch.equal(scaled.transformer.h[0].attn.temperature.position_factor(positions), torch.ones(1, H, L, 1))
    idx = torch.randint(0, VOCAB, (3, 3 * L), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for model in (scaled, per_head):
            for T in (1, L // 2, L):
                assert torch.equal(model(idx[:, :T]), plain(idx[:, :T]))
            assert not torch.allclose(model(idx)[:, L:], plain(idx)[:, L:], atol=1e-4)


SETTINGS = {
    "nope+log": dict(pe="nope", log_slope=0.9),
    "alibi+log-table+lambda-table": dict(pe="alibi"),
    "nope+ssmax": dict(pe="nope", ssmax=True),
    "rope+ssmax+log": dict(pe="rope", ssmax=True, log_slope=0.4),
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_cached_decoding_equals_full_forward(setting):
    """Prefill a prefix per row, then one token at a time at per-row positions well beyond L: every logit equals
    the full forward's (the temperature follows the cache's input positions, not arange(T)). In float64, so
    that the sharp temperatures here leave no float32 rounding to tolerate."""
    kw = dict(SETTINGS[setting])
    model = tiny(kw.pop("pe"), n_layer=2, **kw)
    if setting.startswith("alibi"):
        set_temperatures(model, LAMBDAS)
        set_log_slopes(model, SLOPES)
    model.double()
    ids = torch.randint(0, VOCAB, (3, 40), generator=torch.Generator().manual_seed(4))
    prefix = torch.tensor([12, 5, 20])
    with torch.no_grad():
        with model.kv_cache(40):
            first = model(ids[:, :20], input_pos=torch.zeros(3, dtype=torch.long))
            steps = [model(ids[torch.arange(3), prefix + t][:, None], input_pos=prefix + t)[:, 0] for t in range(20)]
        got = torch.stack(steps, 1)
        rows = [model(ids[b:b + 1, : int(prefix[b]) + 20])[0] for b in range(3)]
    for b in range(3):
        n = int(prefix[b])
        assert torch.allclose(first[b, :n], rows[b][:n], atol=1e-10, rtol=0)
        assert torch.allclose(got[b], rows[b][n:n + 20], atol=1e-10, rtol=0)


def test_headscale_log_step_moves_only_the_slopes():
    """After a training step only the n_layer x n_head slopes require and hold a gradient (every other
    parameter: requires_grad False, .grad None); the step moves them; the projection keeps a >= 0."""
    model = tiny("nope", n_layer=2)
    set_log_slopes(model, torch.full((2, H), 0.5))
    optim = HeadScaleConfig(checkpoint="x", target_len=4 * L, init="default").optim
    module = HeadScaleLM(model, LOG, optim, 10, LOG.floor(True))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = module.configure_optimizers()["optimizer"]
    batch = torch.randint(0, VOCAB, (2, 4 * L + 1), generator=torch.Generator().manual_seed(5))
    lm_loss(module(batch[:, :-1]), batch[:, 1:]).backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"transformer.h.{i}.attn.temperature.log_slope" for i in range(2)}
    for name, p in model.named_parameters():
        assert (p.grad is not None) == (name in trainable), name
    assert all(bool(p.grad.abs().min() > 0) for n, p in model.named_parameters() if n in trainable)
    optimizer.step()
    module.project()
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]) != (name in trainable), name
    with torch.no_grad():
        model.transformer.h[0].attn.temperature.log_slope.fill_(-0.3)
    module.project()
    assert float(log_slopes(model).min()) == 0.0


def test_a_headscale_checkpoint_written_before_the_rename_resumes_its_values():
    """A HeadScale-log training checkpoint holding ``attn.position_temperature.log_scale`` restores the slopes."""
    model = tiny("nope", n_layer=2)
    set_log_slopes(model, torch.full((2, H), 0.5))
    module = HeadScaleLM(model, LOG, HeadScaleConfig(checkpoint="x", target_len=4 * L, init="default").optim, 10,
                         LOG.floor(True))
    checkpoint = {"state_dict": {f"model.transformer.h.{i}.attn.position_temperature.log_scale": SLOPES[i]
                                 for i in range(2)}}
    module.on_load_checkpoint(checkpoint)
    module.load_state_dict(checkpoint["state_dict"], strict=False)
    assert torch.equal(log_slopes(model), SLOPES)


@pytest.fixture
def export(tmp_path) -> str:
    """A random tiny model exported as pretrain would (config, weights, tokenizer, meta)."""
    cfg = PretrainConfig(model=ModelConfig(n_layer=2, n_head=H, n_embd=H * HS, intermediate_size=64,
                                           max_positions=128), train_len=L)
    torch.manual_seed(0)
    (tmp_path / "tokenizer.json").write_text("{}")
    return str(export_model(tmp_path / "model", GPT(cfg.model, VOCAB, L), cfg, tmp_path / "tokenizer.json", {}))


def extension(**temperature) -> ExtensionConfig:
    return ExtensionConfig(temperature=AttentionTemperature(**temperature))


def search_result(path, fingerprint: str, a: float) -> str:
    path.write_text(json.dumps({"model_fingerprint": fingerprint, "train_len": 64, "best": {},
                                "fit": {"a": a, "r2": 0.9}}))
    return str(path)


def test_evaluate_takes_slopes_from_a_fit_a_number_or_a_table(export, tmp_path):
    tracking = TrackingConfig()
    fingerprint = load_model(export, tracking).fingerprint
    ext = extension(log_slope_fit=search_result(tmp_path / "scale_search.json", fingerprint, 0.35))
    model = load_extended(export, ext, tracking).model
    assert torch.equal(log_slopes(model), torch.full((2, H), 0.35))
    model = load_extended(export, extension(log_slope=0.6), tracking).model
    assert torch.equal(log_slopes(model), torch.full((2, H), 0.6))
    save_table(tmp_path / "a.safetensors", SLOPES, kind=LOG_SLOPE)
    assert torch.equal(load_table(tmp_path / "a.json", 2, H, LOG_SLOPE), SLOPES)
    ext = extension(log_slope_table=str(tmp_path / "a.safetensors"), uniform=1.2)
    model = load_extended(export, ext, tracking).model
    assert torch.equal(log_slopes(model), SLOPES)
    assert log_slopes(load_model(export, tracking).model) is None  # never part of the export
    assert [extension_label(extension(log_slope=0.6)), extension_label(ext)] == ["log0.6", "lam1.2-logtable"]


def one_line_error(fn, match: str) -> None:
    with pytest.raises(ValueError, match=match) as err:
        fn()
    assert "\n" not in str(err.value)


def test_an_export_written_before_the_temperature_rename_loads(tmp_path):
    """An export whose config has the flat keys (``model.temperature: 1.3``, ``log_scale_a``, ...) and whose
    weights are named ``attn.head_scale`` / ``attn.position_temperature.ssmax`` loads as the same model."""
    temperature = AttentionTemperature(uniform=1.3, log_slope=0.4)
    cfg = PretrainConfig(model=ModelConfig(n_layer=2, n_head=H, n_embd=H * HS, intermediate_size=64,
                                           max_positions=128, ssmax=True, temperature=temperature), train_len=L)
    torch.manual_seed(0)
    model = GPT(cfg.model, VOCAB, L)
    with torch.no_grad():
        for attn in model.attention_layers:
            attn.temperature.ssmax.uniform_(0.2, 0.8)
    (tmp_path / "tokenizer.json").write_text("{}")
    folder = export_model(tmp_path / "model", model, cfg, tmp_path / "tokenizer.json", {})
    probe = torch.randint(0, VOCAB, (2, 3 * L), generator=torch.Generator().manual_seed(6))
    current = load_model(str(folder), TrackingConfig())

    doc = yaml.safe_load((folder / "config.yaml").read_text())
    doc["model"].pop("temperature")
    doc["model"].update(temperature=1.3, temperature_table="", log_scale_a=0.4, log_scale_table="")
    (folder / "config.yaml").write_text(yaml.safe_dump(doc))
    old_names = {".attn.temperature.per_head": ".attn.head_scale",
                 ".attn.temperature.ssmax": ".attn.position_temperature.ssmax"}
    state = load_file(str(folder / "model.safetensors"))
    save_file({next((k.replace(new, old) for new, old in old_names.items() if k.endswith(new)), k): v
               for k, v in state.items()}, str(folder / "model.safetensors"))
    assert "transformer.h.0.attn.position_temperature.ssmax" in load_file(str(folder / "model.safetensors"))

    legacy = load_model(str(folder), TrackingConfig())
    assert legacy.config == current.config and legacy.config.model.temperature == temperature
    with torch.no_grad():
        assert torch.equal(legacy.model.eval()(probe), current.model.eval()(probe))


def test_bad_input_is_one_line_error(export, tmp_path):
    tracking = TrackingConfig()
    fingerprint = load_model(export, tracking).fingerprint
    one_line_error(lambda: load_config(PretrainConfig, None, ["model.temperature.log_slope=-0.2"]),
                   r"model.temperature.log_slope=-0.2 is out of range: it must be >= 0")
    one_line_error(lambda: load_config(ExtensionConfig, None, ["temperature.log_slope=-1"]),
                   r"extension.temperature.log_slope=-1.0 is out of range: it must be >= 0")
    for pe in ("t5", "learned", "sinusoidal"):
        overrides = ["model.ssmax=true", f"model.pos_encoding={pe}"]
        one_line_error(lambda o=overrides: load_config(PretrainConfig, None, o), f"ssmax=true supports .* not {pe}")
    one_line_error(lambda: extension(log_slope=0.3, log_slope_fit="run"), "give one")
    one_line_error(lambda: ModelConfig(temperature=AttentionTemperature(log_slope=0.3, log_slope_table="a.json")),
                   "give one")
    # A model config holds resolved settings: no scale-search reference, no runs:/ artifact.
    one_line_error(lambda: ModelConfig(temperature=AttentionTemperature(log_slope_fit="run")),
                   r"model.temperature.log_slope_fit: .* extension.temperature.log_slope_fit")
    one_line_error(lambda: load_config(PretrainConfig, None, ["model.temperature.table=runs:/x/lambda.json"]),
                   r"model.temperature.table: a model reads a local file")
    one_line_error(lambda: HeadScaleConfig(checkpoint="x", target_len=32, init="default", parameterization="log",
                                           constraint=False), "no constraint=false")
    other = search_result(tmp_path / "other.json", "0" * 64, 0.3)
    one_line_error(lambda: load_extended(export, extension(log_slope_fit=other), tracking), "another model")
    negative = search_result(tmp_path / "negative.json", fingerprint, -0.2)
    one_line_error(lambda: load_extended(export, extension(log_slope_fit=negative), tracking), "a >= 0")
    one_line_error(lambda: fitted_slope(ScaleSearchResult(64, {}, model_fingerprint="f", fit=LogFit()), "ref"),
                   "no fit a")
    save_table(tmp_path / "neg.safetensors", -SLOPES - 0.1, kind=LOG_SLOPE)
    negative_table = AttentionTemperature(log_slope_table=str(tmp_path / "neg.safetensors"))
    one_line_error(lambda: load_model(export, tracking, temperature=negative_table), ">= 0")
    assert ssmax_init(L) == pytest.approx(1 / math.log(L))


def test_headscale_log_stage_trains_slopes_that_evaluate_reloads(tiny_pretrained, tmp_path):
    """``headscale parameterization=log`` end to end: only the slopes get gradients (every step), they stay
    >= 0 and move; the saved table, loaded through evaluate's ``extension.temperature.log_slope_table=runs:/…``,
    gives the trained model's logits exactly, which equal the plain model's up to train_len."""
    from lightning.pytorch.callbacks import Callback

    from nope_lightning.runtime import tracking
    from nope_lightning.stages import headscale

    class Recorder(Callback):
        def __init__(self) -> None:
            self.with_grad, self.tables = [], []

        def on_after_backward(self, trainer, module) -> None:
            self.with_grad.append({n for n, p in module.model.named_parameters() if p.grad is not None})

        def on_train_batch_end(self, trainer, module, *args) -> None:
            self.tables.append(log_slopes(module.model).clone())

        def on_train_end(self, trainer, module) -> None:
            with torch.no_grad():
                self.logits = module.model(probe)

    values = dict(o.split("=", 1) for o in tiny_pretrained["tracking"])
    store = TrackingConfig(uri=values["tracking.uri"], artifact_root=values["tracking.artifact_root"])
    export = tiny_pretrained["model"]
    base = load_model(export, store).model
    probe = torch.randint(0, 500, (2, 2 * base.train_len), generator=torch.Generator().manual_seed(0))
    cfg = load_config(HeadScaleConfig, str(REPO / "conf/headscale/tiny.yaml"),
                      [*tiny_pretrained["tracking"], f"checkpoint={export}", f"out_dir={tmp_path}/hs", "steps=4",
                       "parameterization=log", "init=0.5", "trainer.progress_bar=false"])
    recorder = Recorder()
    result = headscale.run(cfg, callbacks=[recorder])
    names = {f"transformer.h.{i}.attn.temperature.log_slope" for i in range(base.cfg.n_layer)}
    assert recorder.with_grad == [names] * 4
    assert all(bool((t >= 0).all()) for t in recorder.tables)
    assert not torch.equal(recorder.tables[-1], torch.full_like(recorder.tables[-1], 0.5))
    assert result["table"].endswith("headscale/log_scale.safetensors") and result["init_a"] == 0.5

    ext = extension(log_slope_table=f"runs:/{result['run_id']}/headscale/log_scale.safetensors")
    reloaded = load_extended(export, ext, store).model.eval()
    assert torch.equal(log_slopes(reloaded), recorder.tables[-1])
    with torch.no_grad():
        assert torch.equal(reloaded(probe), recorder.logits)
        inside = probe[:, :base.train_len]
        assert torch.equal(reloaded(inside), base.eval()(inside))
    summary = HeadScaleResult.load(tracking.download(store, result["run_id"], "headscale.json"))
    assert summary.table_key == "log_scale" and summary.table == recorder.tables[-1].tolist()
    assert (summary.symbol, summary.init_value) == ("a", 0.5)
