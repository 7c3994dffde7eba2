"""torchmetrics for language-model loss and attention entropy, as functions of position.

All losses and entropies are natural-log quantities (**nats**); perplexity is ``exp`` of the mean NLL.
Every metric keeps float64 sum and count states reduced with ``"sum"``, so syncing across processes is one
all-reduce and the result does not depend on how samples were split into batches or ranks.

* ``token_nll``: per-token NLL from logits (log-softmax: never ``inf`` from softmax underflow, unlike
  torchmetrics' ``Perplexity``, which takes softmax, gathers, then logs).
* ``WindowSums``: one row of sums per evaluation window (NLL and token count, or per position), the unit the
  report's bootstrap resamples.
* ``AttentionEntropy``: paper Eq. 1-2, the entropy of each query's attention distribution per
  layer x head x query position; ``attention_entropy_from_qk`` computes it from queries and keys in query
  chunks so memory grows linearly with the sequence length.
* ``position_buckets`` / ``bucket_mean``: coarse curves from per-position sums.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric

AttentionBias = Callable[[Tensor, Tensor], Tensor]


class _SumStateMetric(Metric):
    """Base for metrics whose states are float64 sums, reduced across processes by summation."""

    full_state_update = False
    is_differentiable = False

    def _add_sum_state(self, name: str, shape: Sequence[int]) -> None:
        self.add_state(name, torch.zeros(tuple(shape), dtype=torch.float64), dist_reduce_fx="sum")

    def _apply(self, fn: Callable, exclude_state: Sequence[str] = "") -> Metric:
        # torchmetrics only blocks .half()/.float(); ``Module.to(dtype)`` (Lightning's "bf16-true" calls it)
        # would cast the sums too, and a bf16 sum stops growing after a few hundred tokens.
        this = super()._apply(fn, exclude_state)
        for name, default in this._defaults.items():
            this._defaults[name] = default.double()
            setattr(this, name, getattr(this, name).double())
        return this


def token_nll(logits: Tensor, targets: Tensor, mask: Tensor | None = None,
              ignore_index: int = -100) -> tuple[Tensor, Tensor]:
    """Per-token negative log-likelihood in nats, from logits (log-softmax, never softmax-then-log).

    Args:
        logits: (B, T, V) unnormalised scores, any float dtype (upcast to float32).
        targets: (B, T) token ids; entries equal to ``ignore_index`` are not scored.
        mask: optional (B, T) bool, True where a token is scored.

    Returns:
        ``(nll, scored)``: (B, T) float32 NLL (0 where not scored) and the (B, T) bool mask of scored tokens.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} disagree on (B, T)")
    if mask is not None:
        targets = targets.masked_fill(~mask.bool(), ignore_index)
    nll = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), ignore_index=ignore_index,
                          reduction="none")
    return nll.view(targets.shape), targets != ignore_index


class WindowSums(_SumStateMetric):
    """One row of float64 sums per evaluation window: ``(num_windows, width)``, e.g. a window's NLL sum (nats)
    and scored-token count, or its NLL / attention entropy at each of its positions.

    ``update(index (B,) int64, values (B, width))`` adds each row of ``values`` to its window's row. Every window
    is scored by exactly one process, so the ``"sum"`` sync across processes assembles the full table, and the
    table (hence every statistic of it) does not depend on how windows were batched or split between ranks.
    ``compute()`` returns the (num_windows, width) table.
    """

    def __init__(self, num_windows: int, width: int, **kwargs) -> None:
        super().__init__(**kwargs)
        if num_windows < 0 or width < 1:
            raise ValueError(f"num_windows={num_windows} must be >= 0 and width={width} >= 1")
        self._add_sum_state("sums", (num_windows, width))

    def update(self, index: Tensor, values: Tensor) -> None:
        if values.dim() != 2 or values.size(1) != self.sums.size(1) or values.size(0) != index.numel():
            raise ValueError(f"values {tuple(values.shape)} must be (len(index)={index.numel()}, "
                             f"width={self.sums.size(1)})")
        self.sums.index_add_(0, index.to(self.sums.device), values.to(self.sums))

    def compute(self) -> Tensor:
        return self.sums


class AttentionEntropy(_SumStateMetric):
    """Attention entropy (paper Eq. 1-2) in **nats**, per layer x head x query position, averaged over samples.

    For query position i (0-indexed) of head h the causal attention distribution covers keys 0..i and its
    entropy is ``H_i = -sum_j a_ij log a_ij`` (0 log 0 = 0), at most ``log(i + 1)``, reached by uniform
    attention (the paper's 1-indexed ``log i``, App. D).

    ``update(layer, probs, query_offset)`` takes one layer's attention probabilities for a chunk of query
    rows: ``probs`` (B, H, Tq, Tk) holds queries ``query_offset..query_offset+Tq-1`` and keys 0..Tk-1, zero
    beyond each row's causal limit. Alternatively pass ``entropy=`` (B, H, Tq) already reduced, e.g. from
    ``attention_entropy_from_qk``, which never materialises more than a chunk of rows. States are the
    per-(layer, head, position) entropy sum and the per-(layer, position) sample count.
    """

    def __init__(self, n_layer: int, n_head: int, max_len: int, **kwargs) -> None:
        super().__init__(**kwargs)
        if min(n_layer, n_head, max_len) < 1:
            raise ValueError(f"n_layer={n_layer}, n_head={n_head} and max_len={max_len} must all be >= 1")
        self.n_layer, self.n_head, self.max_len = n_layer, n_head, max_len
        self._add_sum_state("entropy_sum", (n_layer, n_head, max_len))
        self._add_sum_state("count", (n_layer, max_len))

    def update(self, layer: int, probs: Tensor | None = None, query_offset: int = 0, *,
               entropy: Tensor | None = None) -> None:
        if (probs is None) == (entropy is None):
            raise ValueError("pass exactly one of probs (B, H, Tq, Tk) and entropy (B, H, Tq)")
        if entropy is None:
            if probs.dim() != 4:
                raise ValueError(f"probs must be (B, H, Tq, Tk), got shape {tuple(probs.shape)}")
            entropy = torch.special.entr(probs.float()).sum(-1)
        if entropy.dim() != 3:
            raise ValueError(f"entropy must be (B, H, Tq), got shape {tuple(entropy.shape)}")
        B, H, Tq = entropy.shape
        if not 0 <= layer < self.n_layer:
            raise ValueError(f"layer={layer} is outside 0..{self.n_layer - 1}")
        if H != self.n_head:
            raise ValueError(f"got {H} heads, the metric was built for n_head={self.n_head}")
        if query_offset < 0 or query_offset + Tq > self.max_len:
            raise ValueError(f"query positions {query_offset}..{query_offset + Tq - 1} are outside "
                             f"0..{self.max_len - 1} (max_len)")
        rows = slice(query_offset, query_offset + Tq)
        self.entropy_sum[layer, :, rows] += entropy.sum(0, dtype=torch.float64)
        self.count[layer, rows] += B

    def compute(self) -> Tensor:
        """Mean entropy (n_layer, n_head, max_len) in nats; NaN where a layer/position was never updated."""
        return _mean_or_nan(self.entropy_sum, self.count[:, None, :])

    def mean_over_heads(self, per_layer: bool = False) -> Tensor:
        """Eq. 1: mean over heads, (max_len,) over all layers' heads, or (n_layer, max_len) if ``per_layer``."""
        mean = self.compute().mean(1)
        return mean if per_layer else mean.mean(0)

    def bucketed(self, edges: Tensor) -> Tensor:
        """Sample-weighted mean entropy per position bucket: (n_layer, n_head, len(edges) - 1)."""
        return bucket_mean(self.entropy_sum, self.count[:, None, :].expand_as(self.entropy_sum), edges)

    @staticmethod
    def upper_bound(max_len: int) -> Tensor:
        """Largest possible entropy at each position, ``log(i + 1)`` nats for i = 0..max_len-1: (max_len,)."""
        return torch.arange(1, max_len + 1, dtype=torch.float64).log()


def attention_entropy_from_qk(q: Tensor, k: Tensor, scale: float | Tensor, chunk: int,
                              bias: AttentionBias | None = None) -> Tensor:
    """Entropy (nats) of causal softmax attention for every query, computed ``chunk`` query rows at a time.

    Args:
        q: (B, H, T, d) queries.
        k: (B, H_kv, T, d) keys; with H_kv < H, query head h uses key head ``h // (H // H_kv)`` (litgpt's
            ``repeat_interleave`` grouping).
        scale: the softmax multiplier of q.k, a float or (H,) per head. It is the absolute value: a
            temperature ``t`` in units of 1/sqrt(d) is ``t / sqrt(d)``.
        chunk: number of query rows per step; peak memory is about 3 * B * H * chunk * T float32 values.
        bias: optional ``bias(q_pos (Tq,), k_pos (Tk,)) -> (H, Tq, Tk)`` (or broadcastable) added to the
            scaled logits (ALiBi, T5 bias, ...). The causal mask is applied on top.

    Returns:
        (B, H, T) float32 entropy of row i over keys 0..i. Call under ``torch.no_grad()`` unless gradients
        are wanted.
    """
    B, H, T, _ = q.shape
    if k.dim() != 4 or k.size(0) != B or k.size(2) != T or H % k.size(1):
        raise ValueError(f"k {tuple(k.shape)} does not fit q {tuple(q.shape)}: need (B, H_kv, T, d), H % H_kv == 0")
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1")
    k = k.repeat_interleave(H // k.size(1), dim=1).float()
    scale = torch.as_tensor(scale, dtype=torch.float32, device=q.device).reshape(-1, 1, 1)
    positions = torch.arange(T, device=q.device)
    # Rows go straight into one preallocated output: small per-chunk results kept alive in a list sat between
    # the large freed buffers on the CPU heap, and peak RSS grew quadratically in T (measured).
    entropy = torch.empty(B, H, T, device=q.device)
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        # Keys past the chunk's last row are masked for every row in it, so they are never computed.
        logits = (q[:, :, start:end].float() @ k[:, :, :end].transpose(-1, -2)) * scale
        q_pos, k_pos = positions[start:end], positions[:end]
        if bias is not None:
            logits = logits + bias(q_pos, k_pos)
        logits = logits.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
        entropy[:, :, start:end] = torch.special.entr(logits.softmax(-1)).sum(-1)
    return entropy


def position_buckets(max_len: int, num_buckets: int, spacing: str = "linear") -> Tensor:
    """Bucket edges over positions 0..max_len-1: int64 (n + 1,), bucket b is ``[edges[b], edges[b+1])``.

    ``"linear"``: equal widths. ``"log"``: position 0 alone, then geometrically growing buckets up to
    ``max_len`` (the paper's curves span 1..8x the training length). Rounding may merge a few narrow log
    buckets, so there are at most ``num_buckets``.
    """
    if num_buckets < 1 or max_len < 1:
        raise ValueError(f"max_len={max_len} and num_buckets={num_buckets} must be >= 1")
    if spacing == "linear":
        edges = torch.linspace(0, max_len, num_buckets + 1, dtype=torch.float64)
    elif spacing == "log":
        edges = torch.cat([torch.zeros(1, dtype=torch.float64),
                           torch.logspace(0, math.log10(max_len), num_buckets, dtype=torch.float64)])
    else:
        raise ValueError(f"spacing={spacing!r} is not a valid choice; pick one of linear, log")
    return torch.unique(edges.round().long())


def bucket_mean(sums: Tensor, counts: Tensor, edges: Tensor) -> Tensor:
    """Weighted mean per bucket: ``sum(sums) / sum(counts)`` over each ``[edges[b], edges[b+1])``.

    ``sums`` (..., T) and ``counts`` (T,) or (..., T) are per-position sums and counts as kept by the metrics
    above. Returns (..., len(edges) - 1); NaN for buckets with no count.
    """
    counts = counts.expand_as(sums)
    buckets = list(pairwise(edges.tolist()))
    bucket_sums = torch.stack([sums[..., a:b].sum(-1) for a, b in buckets], -1)
    bucket_counts = torch.stack([counts[..., a:b].sum(-1) for a, b in buckets], -1)
    return _mean_or_nan(bucket_sums, bucket_counts)


def _mean_or_nan(sums: Tensor, counts: Tensor) -> Tensor:
    """``sums / counts`` with NaN (not inf or 0) where nothing was counted."""
    return torch.where(counts > 0, sums / counts.clamp_min(1), torch.full_like(sums, float("nan")))
