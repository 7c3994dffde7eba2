"""Attention entropy outside the evaluation windows: the probe's mask as a bias, and the converged entropy per
head that HeadScale's Fig 5 plots against the learned temperatures."""

from __future__ import annotations

import numpy as np
import torch

from nope_lightning.data.prepare import PreparedData
from nope_lightning.model.gpt import GPT
from nope_lightning.model.probes import attention_probe
from nope_lightning.numerics.metrics import attention_entropy_from_qk
from nope_lightning.results.headscale import CONVERGED_TAIL


def mask_bias(mask: torch.Tensor | None):
    """The probe's additive (1, H | 1, T, T) mask (a position bias, a sliding window, or both) as
    ``attention_entropy_from_qk``'s bias callable."""
    if mask is None:
        return None
    return lambda q_pos, k_pos: mask[0][:, q_pos][:, :, k_pos]


def validation_windows(prepared: PreparedData, length: int, count: int) -> torch.Tensor:
    """The first ``count`` contiguous (length + 1)-token windows of the val split (the validation loader's
    first windows): int64 (count', length + 1), count' <= count when the split is short."""
    tokens = prepared.tokens("val")
    count = min(count, len(tokens) // (length + 1))
    return torch.from_numpy(np.asarray(tokens[:count * (length + 1)], dtype=np.int64).reshape(count, length + 1))


@torch.no_grad()
def converged_entropy(model: GPT, windows: torch.Tensor, chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention entropy (nats) per head averaged over ``windows``: ``(tail, last)``, each (n_layer, n_head)
    float32, ``tail`` over the last 1/``CONVERGED_TAIL`` of their positions (paper 001's Fig 5, converged), ``last``
    at the last position alone (query T - 1, which attends to all T keys). ``windows`` (N, T + 1) token ids, the
    inputs are ``[:, :-1]``; ``chunk`` query rows per entropy step (memory ~ 3 * H * chunk * T floats)."""
    length = windows.size(1) - 1
    sums = torch.zeros(model.cfg.n_layer, model.cfg.n_head, length, dtype=torch.float64)

    def accumulate(layer: int, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> None:
        # The probe's q already carries the temperature and 1/sqrt(d): its softmax multiplier is 1.
        sums[layer] += attention_entropy_from_qk(q, k, 1.0, chunk, mask_bias(mask)).sum(0).double().cpu()

    device = next(model.parameters()).device
    with attention_probe(model, accumulate):
        for window in windows:  # one window at a time bounds activation memory at long target lengths
            model(window[None, :-1].to(device))
    tail = max(1, length // CONVERGED_TAIL)
    return (sums[..., -tail:].mean(-1) / len(windows)).float(), (sums[..., -1] / len(windows)).float()
