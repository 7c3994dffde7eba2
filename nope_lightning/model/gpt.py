"""The causal LM: litgpt blocks (RMSNorm, SwiGLU MLP, GQA) with a switchable position encoding.

Position encodings (``ModelConfig.pos_encoding``), each touching the smallest piece it needs:

* ``nope`` — nothing: no positional parameter or buffer exists; the causal mask is the only order signal.
* ``rope`` — rotary q/k (litgpt's rotation) from cos/sin tables, optionally rescaled (``rope_scaling.py``).
* ``alibi`` — additive bias ``-m_h * (i - j)`` with the standard geometric slopes.
* ``t5`` — learned relative bias per head over 32 log-buckets (max distance 128), shared by all layers
  as in T5.
* ``learned`` / ``sinusoidal`` — absolute position embeddings added to the token embeddings.

Shapes: ``forward(idx (B, T) int64) -> logits (B, T, padded_vocab) float``. There is no KV cache: the
evaluation code decodes by full forwards, which at our lengths is simpler and fast enough.
"""

from __future__ import annotations

import math

import torch
from litgpt.config import Config
from litgpt.model import RMSNorm
from torch import nn

from nope_lightning.config import ModelConfig
from nope_lightning.model.attention import Attention, Block, alibi_slopes, load_temperature_table, t5_buckets
from nope_lightning.model.rope_scaling import rope_cos_sin, scaled_inv_freq


def litgpt_config(cfg: ModelConfig, vocab_size: int) -> Config:
    """The litgpt ``Config`` of our backbone (TinyLlama-style block: RMSNorm, SwiGLU, no biases)."""
    return Config(
        name="nope_lightning",
        block_size=cfg.max_positions,
        vocab_size=vocab_size,
        padding_multiple=64,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_query_groups=cfg.kv_heads,
        n_embd=cfg.n_embd,
        head_size=cfg.head_size,
        intermediate_size=cfg.intermediate_size,
        rotary_percentage=1.0 if cfg.pos_encoding == "rope" else 0.0,
        rope_base=int(cfg.rope_base),
        parallel_residual=False,
        bias=False,
        norm_class_name="RMSNorm",
        norm_eps=cfg.norm_eps,
        mlp_class_name="LLaMAMLP",
    )


def sinusoidal_table(seq_len: int, n_embd: int) -> torch.Tensor:
    """Vaswani et al.'s fixed encoding (T, n_embd): sin on even, cos on odd channels, float32."""
    pos = torch.arange(seq_len, dtype=torch.float64)[:, None]
    freq = 10000.0 ** (-torch.arange(0, n_embd, 2, dtype=torch.float64) / n_embd)
    table = torch.zeros(seq_len, n_embd, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table.float()


class GPT(nn.Module):
    """Decoder-only LM. ``train_len`` is L, the pre-training length (RoPE scaling's reference length)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, train_len: int) -> None:
        super().__init__()
        self.cfg, self.train_len = cfg, train_len
        self.config = config = litgpt_config(cfg, vocab_size)
        self.lm_head = nn.Linear(cfg.n_embd, config.padded_vocab_size, bias=False)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.padded_vocab_size, cfg.n_embd),
            h=nn.ModuleList(Block(config, i, cfg.attention_backend) for i in range(cfg.n_layer)),
            ln_f=RMSNorm(cfg.n_embd, eps=cfg.norm_eps),
        ))
        if cfg.pos_encoding == "learned":
            self.wpe = nn.Embedding(cfg.max_positions, cfg.n_embd)
        elif cfg.pos_encoding == "t5":
            self.rel_bias = nn.Embedding(cfg.t5_num_buckets, cfg.n_head)
        self.reset_parameters()
        set_head_scales(self, resolve_temperatures(cfg))

    @property
    def attention_layers(self) -> list[Attention]:
        return [block.attn for block in self.transformer.h]

    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, init_std), residual output projections scaled by 1/sqrt(2 n_layer)."""
        std = self.cfg.init_std
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                scaled = name.endswith(("attn.proj", "mlp.proj"))
                nn.init.normal_(module.weight, 0.0, std / math.sqrt(2 * self.cfg.n_layer) if scaled else std)
            elif isinstance(module, RMSNorm | Attention):
                module.reset_parameters()

    def rope_tables(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin (1, T, d) for RoPE, or (1, T, 0) empties, which make litgpt's rotation a no-op."""
        if self.cfg.pos_encoding != "rope":
            empty = torch.empty(1, seq_len, 0, device=device)
            return empty, empty
        scaling = self.cfg.rope_scaling
        inv_freq, factor = scaled_inv_freq(self.cfg.head_size, self.cfg.rope_base, scaling,
                                           scaling.original_len or self.train_len, seq_len)
        cos, sin = rope_cos_sin(inv_freq, seq_len, factor, device)
        return cos[None], sin[None]

    def attention_bias(self, seq_len: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """Additive (1, H, T, T) ALiBi/T5 bias with the causal -inf folded in; None for causal-only PEs."""
        pe = self.cfg.pos_encoding
        if pe not in ("alibi", "t5"):
            return None
        pos = torch.arange(seq_len, device=device)
        distance = pos[:, None] - pos[None, :]  # i - j
        if pe == "alibi":
            slopes = alibi_slopes(self.cfg.n_head).to(device=device, dtype=torch.float32)
            bias = -slopes[:, None, None] * distance.clamp(min=0)[None].float()
        else:
            buckets = t5_buckets(distance, self.cfg.t5_num_buckets, self.cfg.t5_max_distance)
            bias = self.rel_bias(buckets).permute(2, 0, 1).float()
        bias = bias.masked_fill(distance[None] < 0, float("-inf"))
        return bias[None].to(dtype)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) token ids -> logits (B, T, padded_vocab)."""
        seq_len = idx.size(1)
        if seq_len > self.cfg.max_positions:
            raise ValueError(f"sequence of {seq_len} tokens exceeds model.max_positions="
                             f"{self.cfg.max_positions}")
        x = self.transformer.wte(idx)
        if self.cfg.pos_encoding == "learned":
            x = x + self.wpe(torch.arange(seq_len, device=idx.device))
        elif self.cfg.pos_encoding == "sinusoidal":
            x = x + sinusoidal_table(seq_len, self.cfg.n_embd).to(device=x.device, dtype=x.dtype)
        cos, sin = self.rope_tables(seq_len, idx.device)
        mask = self.attention_bias(seq_len, idx.device, x.dtype)
        for block in self.transformer.h:
            x = block(x, cos, sin, mask)
        return self.lm_head(self.transformer.ln_f(x))


def resolve_temperatures(cfg: ModelConfig) -> torch.Tensor:
    """The (n_layer, n_head) temperatures a config asks for: uniform ``temperature`` x the optional table."""
    table = torch.ones(cfg.n_layer, cfg.n_head)
    if cfg.temperature_table:
        table = load_temperature_table(cfg.temperature_table, cfg.n_layer, cfg.n_head)
    return table * cfg.temperature


def set_head_scales(model: GPT, table: torch.Tensor) -> None:
    """Write (n_layer, n_head) temperatures (units of 1/sqrt(d)) into the attention layers."""
    layers = model.attention_layers
    assert tuple(table.shape) == (len(layers), layers[0].head_scale.numel()), table.shape
    with torch.no_grad():
        for attn, row in zip(layers, table, strict=True):
            attn.head_scale.copy_(row)


def head_scales(model: GPT) -> torch.Tensor:
    """The current (n_layer, n_head) temperature table, detached."""
    return torch.stack([attn.head_scale.detach() for attn in model.attention_layers])


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
