"""Position biases keep float32 precision under bf16: a long ALiBi/T5 window must not collapse its distances."""

from __future__ import annotations

import pytest
import torch

import nope_lightning.model.attention as attention
from nope_lightning.config import ModelConfig
from nope_lightning.model import GPT

T = 2048


def model(pos_encoding: str) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=16, intermediate_size=32, pos_encoding=pos_encoding,
                      max_positions=T)
    return GPT(cfg, 50, train_len=64).eval()


@pytest.mark.parametrize("pos_encoding", ["alibi", "t5"])
@pytest.mark.parametrize("mode", ["bf16-true", "bf16-autocast"])
def test_the_bias_reaches_attention_in_float32_and_attention_runs_in_float32(pos_encoding, mode, monkeypatch):
    net = model(pos_encoding)
    if mode == "bf16-true":
        net = net.to(torch.bfloat16)
    seen = []
    sdpa = attention.F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        seen.append((q.dtype, attn_mask.dtype, attn_mask[0, 0, -1].unique().numel()))
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    ids = torch.randint(0, 50, (1, T))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16-autocast"):
        out = net(ids)
    (q_dtype, mask_dtype, distinct), = seen
    assert q_dtype == mask_dtype == torch.float32  # the attention itself ran in float32
    if pos_encoding == "alibi":
        assert distinct == T  # the last query's T distances keep T distinct biases (641 in bf16)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
