"""Greedy decoding by full forward passes (our model has no KV cache; at these lengths that is simple
and fast enough)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


@torch.no_grad()
def greedy_decode(model: torch.nn.Module, prompts: Sequence[list[int]], max_new_tokens: int, *,
                  vocab_size: int | None = None, eos_id: int | None = None, pad_id: int = 0,
                  device: torch.device | str = "cpu") -> list[list[int]]:
    """Greedy continuation of each prompt by full forwards: ids generated, ``<eos>`` included if reached.

    ``model`` maps ids (B, T) to logits (B, T, V >= vocab_size); only the first ``vocab_size`` logits
    compete (the rest is litgpt's padding of the embedding table). Prompts are right-padded and each row
    reads its own last position — causal attention never lets the padding reach it, so prompts of any
    lengths share a batch; a row stops at ``eos_id`` (if given) or after ``max_new_tokens`` tokens.
    """
    batch = len(prompts)
    start = torch.tensor([len(p) for p in prompts], device=device)
    ids = torch.full((batch, int(start.max()) + max_new_tokens), pad_id, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(prompt, device=device)
    end = start.clone()  # next position to write, per row
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    rows = torch.arange(batch, device=device)
    for _ in range(max_new_tokens):
        logits = model(ids[:, : int(end.max())])[rows, end - 1, :vocab_size]
        token = torch.where(done, pad_id, logits.argmax(-1))
        ids[rows, end] = token  # a finished row writes padding after its <eos>, which nothing reads
        end += (~done).long()
        if eos_id is not None:
            done |= token == eos_id
        if bool(done.all()):
            break
    return [ids[row, s:e].tolist() for row, (s, e) in enumerate(zip(start.tolist(), end.tolist(), strict=True))]


def greedy_generate(model: torch.nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                    batch_size: int, vocab_size: int | None = None) -> list[list[int]]:
    """``max_new_tokens`` greedy ids for each prompt, in input order, ``batch_size`` prompts per forward."""
    device = next(model.parameters()).device
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        out += greedy_decode(model, [list(p) for p in prompts[start:start + batch_size]], max_new_tokens,
                             vocab_size=vocab_size, device=device)
    return out
