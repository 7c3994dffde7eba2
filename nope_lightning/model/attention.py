"""Causal self-attention with attention temperatures, additive position biases and two backends.

The attention logits of head h in layer l for the query at position i are
``lambda[l, h] tau_h(i) q_i.k_j / sqrt(d) + bias(i, j)``. Every temperature kind lives in ``temperature.py``.
A position-free one (lambda alone) is folded into the query rows of the qkv weight (``Attention.project``); a
position-dependent one gets the queries and their absolute positions (0..T-1 in a full forward, the cache's
``input_pos`` when decoding) and hands them back scaled. Either way the kernel keeps its scalar 1/sqrt(d)
(SDPA/flash fast paths).

Position biases (ALiBi, T5) arrive as an additive float mask of shape (1, H, T, T) that already holds the
causal -inf; ``mask=None`` means plain causal attention. A bias is added after the temperature: the
temperature scales content similarity only, which is what the papers' temperature acts on (NoPE has no bias).

Hybrids (``ModelConfig.layer_encodings``, ``ModelConfig.windows``): a layer built with ``nope=True`` skips the
rotation of a RoPE model, and a layer with a ``window`` W adds -inf for keys W or more positions behind the
query to the mask it is handed (``sliding_window``), so one mask per forward serves every layer and the
windowed mask is what SDPA, the probe and the cache see. Under ``attention_backend=flash`` a windowed layer
keeps flash-attn through its ``window_size`` when there is no other mask.

Incremental decoding: with a ``LayerCache`` attached (``GPT.kv_cache``) and ``input_pos`` given, each call
writes its keys/values at their per-row positions and attends over cache slots 0..S-1, slot j holding
position j of that row; the mask is then (B, 1 or H, T, S) with the causal -inf of each row's positions.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from litgpt.config import Config
from litgpt.model import Block as LitBlock
from litgpt.model import CausalSelfAttention as LitAttention
from litgpt.model import apply_rope

from nope_lightning.model.temperature import Temperature

#: probe(layer, q_scaled (B,H,T,d), k (B,H,T,d), mask (1,H|1,T,T) additive or None=causal)
Probe = Callable[[int, torch.Tensor, torch.Tensor, "torch.Tensor | None"], None]


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def _flash_attn_func():
    """flash-attn's kernel, imported lazily (never at package import); None when unavailable."""
    try:
        from flash_attn import flash_attn_func
    except ImportError:
        return None
    return flash_attn_func


class LayerCache:
    """One layer's key/value buffers (B, n_query_groups, capacity, d), keys after RoPE, allocated at the
    first write (whose batch size B they keep; ``reorder`` may change it)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def write(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (B, G, T, d) at slots ``positions`` (B, T) of each row."""
        if self.k is None:
            shape = (k.size(0), k.size(1), self.capacity, k.size(3))
            self.k = k.new_zeros(shape)
            self.v = v.new_zeros(shape)
        index = positions[:, None, :, None].expand(-1, k.size(1), -1, k.size(3))
        self.k.scatter_(2, index, k.to(self.k.dtype))
        self.v.scatter_(2, index, v.to(self.v.dtype))

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep rows ``rows`` (B',) of every buffer, in that order (beam search's parent beams)."""
        if self.k is not None:
            self.k, self.v = self.k[rows], self.v[rows]


def sliding_window(mask: torch.Tensor | None, positions: torch.Tensor | None, n_keys: int, window: int,
                   q: torch.Tensor) -> torch.Tensor:
    """``mask`` (additive (B | 1, H | 1, T, S), or None: plain causal) with -inf for every key j that lies
    ``window`` or more positions behind its query i (i - j >= window), so the query attends to the keys
    i - window < j <= i: (B | 1, H | 1, T, S) in ``mask``'s dtype (q's when None), on q's device.
    ``positions`` (B, T): the queries' absolute positions; None means 0..T-1 (a full forward); q (B, H, T, d)."""
    if positions is None:
        positions = torch.arange(q.size(2), device=q.device)[None]
    distance = (positions[..., None] - torch.arange(n_keys, device=q.device))[:, None]  # (B | 1, 1, T, S)
    if mask is None:
        mask = torch.zeros(distance.shape, dtype=q.dtype, device=q.device).masked_fill(distance < 0, -math.inf)
    return torch.where(distance >= window, -math.inf, mask)  # broadcasts the mask's rows and heads


class _LambdaGradient(torch.autograd.Function):
    """The identity on the folded projection's output y (..., (n_head + 2 G) d), whose backward also gives each
    head's lambda its gradient, computed from y itself: the query rows of head h are ``y = lambda_h z`` with z the
    unscaled projection, so ``dL/dlambda_h = sum g z = sum g y / lambda_h`` over the tokens and head h's d rows.

    Autograd through the weight product would get the same number from the weight gradient ``g^T x``, one more
    matmul the size of the projection's forward even when the weights are frozen (HeadScale); this is one
    elementwise product over q in the backward only. Needs lambda != 0, which every setting keeps (a uniform
    lambda > 0, tables > 0, HeadScale's floors)."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, per_head: torch.Tensor, head_size: int) -> torch.Tensor:
        ctx.save_for_backward(y, per_head)
        ctx.head_size = head_size
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        y, per_head = ctx.saved_tensors
        n_head, d = per_head.numel(), ctx.head_size
        # One product in the activations' dtype, summed in float32: no float32 copies of q-sized tensors.
        gz = (grad[..., : n_head * d] * y[..., : n_head * d]).unflatten(-1, (n_head, d))
        gz = gz.sum(dim=(*range(gz.dim() - 2), gz.dim() - 1), dtype=torch.float32)
        return grad, (gz / per_head.float()).to(per_head.dtype), None


class Attention(LitAttention):
    """litgpt's ``CausalSelfAttention`` with the layer's ``temperature`` (``Temperature``: per-head lambda,
    log-length slopes, SSMax, iRoPE's; ``train_len`` is their L, ``ssmax`` adds SSMax) and a backend switch.
    ``nope``: the layer has no position encoding (a NoPE model's layers; a hybrid's NoPE layers, which skip
    the rotation of a RoPE model); ``window``: its sliding window in tokens (None: global)."""

    def __init__(self, config: Config, block_idx: int, backend: str = "sdpa", train_len: int = 0,
                 ssmax: bool = False, nope: bool = False, window: int | None = None) -> None:
        super().__init__(config, block_idx)
        # Our models rotate all channels or none; a NoPE layer of a hybrid rotates none.
        self.rotates = bool(config.rope_n_elem) and not nope
        self.window = window
        self.temperature = Temperature(config.n_head, train_len, ssmax, nope)
        self.backend = backend
        self.probe: Probe | None = None
        self.cache: LayerCache | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None = None,
                input_pos: torch.Tensor | None = None, input_pos_maxp1: int | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C). Without ``input_pos``: full causal attention over x (no cache); cos/sin are
        the (1, T, d) RoPE tables (or (1, T, 0) empties) and ``mask`` the additive (1, H, T, T) bias or None.

        With ``input_pos`` (B, T), the positions of x's tokens, and ``self.cache`` attached: cos/sin are the
        (1, S, d) tables of positions 0..S-1 and ``mask`` is the additive (B, 1|H, T, S) mask over the
        cache, or None when T == S (a prefill from position 0: plain causal attention, as without a cache).

        litgpt's own forward is not used: it concatenates the rotated and unrotated channels of q and k
        (a copy of each, and two zero-filled gradients in the backward) even when nothing rotates (NoPE).
        """
        if input_pos is not None and self.cache is None:
            raise RuntimeError("input_pos needs a KV cache: decode inside `with model.kv_cache(...)`")
        B, T, _ = x.shape
        cfg = self.config
        kv_size = cfg.n_query_groups * cfg.head_size
        q, k, v = self.project(x).split((cfg.n_head * cfg.head_size, kv_size, kv_size), dim=-1)
        q = q.view(B, T, cfg.n_head, cfg.head_size).transpose(1, 2)
        k = k.view(B, T, cfg.n_query_groups, cfg.head_size).transpose(1, 2)
        v = v.view(B, T, cfg.n_query_groups, cfg.head_size).transpose(1, 2)
        if self.rotates:
            cos_q, sin_q = (cos, sin) if input_pos is None else (cos[0][input_pos], sin[0][input_pos])
            q, k = apply_rope(q, cos_q, sin_q), apply_rope(k, cos_q, sin_q)
        if input_pos is not None:
            S = cos.size(1)
            self.cache.write(input_pos, k, v)
            k, v = self.cache.k[:, :, :S], self.cache.v[:, :, :S]
        if cfg.n_query_groups != cfg.n_head:
            k = k.repeat_interleave(cfg.n_head // cfg.n_query_groups, dim=1)
            v = v.repeat_interleave(cfg.n_head // cfg.n_query_groups, dim=1)
        y = self.scaled_dot_product_attention(q, k, v, mask, input_pos)
        return self.proj(y.reshape(B, T, cfg.n_head * cfg.head_size))

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, C) -> the concatenated q, k, v projections (B, T, (n_head + 2 n_query_groups) head_size). A
        temperature that ``folds`` multiplies the query rows of the weight (and bias) by each head's lambda
        (``Temperature.query_rows``): one elementwise pass over the (out, C) weight instead of one over q's
        B x T x C, and attention then runs the plain kernel. At lambda = 1 the product is exact (x1.0), so a
        model that never set a temperature computes what ``self.qkv(x)`` does, bit for bit. A trainable lambda
        (HeadScale) gets its gradient from ``_LambdaGradient``, not through the weight product."""
        if not self.temperature.folds:
            return self.qkv(x)
        head_size, per_head = self.config.head_size, self.temperature.per_head
        rows = self.temperature.query_rows(head_size).detach()
        rows = torch.cat((rows, rows.new_ones(2 * self.config.n_query_groups * head_size))).to(self.qkv.weight.dtype)
        bias = None if self.qkv.bias is None else self.qkv.bias * rows
        y = F.linear(x, self.qkv.weight * rows[:, None], bias)
        return _LambdaGradient.apply(y, per_head, head_size) if per_head.requires_grad else y

    def scaled_dot_product_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                     mask: torch.Tensor | None = None,
                                     positions: torch.Tensor | None = None) -> torch.Tensor:
        """q (B, H, T, d), k, v (B, H, S, d) with k/v already repeated for GQA; returns (B, T, H, d). q comes from
        ``project``: it already carries a temperature that ``folds``; any other is applied here.

        ``mask=None`` needs S == T (square causal attention). ``positions`` (B, T): the queries' absolute
        positions (KV-cached decoding); None means 0..T-1 (a full forward, litgpt's call). A windowed layer
        adds its window to ``mask`` here (``sliding_window``)."""
        scale = 1.0 / math.sqrt(self.config.head_size)
        if not self.temperature.folds:
            q = self.temperature(q, positions)
        shared = mask
        if self.window is not None:
            mask = sliding_window(mask, positions, k.size(2), self.window, q)
        if self.probe is not None:
            self.probe(self.block_idx, q * scale, k, mask)
        if self.backend == "flash":
            y = self._flash(q, k, v, shared, scale)
            if y is not None:
                return y
        if mask is not None and mask.dtype == torch.float32 and (
                q.dtype in (torch.bfloat16, torch.float16) or torch.is_autocast_enabled(q.device.type)):
            # A float32 position bias with low-precision activations (or autocast, which would cast the bias
            # down with q): attend in float32 so every distance keeps its own bias.
            with torch.autocast(q.device.type, enabled=False):
                y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale)
            return y.to(q.dtype).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, is_causal=mask is None)
        return y.transpose(1, 2)

    def _flash(self, q, k, v, mask, scale) -> torch.Tensor | None:
        """flash-attn when it can run here (CUDA, fp16/bf16, no additive bias; ``mask``: the one shared by
        every layer, before this layer's window); else warn once, None. A window becomes flash-attn's
        ``window_size`` (keys i - (W - 1) .. i)."""
        fn = _flash_attn_func()
        reason = ("flash-attn is not installed (pip install '.[flash]')" if fn is None
                  else "it needs a CUDA device" if not q.is_cuda
                  else "it needs fp16/bf16 activations" if q.dtype not in (torch.float16, torch.bfloat16)
                  else "attention has an additive mask (a position bias, or a KV-cached decoding step)"
                  if mask is not None else "")
        if reason:
            _warn_once(f"attention_backend=flash falls back to SDPA: {reason}")
            return None
        # flash-attn wants (B, T, H, d) and returns the same layout. A global layer's call is today's (flash-attn
        # before 2.3 has no window_size); a windowed one sees W - 1 keys to the left of each query.
        window = {} if self.window is None else {"window_size": (self.window - 1, 0)}
        return fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale, causal=True,
                  **window)


class Block(LitBlock):
    """litgpt's pre-norm block with our ``Attention`` in place of litgpt's (``nope``, ``window``: its layer's)."""

    def __init__(self, config: Config, block_idx: int, backend: str = "sdpa", train_len: int = 0,
                 ssmax: bool = False, nope: bool = False, window: int | None = None) -> None:
        super().__init__(config, block_idx)
        self.attn = Attention(config, block_idx, backend, train_len, ssmax, nope, window)


def alibi_slopes(n_head: int) -> torch.Tensor:
    """ALiBi head slopes (Press et al. 2022), shape (n_head,), float64.

    For n a power of two: ``m_h = 2^(-8h/n)``, h = 1..n. Otherwise, with n0 the largest power of two
    below n: the n0 slopes of n0 heads, then every other slope of 2*n0 heads for the remaining n-n0.
    """
    def powers(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    n0 = 2 ** int(math.floor(math.log2(n_head)))
    slopes = powers(n0) + powers(2 * n0)[0::2][: n_head - n0]
    return torch.tensor(slopes, dtype=torch.float64)


def t5_buckets(distance: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's causal (unidirectional) relative-position bucket of ``distance = i - j >= 0`` (long tensor).

    Distances below ``num_buckets // 2`` get their own bucket; larger ones share log-spaced buckets up to
    ``max_distance``, beyond which everything falls in the last bucket (Raffel et al. 2020).
    """
    max_exact = num_buckets // 2
    d = distance.clamp(min=0)
    # clamp(min=1) only keeps log() finite for the exact range, whose value is discarded by where().
    log_ratio = torch.log(d.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return torch.where(d < max_exact, d, large)
