"""The speed paths keep the numerics: the attention forward that skips litgpt's q/k concatenation is bit-identical
to litgpt's, and a HeadScale backward computes no weight gradient while its lambda gradient is exact."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from litgpt.model import CausalSelfAttention as LitAttention

from nope_lightning.config import ModelConfig
from nope_lightning.model import GPT, set_temperatures
from nope_lightning.stages.headscale import LAMBDA, freeze_for_headscale

VOCAB, LENGTH = 64, 24


def tiny(pe: str = "nope", dtype: torch.dtype = torch.float32, init_std: float = 0.02) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, intermediate_size=64, pos_encoding=pe, init_std=init_std)
    return GPT(cfg, VOCAB, LENGTH // 2).to(dtype)


@pytest.mark.parametrize("pe", ["nope", "rope", "alibi"])
def test_attention_forward_is_litgpts_bit_for_bit(pe):
    model = tiny(pe)
    idx = torch.randint(0, VOCAB, (2, LENGTH), generator=torch.Generator().manual_seed(1))
    ours = model(idx)
    for attn in model.attention_layers:  # litgpt's forward, reaching our scaled_dot_product_attention
        attn.forward = lambda x, cos, sin, mask=None, *_, attn=attn: LitAttention.forward(attn, x, cos, sin, mask)
    assert torch.equal(ours, model(idx))


def test_headscale_backward_skips_weights_and_its_lambda_gradient_is_exact():
    model = tiny(dtype=torch.float64, init_std=0.3)  # sharp attention: every lambda matters to the loss
    set_temperatures(model, 1.0 + torch.rand(2, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64))
    freeze_for_headscale(model, LAMBDA)
    batch = torch.randint(0, VOCAB, (3, LENGTH + 1), generator=torch.Generator().manual_seed(3))

    def loss() -> torch.Tensor:  # lm_loss would round float64 logits to float32
        return F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())

    loss().backward()
    frozen = {n: p for n, p in model.named_parameters() if not n.endswith("attn.temperature.per_head")}
    assert frozen and all(p.grad is None for p in frozen.values()), "a frozen weight received a gradient"
    scales = [attn.temperature.per_head for attn in model.attention_layers]
    analytic = torch.stack([s.grad for s in scales])
    # Central differences: error ~ eps^2 (truncation) + 1e-8 / eps (litgpt's RMSNorm rounds to float32).
    eps, numeric = 1e-3, torch.zeros_like(analytic)
    with torch.no_grad():
        for layer, scale in enumerate(scales):
            for head in range(scale.numel()):
                scale[head] += eps
                up = loss()
                scale[head] -= 2 * eps
                numeric[layer, head] = (up - loss()) / (2 * eps)
                scale[head] += eps
    assert analytic.abs().min() > 1e-3, analytic  # every head's gradient is large enough to check
    torch.testing.assert_close(analytic, numeric, rtol=1e-3, atol=1e-5)
