"""A position-free temperature (uniform lambda, a per-head table) is folded into the query rows of W_q: the folded
model computes what scaling q after the projection computed (logits and lambda's gradient), bit for bit at lambda = 1,
and every position-dependent temperature keeps the path that scales q."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nope_lightning.config import ModelConfig
from nope_lightning.model import GPT, set_temperatures
from nope_lightning.model.temperature import Temperature, set_log_slopes
from nope_lightning.stages.headscale import LAMBDA, LOG, freeze_for_headscale

VOCAB, LENGTH, LAYERS, HEADS = 64, 24, 2, 4


def tiny(pe: str) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=LAYERS, n_head=HEADS, n_query_groups=2, n_embd=32, intermediate_size=64,
                      pos_encoding=pe, init_std=0.3)  # sharp attention: lambda matters to every logit
    return GPT(cfg, VOCAB, LENGTH // 2)


def tables() -> dict[str, torch.Tensor]:
    per_head = 0.5 + 1.5 * torch.rand(LAYERS, HEADS, generator=torch.Generator().manual_seed(2))
    return {"uniform": torch.full((LAYERS, HEADS), 1.3), "per-head": per_head}


@pytest.fixture
def unfold(monkeypatch):
    """Call it to switch the fold off: every temperature then scales q after the projection, as before the fold
    (the reference computation)."""
    return lambda: monkeypatch.setattr(Temperature, "folds", property(lambda self: False))


def batch() -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, LENGTH + 1), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("pe", ["nope", "rope"])
@pytest.mark.parametrize("kind", ["uniform", "per-head"])
def test_folded_logits_equal_scaling_q(pe, kind, unfold):
    model = tiny(pe)
    set_temperatures(model, tables()[kind])
    idx = batch()[:, :-1]
    assert all(attn.temperature.folds for attn in model.attention_layers)
    folded = model(idx)
    unfold()
    reference = model(idx)
    assert not torch.equal(reference, tiny(pe)(idx)), "lambda must change the logits for the test to mean anything"
    torch.testing.assert_close(folded, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pe", ["nope", "rope"])
def test_at_lambda_one_the_fold_is_bit_identical(pe, unfold):
    model = tiny(pe)
    idx = batch()[:, :-1]
    folded = model(idx)
    unfold()
    assert torch.equal(folded, model(idx))


@pytest.mark.parametrize("pe", ["nope", "rope"])
def test_headscale_lambda_gradient_through_the_fold_equals_scaling_q(pe, unfold):
    model = tiny(pe)
    set_temperatures(model, tables()["per-head"])
    freeze_for_headscale(model, LAMBDA)
    tokens = batch()

    def gradient() -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
        frozen = [p for n, p in model.named_parameters() if not n.endswith("temperature.per_head")]
        assert all(p.grad is None for p in frozen), "the fold must not give a frozen weight a gradient"
        return torch.stack([attn.temperature.per_head.grad for attn in model.attention_layers])

    folded = gradient()
    unfold()
    reference = gradient()
    assert reference.abs().min() > 1e-4, reference  # every head's gradient is large enough to compare
    torch.testing.assert_close(folded, reference, rtol=1e-4, atol=1e-6)


def position_dependent(model: GPT, kind: str) -> None:
    if kind == "log_slope":
        set_log_slopes(model, torch.full((LAYERS, HEADS), 0.5))
    elif kind == "headscale_log":
        set_log_slopes(model, torch.full((LAYERS, HEADS), 0.5))
        freeze_for_headscale(model, LOG)
    else:  # iRoPE's temperature, set on NoPE layers by apply_settings
        for attn in model.attention_layers:
            attn.temperature.irope = (0.5, float(LENGTH // 4))


@pytest.mark.parametrize("kind", ["log_slope", "headscale_log", "irope"])
def test_position_dependent_temperatures_scale_q_and_never_fold(kind, monkeypatch):
    model = tiny("nope")
    set_temperatures(model, tables()["per-head"])
    position_dependent(model, kind)
    assert not any(attn.temperature.folds for attn in model.attention_layers)
    calls = []
    original = Temperature.forward
    monkeypatch.setattr(Temperature, "forward", lambda self, q, positions=None: calls.append(1) or
                        original(self, q, positions))
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(batch()[:, :-1])
    assert len(calls) == LAYERS
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())


def test_ssmax_never_folds():
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=16, intermediate_size=32, ssmax=True)
    model = GPT(cfg, VOCAB, 8)
    assert not model.attention_layers[0].temperature.folds
