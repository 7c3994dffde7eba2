"""Greedy decoding by full forward passes (our model has no KV cache; at these lengths that is simple
and fast enough), batched over prompts of equal length."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from nope_lightning.model import GPT


@torch.no_grad()
def greedy_generate(model: GPT, prompts: Sequence[Sequence[int]], max_new_tokens: int, batch_size: int,
                    vocab_size: int | None = None) -> list[list[int]]:
    """Greedy continuations (``max_new_tokens`` ids each) of ``prompts``, in input order.

    Prompts are grouped by length so that no padding ever enters a causal context. Ids at or above
    ``vocab_size`` (the padding rows of the embedding table) are never chosen.
    """
    device = next(model.parameters()).device
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        by_length[len(prompt)].append(i)
    out: list[list[int]] = [[] for _ in prompts]
    for indices in by_length.values():
        for start in range(0, len(indices), batch_size):
            chunk = indices[start:start + batch_size]
            ids = torch.tensor([list(prompts[i]) for i in chunk], dtype=torch.long, device=device)
            for _ in range(max_new_tokens):
                logits = model(ids)[:, -1, :vocab_size].float()
                ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
            for row, i in enumerate(chunk):
                out[i] = ids[row, -max_new_tokens:].tolist()
    return out
