"""The causal LM: litgpt blocks (RMSNorm, SwiGLU MLP, GQA) with a switchable position encoding.

Position encodings (``ModelConfig.pos_encoding``), each touching the smallest piece it needs:

* ``nope`` — nothing: no positional parameter or buffer exists; the causal mask is the only order signal.
* ``rope`` — rotary q/k (litgpt's rotation) from cos/sin tables, optionally rescaled (``rope_scaling.py``).
* ``alibi`` — additive bias ``-m_h * (i - j)`` with the standard geometric slopes.
* ``t5`` — learned relative bias per head over 32 log-buckets (max distance 128), shared by all layers
  as in T5.
* ``learned`` / ``sinusoidal`` — absolute position embeddings added to the token embeddings. ``sinusoidal`` (the
  APE of Kazemnejad et al. 2023) starts its token embeddings at the reference's scale, ``APE_TOKEN_STD``;
  ``ModelConfig.embedding_init=t5`` starts every encoding's there (``token_std``).

Hybrids (``ModelConfig.layer_encodings``): some layers of a RoPE model skip the rotation (iRoPE's one NoPE layer
in four); any layer may attend within a sliding window (``ModelConfig.windows``; RNoPE-SWA windows the RoPE
layers). Both are built into each layer (``attention.py``); a model without them is today's, operation for
operation. A windowed layer's KV cache keeps every position, as a global layer's does (each row decodes at its
own position, so a ring buffer would need one per row): its mask hides the keys outside the window.

Attention temperatures (``temperature.py``): ``temperature`` (uniform lambda, per-head table, log-length
slopes: evaluation-time settings, applied here) and SSMax (``ssmax``, learned in pre-training).

Shapes: ``forward(idx (B, T) int64) -> logits (B, T, padded_vocab) float``. Incremental decoding with a
KV cache works for every encoding but dynamic NTK: ``with model.kv_cache(capacity): model(prompt_ids,
input_pos=zeros); model(next_ids, input_pos=positions)``, each row of the batch at its own position
(right-padded prompts). Dynamic NTK's table follows the current length, so each new token changes every
earlier position's hidden states in every layer: nothing computed before can be reused exactly (Hugging
Face's cache keeps the stale keys; we decode it by full forwards, identical to the evaluation's forwards).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from litgpt.config import Config
from litgpt.model import RMSNorm
from torch import nn

from nope_lightning.config.parts import ModelConfig
from nope_lightning.model.attention import Attention, Block, LayerCache, alibi_slopes, t5_buckets
from nope_lightning.model.rope_scaling import rope_cos_sin, scaled_inv_freq
from nope_lightning.model.temperature import Temperature, apply_settings


def litgpt_config(cfg: ModelConfig, vocab_size: int) -> Config:
    """The litgpt ``Config`` of our backbone (TinyLlama-style block: RMSNorm, SwiGLU, no biases)."""
    return Config(
        name="nope_lightning",
        block_size=cfg.max_positions,
        vocab_size=vocab_size,
        padding_multiple=cfg.padding_multiple,
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


#: Initial std of the token embeddings of a ``sinusoidal`` (APE) model. The reference code of Kazemnejad et al.
#: (McGill-NLP/length-generalization, a T5 decoder) adds the sinusoidal table (RMS 1/sqrt(2) per channel) to T5's
#: token embeddings, initialised N(0, 1.0 * initializer_factor): token identity has sqrt(2) times the RMS of
#: position. Under the GPT-2 init (``init_std`` 0.02) position would outweigh identity about 35 times, and APE
#: failed to learn reverse even at length 1. So an APE model draws its token embeddings N(0, 1) as the reference
#: does (the same draw, scaled: every other tensor, and every other PE, is initialised as before, bit for bit).
#: Scaling the table down instead would leave a fixed signal that the trained embeddings soon swamp.
APE_TOKEN_STD = 1.0


def token_std(cfg: ModelConfig) -> float:
    """Initial std of the token embeddings: ``APE_TOKEN_STD`` for APE, or for every encoding under
    ``embedding_init=t5``; ``init_std`` otherwise.

    ``t5`` is the reference's init of the token embeddings (HF T5's N(0, 1)) for all encodings, so that none
    starts with token identity at another scale than the others. Only the embeddings follow T5. HF T5 also draws
    q ~ N(0, (d_model d_kv)^-1/2) and k, v ~ N(0, d_model^-1/2) and computes logits q.k without 1/sqrt(d_kv):
    the q init carries that factor, so its initial logits have std about 1, as 1/sqrt(d) attention with q, k ~
    N(0, d_model^-1/2) would. We keep 1/sqrt(head_size) (the arithmetic of SDPA, flash and every imported
    checkpoint) and GPT-2's q, k ~ N(0, ``init_std``), whose initial logits are far smaller (std about 0.03 at
    n_embd 64, head size 16: near-uniform attention at init), for every encoding alike.
    """
    return APE_TOKEN_STD if cfg.embedding_init == "t5" or cfg.pos_encoding == "sinusoidal" else cfg.init_std


def sinusoidal_table(positions: torch.Tensor, n_embd: int) -> torch.Tensor:
    """Vaswani et al.'s fixed encoding of ``positions`` (...,) -> (..., n_embd): sin on even, cos on odd
    channels, computed in float64, returned as float32 on the positions' device."""
    pos = positions.to(torch.float64)[..., None]
    freq = 10000.0 ** (-torch.arange(0, n_embd, 2, dtype=torch.float64, device=positions.device) / n_embd)
    table = torch.zeros(*positions.shape, n_embd, dtype=torch.float64, device=positions.device)
    table[..., 0::2] = torch.sin(pos * freq)
    table[..., 1::2] = torch.cos(pos * freq)
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
            h=nn.ModuleList(Block(config, i, cfg.attention_backend, train_len, cfg.ssmax, encoding == "nope", window)
                            for i, (encoding, window) in enumerate(zip(cfg.layer_encodings, cfg.windows,
                                                                       strict=True))),
            ln_f=RMSNorm(cfg.n_embd, eps=cfg.norm_eps),
        ))
        if cfg.pos_encoding == "learned":
            self.wpe = nn.Embedding(cfg.max_positions, cfg.n_embd)
        elif cfg.pos_encoding == "t5":
            self.rel_bias = nn.Embedding(cfg.t5_num_buckets, cfg.n_head)
        self.reset_parameters()
        apply_settings(self, cfg.temperature)
        self._decode_tables: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def attention_layers(self) -> list[Attention]:
        return [block.attn for block in self.transformer.h]

    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, init_std), residual output projections scaled by 1/sqrt(2 n_layer); the token
        embeddings N(0, ``token_std``)."""
        std = self.cfg.init_std
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                scaled = name.endswith(("attn.proj", "mlp.proj"))
                nn.init.normal_(module.weight, 0.0, token_std(self.cfg) if name == "transformer.wte"
                                else std / math.sqrt(2 * self.cfg.n_layer) if scaled else std)
            elif isinstance(module, RMSNorm | Temperature):
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

    @property
    def supports_kv_cache(self) -> bool:
        """False when the RoPE table changes with the sequence length (dynamic NTK), see the module doc."""
        scaling = self.cfg.rope_scaling
        return not (self.cfg.pos_encoding == "rope" and scaling.method == "dynamic_ntk" and scaling.factor != 1.0)

    def attention_bias(self, positions: torch.Tensor, n_keys: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive (B, H, T, n_keys) mask of queries at ``positions`` (B, T) over keys at 0..n_keys-1.

        ALiBi ``-m_h (i - j)`` or the T5 bucket bias (zeros, one head broadcast, for other encodings), with
        -inf where the key lies after the query.
        """
        pe = self.cfg.pos_encoding
        distance = positions[..., None] - torch.arange(n_keys, device=positions.device)  # i - j, (B, T, S)
        if pe == "alibi":
            slopes = alibi_slopes(self.cfg.n_head).to(device=positions.device, dtype=torch.float32)
            bias = -slopes[:, None, None] * distance.clamp(min=0)[:, None].float()
        elif pe == "t5":
            buckets = t5_buckets(distance, self.cfg.t5_num_buckets, self.cfg.t5_max_distance)
            bias = self.rel_bias(buckets).permute(0, 3, 1, 2).float()
        else:
            bias = torch.zeros(distance.shape, device=positions.device)[:, None]
        return bias.masked_fill(distance[:, None] < 0, float("-inf")).to(dtype)

    @contextmanager
    def kv_cache(self, capacity: int) -> Iterator[None]:
        """Attach a KV cache of ``capacity`` positions inside the block (its batch size is the first call's);
        always detaches."""
        if not self.supports_kv_cache:
            raise ValueError("dynamic NTK cannot use a KV cache (its RoPE table changes with the length); "
                             "decode by full forwards")
        if capacity > self.cfg.max_positions:
            raise ValueError(f"KV cache of {capacity} positions exceeds model.max_positions={self.cfg.max_positions}")
        # The RoPE tables do not depend on the length: computed once for the whole cache.
        self._decode_tables = self.rope_tables(capacity, self.lm_head.weight.device)
        for attn in self.attention_layers:
            attn.cache = LayerCache(capacity)
        try:
            yield
        finally:
            self._decode_tables = None
            for attn in self.attention_layers:
                attn.cache = None

    def reorder_cache(self, rows: torch.Tensor) -> None:
        """Keep the cache rows ``rows`` (B',), in that order (beam search)."""
        for attn in self.attention_layers:
            attn.cache.reorder(rows)

    def forward(self, idx: torch.Tensor, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) token ids -> logits (B, T, padded_vocab).

        ``input_pos`` (B,) int: decode with the attached KV cache (``kv_cache``), row b's tokens at positions
        ``input_pos[b] + 0..T-1``. Without it, a full forward at positions 0..T-1 (no cache involved).
        """
        T = idx.size(1)
        offsets = torch.arange(T, device=idx.device)
        positions = offsets[None] if input_pos is None else input_pos[:, None] + offsets  # (1 | B, T)
        # S: the keys attended to — the longest row so far (in a full forward, T).
        S = T if input_pos is None else int(positions.max()) + 1
        if S > self.cfg.max_positions:
            raise ValueError(f"sequence of {S} tokens exceeds model.max_positions={self.cfg.max_positions}")
        x = self.transformer.wte(idx)
        if self.cfg.pos_encoding == "learned":
            x = x + self.wpe(positions)
        elif self.cfg.pos_encoding == "sinusoidal":
            x = x + sinusoidal_table(positions, self.cfg.n_embd).to(x.dtype)
        if input_pos is None:
            cos, sin = self.rope_tables(S, idx.device)
        else:
            cos, sin = (table[:, :S] for table in self._decode_tables)
        # A square step from position 0 (a full forward, or a prefill) keeps SDPA's causal fast path.
        square = S == T
        # A position bias stays float32 under bf16/fp16 activations: in bf16 the distances of a long window
        # collapse (4,096 ALiBi distances to 769 values); the attention then runs in float32 (attention.py).
        biased = self.cfg.pos_encoding in ("alibi", "t5")
        low = x.dtype in (torch.bfloat16, torch.float16)
        mask = (None if square and not biased
                else self.attention_bias(offsets[None] if square else positions, S,
                                         torch.float32 if biased and low else x.dtype))
        cache_pos = None if input_pos is None else positions.expand(idx.size(0), -1)
        for block in self.transformer.h:
            x = block(x, cos, sin, mask, cache_pos)
        return self.lm_head(self.transformer.ln_f(x))


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


#: The embedding tables Kaplan et al. (2020) leave out of a model's size: tokens in, logits out, positions.
EMBEDDINGS = ("transformer.wte.weight", "lm_head.weight", "wpe.weight")


def non_embedding_parameters(cfg: ModelConfig, train_len: int) -> int:
    """Trained parameters of the architecture less its embedding tables (``EMBEDDINGS``): the N of
    "tokens per parameter". Counted on a model built on the meta device (no memory, no compute); frozen
    tensors (the per-head temperatures) are not trained and not counted. Independent of the vocabulary."""
    with torch.device("meta"):
        model = GPT(cfg, vocab_size=256, train_len=train_len)
    return sum(p.numel() for name, p in model.named_parameters() if p.requires_grad and name not in EMBEDDINGS)
