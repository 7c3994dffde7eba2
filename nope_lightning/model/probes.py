"""Looking inside attention during a forward pass, one layer at a time.

``attention_probe(model, fn)`` installs ``fn(layer, q_scaled, k, mask)`` on every attention layer for the
duration of a ``with`` block. Each call sees one layer's scaled queries (B, H, T, d) — lambda, any per-query
position temperature (log-length scaling, SSMax) and 1/sqrt(d) already applied, so ``q_scaled @ k^T + mask``
are exactly the logits the kernel softmaxes — its keys
(B, H, T, d) and the additive mask (1, H | 1, T, T) or None (plain causal); a windowed layer's mask holds its
window. The callback can reduce them
(e.g. to entropies, in query chunks) before the next layer runs, so no T x T matrix of all layers ever
exists at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from nope_lightning.model.attention import Probe
from nope_lightning.model.gpt import GPT


@contextmanager
def attention_probe(model: GPT, probe: Probe) -> Iterator[None]:
    """Attach ``probe`` to every attention layer of ``model`` inside the block; always detaches."""
    layers = model.attention_layers
    for attn in layers:
        attn.probe = probe
    try:
        yield
    finally:
        for attn in layers:
            attn.probe = None


def attention_logits(q_scaled: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None,
                     query_start: int = 0, query_end: int | None = None) -> torch.Tensor:
    """Causal attention logits for query rows [query_start, query_end): (B, H, Tq, T) float32.

    Masked (future) positions are -inf, so ``softmax(-1)`` of the result is the attention distribution.
    """
    T = k.size(-2)
    query_end = T if query_end is None else query_end
    logits = q_scaled[:, :, query_start:query_end].float() @ k.float().transpose(-1, -2)
    if mask is not None:
        return logits + mask[:, :, query_start:query_end].float()
    rows = torch.arange(query_start, query_end, device=k.device)[:, None]
    return logits.masked_fill(torch.arange(T, device=k.device)[None, :] > rows, float("-inf"))


def attention_probs(model: GPT, idx: torch.Tensor, layer: int) -> torch.Tensor:
    """Full attention probabilities (B, H, T, T) of one ``layer`` for inputs ``idx`` (analysis/tests)."""
    captured: dict[str, torch.Tensor] = {}

    def keep(i: int, q_scaled: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> None:
        if i == layer:
            captured["probs"] = attention_logits(q_scaled, k, mask).softmax(-1)

    with torch.no_grad(), attention_probe(model, keep):
        model(idx)
    return captured["probs"]
