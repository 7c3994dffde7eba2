"""Sliding-window perplexity windows and the Lightning module that scores them.

A document of n tokens is read in windows of ``length`` input tokens moved by ``stride``: window k has
inputs ``x[kS : kS+L]`` and targets ``x[kS+1 : kS+L+1]``. Two conventions for which targets are scored:

* ``last_stride`` (default): every window, a document's first included, scores only its last S targets, so
  every scored token has at least L - S tokens of context — the reference sliding-window evaluation
  (S = 256 at L = 2K), and the one under which perplexity at length L measures reading with ~L of context.
* ``first_full``: a document's first window scores all its L targets, later ones their last S, so every
  target of a document is scored exactly once (its first L - S targets with less context).
 Windows are listed document by document (documents in
a fixed order) until ``budget`` targets are scored; the list — hence the perplexity — does not depend on
the batch size or on how many processes share it (rank r takes windows r, r + W, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from lightning.pytorch import LightningModule
from torch.utils.data import Dataset

from nope_lightning.data import PreparedData
from nope_lightning.metrics import AttentionEntropy, PositionNLL, TokenNLL, attention_entropy_from_qk
from nope_lightning.model import GPT
from nope_lightning.model.probes import attention_probe


@dataclass(frozen=True)
class Window:
    """Inputs ``doc[start : start + length]``; targets from index ``score_from`` of the window are scored."""

    doc: int
    start: int
    score_from: int


def sliding_windows(doc_lengths: list[int], length: int, stride: int, budget: int,
                    scoring: str = "last_stride") -> list[Window]:
    """Windows over documents with at least ``length + 1`` tokens until ``budget`` targets are scored;
    ``scoring`` is ``last_stride`` or ``first_full`` (module docstring)."""
    if not 0 < stride <= length:
        raise ValueError(f"stride={stride} must be in 1..{length} (the window length)")
    if scoring not in ("last_stride", "first_full"):
        raise ValueError(f"scoring={scoring!r}: pick last_stride or first_full")
    windows: list[Window] = []
    scored = 0
    for doc, n in enumerate(doc_lengths):
        start = 0
        while start + length + 1 <= n and scored < budget:
            score_from = 0 if start == 0 and scoring == "first_full" else length - stride
            windows.append(Window(doc, start, score_from))
            scored += length - score_from
            start += stride
    return windows


def tiled_windows(doc_lengths: list[int], length: int, count: int) -> list[Window]:
    """Up to ``count`` non-overlapping windows (all targets scored) for per-position curves and entropy."""
    windows = [Window(doc, start, 0) for doc, n in enumerate(doc_lengths)
               for start in range(0, n - length, length)]
    return windows[:count]


class WindowDataset(Dataset):
    """Items ``(tokens (length + 1,) int64, score_from int)``; this rank's share of ``windows``."""

    def __init__(self, docs: list[np.ndarray], windows: list[Window], length: int, rank: int = 0,
                 world: int = 1) -> None:
        self.docs, self.windows, self.length = docs, windows[rank::world], length

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        w = self.windows[i]
        tokens = self.docs[w.doc][w.start:w.start + self.length + 1]
        return torch.as_tensor(np.asarray(tokens, dtype=np.int64)), w.score_from


@dataclass(frozen=True)
class Stream:
    """One evaluation dataloader: ``kind`` is ppl, position or entropy; ``corpus`` and window ``length``."""

    kind: str
    corpus: str
    length: int


class WindowEvaluator(LightningModule):
    """Scores windows in ``trainer.test``: one dataloader per ``Stream`` (dataloader_idx = stream index).

    Results (synced across processes) land in ``self.results`` at the end of the test epoch:
    ``("ppl", corpus, L) -> TokenNLL``, ``("position", corpus, L) -> PositionNLL``,
    ``("entropy", corpus, L) -> AttentionEntropy`` — metric objects, already computed.
    """

    def __init__(self, model: GPT, streams: list[Stream], entropy_chunk: int) -> None:
        super().__init__()
        self.model, self.streams, self.entropy_chunk = model, streams, entropy_chunk
        cfg = model.cfg
        self.metrics = torch.nn.ModuleList(
            TokenNLL() if s.kind == "ppl" else PositionNLL(s.length) if s.kind == "position"
            else AttentionEntropy(cfg.n_layer, cfg.n_head, s.length) for s in streams)
        self.results: dict[tuple[str, str, int], object] = {}

    def test_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        tokens, score_from = batch
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        stream, metric = self.streams[dataloader_idx], self.metrics[dataloader_idx]
        if stream.kind == "entropy":
            with attention_probe(self.model, lambda layer, q, k, mask: metric.update(
                    layer, entropy=attention_entropy_from_qk(q, k, 1.0, self.entropy_chunk, mask_bias(mask)))):
                self.model(inputs)
            return
        logits = self.model(inputs)
        positions = torch.arange(inputs.size(1), device=tokens.device)
        metric.update(logits, targets, positions[None, :] >= score_from[:, None])

    def on_test_epoch_end(self) -> None:
        for stream, metric in zip(self.streams, self.metrics, strict=True):
            metric.compute()  # syncs the sum states across processes once, here, where all ranks are
            self.results[stream.kind, stream.corpus, stream.length] = metric


def mask_bias(mask: torch.Tensor | None):
    """The probe's additive (1, H, T, T) mask as ``attention_entropy_from_qk``'s bias callable."""
    if mask is None:
        return None
    return lambda q_pos, k_pos: mask[0][:, q_pos][:, :, k_pos]


CONVERGED_TAIL = 8  # "converged" entropy: mean over the last 1/8 of a window's positions


def validation_windows(prepared: PreparedData, length: int, count: int) -> torch.Tensor:
    """The first ``count`` contiguous (length + 1)-token windows of the val split (the validation loader's
    first windows): int64 (count', length + 1), count' <= count when the split is short."""
    tokens = prepared.tokens("val")
    count = min(count, len(tokens) // (length + 1))
    return torch.from_numpy(np.asarray(tokens[:count * (length + 1)], dtype=np.int64).reshape(count, length + 1))


@torch.no_grad()
def converged_entropy(model: GPT, windows: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Attention entropy (nats) per head averaged over ``windows`` and the last 1/``CONVERGED_TAIL`` of their
    positions (paper 001's Fig 5): (n_layer, n_head) float32. ``windows`` (N, T + 1) token ids, the inputs are
    ``[:, :-1]``; ``chunk`` query rows per entropy step (memory ~ 3 * H * chunk * T floats)."""
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
    return (sums[..., -tail:].mean(-1) / len(windows)).float()
