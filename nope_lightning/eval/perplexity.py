"""Evaluation windows and the Lightning module that scores them, one number per window.

**Sliding-window perplexity on the same targets at every length.** A window of ``length`` input tokens ending
at document index ``end`` has inputs ``x[end - length : end]`` and targets ``x[end - length + 1 : end + 1]``;
it scores its last ``stride`` targets, ``x[end - stride + 1 : end + 1]``, each with at least
``length - stride + 1`` tokens of context (the reference sliding-window evaluation scores a window's last S
targets, S = 256 at L = 2K). The windows of every length end on the same ``end`` tokens (``target_ends``), so
PPL at 1x and at 8x are measured on exactly the same target tokens: a ratio or difference across lengths is the
effect of context alone, and differences between methods are paired on the tokens. The ends are spread evenly
over all documents long enough for the longest window (not the first documents in order), so a small budget
still samples the whole split; the list does not depend on the batch size or the number of processes (rank r
takes windows r, r + W, ...).

**Per-position curves** come from non-overlapping windows of the longest length (``tiled_windows``, also spread
evenly), every target scored: position t of a window is the prediction of token t + 1 from t + 1 tokens.

Every stream keeps one row of sums per window (``WindowSums``), so the report can bootstrap over windows.
``split_documents_of`` / ``comparable_documents`` pick the documents an evaluation reads; ``WindowData`` serves
the windows to ``trainer.test``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from lightning.pytorch import LightningDataModule, LightningModule
from torch.utils.data import DataLoader, Dataset

from nope_lightning.data.corpus import BUILTIN_CORPORA, load_documents, split_documents
from nope_lightning.eval.entropy import mask_bias
from nope_lightning.model.gpt import GPT
from nope_lightning.model.probes import attention_probe
from nope_lightning.numerics.metrics import AttentionEntropy, WindowSums, attention_entropy_from_qk, token_nll


@dataclass(frozen=True)
class Window:
    """Inputs ``doc[start : start + length]``; targets from index ``score_from`` of the window are scored."""

    doc: int
    start: int
    score_from: int


def spread(count: int, total: int) -> list[int]:
    """``count`` indices spread evenly over ``range(total)`` (all of them when ``count >= total``), sorted."""
    if count >= total:
        return list(range(total))
    return sorted({int(i) for i in np.linspace(0, total - 1, count).round()})


def target_ends(doc_lengths: list[int], longest: int, stride: int, budget: int) -> list[tuple[int, int]]:
    """``(doc, end)`` of the windows scoring about ``budget`` targets: ``ceil(budget / stride)`` ends spread
    evenly over every end ``longest, longest + stride, ... <= n - 1`` of every document of n tokens (the
    longest window must fit before ``end``). Sorted by document, then end."""
    if stride < 1:
        raise ValueError(f"stride={stride} must be >= 1")
    candidates = [(doc, end) for doc, n in enumerate(doc_lengths) for end in range(longest, n, stride)]
    return [candidates[i] for i in spread(math.ceil(budget / stride), len(candidates))]


def scoring_windows(ends: list[tuple[int, int]], length: int, stride: int) -> list[Window]:
    """The windows of ``length`` tokens ending at ``ends``, each scoring its last ``stride`` targets."""
    if not 0 < stride <= length:
        raise ValueError(f"stride={stride} must be in 1..{length} (the shortest window length)")
    return [Window(doc, end - length, length - stride) for doc, end in ends]


def tiled_windows(doc_lengths: list[int], length: int, count: int) -> list[Window]:
    """Up to ``count`` non-overlapping windows of ``length`` tokens (all targets scored), spread evenly over
    all the documents' tiles, for per-position curves and entropy."""
    tiles = [Window(doc, start, 0) for doc, n in enumerate(doc_lengths) for start in range(0, n - length, length)]
    return [tiles[i] for i in spread(count, len(tiles))]


class WindowDataset(Dataset):
    """Items ``(tokens (length + 1,) int64, score_from, window index)``; this rank's share of ``windows``."""

    def __init__(self, docs: list[np.ndarray], windows: list[Window], length: int, rank: int = 0,
                 world: int = 1) -> None:
        self.docs, self.length = docs, length
        self.items = list(enumerate(windows))[rank::world]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        index, w = self.items[i]
        tokens = self.docs[w.doc][w.start:w.start + self.length + 1]
        return torch.as_tensor(np.asarray(tokens, dtype=np.int64)), w.score_from, index


@dataclass(frozen=True)
class Stream:
    """One evaluation dataloader: ``kind`` ``ppl`` (scoring windows) or ``position`` (tiled windows, every
    target; ``entropy`` also probes attention), its ``corpus``, window ``length`` and number of ``windows``."""

    kind: str
    corpus: str
    length: int
    windows: int
    entropy: bool = False


class WindowEvaluator(LightningModule):
    """Scores windows in ``trainer.test``: one dataloader per ``Stream`` (dataloader_idx = stream index).

    Per stream, synced across processes into ``self.results`` at the end of the test epoch:
    ``("ppl", corpus, L)``: (windows, 2) float64, each window's NLL sum (nats) and scored-token count;
    ``("position", corpus, L)``: (windows, L) NLL per window and position; with ``entropy`` also
    ``("entropy", corpus, L)``: (windows, L) attention entropy (nats) per window and query position, averaged
    over layers and heads, and ``("entropy_heads", corpus, L)``: the ``AttentionEntropy`` per layer x head.
    """

    def __init__(self, model: GPT, streams: list[Stream], entropy_chunk: int) -> None:
        super().__init__()
        self.model, self.streams, self.entropy_chunk = model, streams, entropy_chunk
        cfg = model.cfg
        self.metrics = torch.nn.ModuleList(WindowSums(s.windows, 2 if s.kind == "ppl" else s.length) for s in streams)
        self.entropy = torch.nn.ModuleDict({
            str(i): torch.nn.ModuleList([WindowSums(s.windows, s.length), AttentionEntropy(cfg.n_layer, cfg.n_head,
                                                                                            s.length)])
            for i, s in enumerate(streams) if s.entropy})
        self.results: dict[tuple[str, str, int], object] = {}

    def test_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        tokens, score_from, index = batch
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        stream, metric = self.streams[dataloader_idx], self.metrics[dataloader_idx]
        if stream.entropy:
            logits = self._probed_forward(inputs, index, *self.entropy[str(dataloader_idx)])
        else:
            logits = self.model(inputs)
        positions = torch.arange(inputs.size(1), device=tokens.device)
        nll, scored = token_nll(logits, targets, positions[None, :] >= score_from[:, None])
        if stream.kind == "ppl":
            metric.update(index, torch.stack([nll.sum(1, dtype=torch.float64), scored.sum(1).double()], 1))
        else:
            metric.update(index, nll)

    def _probed_forward(self, inputs: torch.Tensor, index: torch.Tensor, per_window: WindowSums,
                        heads: AttentionEntropy) -> torch.Tensor:
        """The forward with the entropy probe attached: per-window (layer- and head-mean) and per-head sums."""
        n_layer, n_head = self.model.cfg.n_layer, self.model.cfg.n_head
        mean = torch.zeros(inputs.shape, dtype=torch.float64, device=inputs.device)

        def record(layer: int, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> None:
            entropy = attention_entropy_from_qk(q, k, 1.0, self.entropy_chunk, mask_bias(mask))
            heads.update(layer, entropy=entropy)
            mean.add_(entropy.sum(1, dtype=torch.float64) / (n_layer * n_head))

        with attention_probe(self.model, record):
            logits = self.model(inputs)
        per_window.update(index, mean)
        return logits

    def on_test_epoch_end(self) -> None:
        for i, (stream, metric) in enumerate(zip(self.streams, self.metrics, strict=True)):
            # compute() syncs the sum states across processes once, here, where all ranks are
            self.results[stream.kind, stream.corpus, stream.length] = metric.compute().cpu()
            if stream.entropy:
                per_window, heads = self.entropy[str(i)]
                self.results["entropy", stream.corpus, stream.length] = per_window.compute().cpu()
                heads.compute()
                self.results["entropy_heads", stream.corpus, stream.length] = heads


def split_documents_of(loaded, corpus: str, tokenizer, split: str) -> list[tuple[str, np.ndarray]]:
    """``(text, token ids)`` of the ``split`` (val or test) of ``corpus``; the ids carry BOS/EOS.

    The model's own training corpus (and any built-in corpus, whose splits are fixed by the data config) is
    split as the model's data config splits it, so test documents were never trained on. A folder that is
    not the training corpus is an evaluation set (e.g. a PG19 or Proof-pile test folder) and is used whole
    for ``test``; selecting on such a folder (``val``) would select on the test data, so it is refused.
    """
    data = loaded.config.data
    documents = load_documents(corpus, data.cache_path)
    if corpus in BUILTIN_CORPORA or corpus == data.corpus:
        docs = split_documents(documents, data.val_fraction, data.test_fraction, data.split_seed)[split]
    elif split == "test":
        docs = documents
    else:
        raise ValueError(f"corpus {corpus!r} is an evaluation folder, used whole as test data: selecting on it "
                         f"(split=val) would select on test data; use the model's own corpus for split=val")
    encoded = tokenizer.encode_batch([d.text for d in docs])
    return [(d.text, np.asarray([tokenizer.bos_id, *ids, tokenizer.eos_id], dtype=np.int64))
            for d, ids in zip(docs, encoded, strict=True)]


def comparable_documents(corpus: str, arrays: list[np.ndarray], longest: int, split: str) -> list[np.ndarray]:
    """The documents long enough for the longest window: every length is then scored on the same
    documents, so PPL differences across lengths come from context, not from a changing document mix."""
    kept = [a for a in arrays if len(a) >= longest + 1]
    if not kept:
        raise ValueError(f"no {split} document of corpus {corpus!r} has {longest + 1} tokens (longest: "
                         f"{max(map(len, arrays))}); lower eval_lengths or use a corpus with longer documents")
    return kept


class WindowData(LightningDataModule):
    """One test dataloader per stream, sharded by rank inside ``WindowDataset``."""

    def __init__(self, docs: dict[str, list[np.ndarray]], streams: list[Stream], windows: list, batch_size: int):
        super().__init__()
        self.docs, self.streams, self.windows, self.batch_size = docs, streams, windows, batch_size

    def test_dataloader(self) -> list[DataLoader]:
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        return [DataLoader(WindowDataset(self.docs[s.corpus], w, s.length, rank, world), batch_size=self.batch_size)
                for s, w in zip(self.streams, self.windows, strict=True)]
