"""LightningDataModule over packed token files: random training windows, fixed validation windows.

Training batch number ``k`` is a pure function of ``(seed, k, rank)``: ``batch_size`` windows of
``seq_len + 1`` tokens at offsets drawn from ``numpy.random.default_rng([seed, k, rank])``, uniform over
the train token stream (windows may span document boundaries, which BOS/EOS mark). ``k`` counts batches
drawn, i.e. the optimizer step when ``accumulate_grad_batches=1``. An optional ``RetrievalMix`` replaces a
fraction of the windows by passkey sequences (``data/retrieval.py``), validation windows never. The stream is infinite (training stops
at ``max_steps``) and ``train_dataloader()`` starts it at the trainer's position
(``global_step * accumulate_grad_batches``), so a run resumed from a checkpoint sees exactly the batches
the uninterrupted run would have seen.

Validation uses the first ``val_batches * batch_size`` contiguous, non-overlapping windows of the val
split, in order. Under DDP they are **sharded by rank without overlap**: rank r of W takes windows
r, r + W, ... (the last ``< W`` windows are dropped so every rank runs the same number of batches), so
the module should log validation metrics with ``sync_dist=True`` to average them over ranks.

Data prepared with ``data.engine=litdata`` keeps its train split as litdata token chunks, read through
litdata's ``StreamingDataset`` with a ``TokensLoader`` of ``seq_len + 1`` tokens (``StreamedBlocks``): each
chunk is cut into non-overlapping windows (its last ``< seq_len + 1`` tokens are never read, and no window
spans two chunks), and batch ``k`` draws its windows' indices from the same generator, uniform over all
windows, so batches stay a pure function of ``(seed, k, rank)`` and resumption is exact. The val split is a
packed file either way, read as above. Retrieval mixing needs the memory engine (its corpus filler draws
spans from the whole train stream).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from litdata import StreamingDataset, TokensLoader
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, get_worker_info

from nope_lightning.config.data import DataConfig
from nope_lightning.data.prepare import PreparedData, prepare
from nope_lightning.data.retrieval import RetrievalMix

STREAMED_MIX = ("retrieval mixing draws corpus filler from the whole train stream: prepare with "
                "data.engine=memory, or set retrieval.fraction=0")


def sample_batch(tokens: np.ndarray, step: int, seq_len: int, batch_size: int, seed: int,
                 rank: int, mix: RetrievalMix | None = None) -> torch.Tensor:
    """Training batch number ``step`` for ``rank``: int64 tensor of shape ``(batch_size, seq_len + 1)``.

    With ``mix``, some rows are then replaced by retrieval sequences drawn from a second generator, so the
    corpus windows are the same with or without a mix."""
    rng = np.random.default_rng([seed, step, rank])
    starts = rng.integers(0, len(tokens) - seq_len, size=batch_size)  # last start: len - (seq_len + 1)
    batch = np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int64)
    if mix is not None:
        mix.apply(batch, tokens, np.random.default_rng([seed, step, rank, 1]))
    return torch.from_numpy(batch)


class TokenFile:
    """A packed ``.bin`` token file, memory-mapped on first use. It pickles as its path, so DataLoader
    workers each map the file instead of receiving a copy of the tokens."""

    def __init__(self, path: str | os.PathLike, dtype: np.dtype):
        self.path, self.dtype = str(path), np.dtype(dtype)
        self._tokens: np.memmap | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokens": None}

    @property
    def tokens(self) -> np.memmap:
        """The file's tokens, shape ``(len(self),)``, read-only."""
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        return self._tokens

    def __len__(self) -> int:
        return os.path.getsize(self.path) // self.dtype.itemsize

    def batch(self, step: int, seq_len: int, batch_size: int, seed: int, rank: int,
              mix: RetrievalMix | None) -> torch.Tensor:
        """``sample_batch`` over the file's tokens."""
        return sample_batch(self.tokens, step, seq_len, batch_size, seed, rank, mix)


class StreamedBlocks:
    """A litdata train split (``folder``: ``index.json`` + token chunks) as windows of ``width`` tokens, read
    through ``StreamingDataset`` + ``TokensLoader`` (see the module docstring). The dataset is opened on first
    use; the object pickles as its folder, so DataLoader workers each open their own."""

    def __init__(self, folder: str | os.PathLike, width: int):
        self.folder, self.width = str(folder), width
        chunks = json.loads((Path(folder) / "index.json").read_text())["chunks"]
        # counted here, not by len(dataset): that is the share of one rank under DDP
        self.count = sum(chunk["dim"] // width for chunk in chunks)
        self._dataset: StreamingDataset | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_dataset": None}

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> np.ndarray:
        """Window ``i``, shape ``(width,)``, the chunks' dtype."""
        if self._dataset is None:
            self._dataset = StreamingDataset(self.folder, item_loader=TokensLoader(block_size=self.width))
        return self._dataset[i]

    def batch(self, step: int, seq_len: int, batch_size: int, seed: int, rank: int,
              mix: RetrievalMix | None) -> torch.Tensor:
        """Training batch number ``step`` for ``rank``: int64 ``(batch_size, seq_len + 1)``, windows drawn
        from ``numpy.random.default_rng([seed, step, rank])`` uniformly over all windows (``seq_len + 1`` is
        ``width``)."""
        if mix is not None:
            raise ValueError(STREAMED_MIX)
        rows = np.random.default_rng([seed, step, rank]).integers(0, self.count, size=batch_size)
        return torch.from_numpy(np.stack([self[int(i)] for i in rows]).astype(np.int64))


class RandomWindowBatches(IterableDataset):
    """Infinite stream of whole training batches ``start_step, start_step + 1, ...`` (see ``sample_batch``).

    With ``W`` DataLoader workers, worker ``w`` makes batches ``start_step + w, start_step + w + W, ...``;
    the DataLoader reads workers round-robin, so the batches still arrive in order.
    """

    def __init__(self, file: TokenFile | StreamedBlocks, seq_len: int, batch_size: int, seed: int, rank: int,
                 start_step: int, mix: RetrievalMix | None = None):
        super().__init__()
        self.file, self.seq_len, self.batch_size = file, seq_len, batch_size
        self.seed, self.rank, self.start_step, self.mix = seed, rank, start_step, mix

    def __iter__(self):
        worker = get_worker_info()
        step, stride = (self.start_step, 1) if worker is None else (self.start_step + worker.id,
                                                                     worker.num_workers)
        while True:
            yield self.file.batch(step, self.seq_len, self.batch_size, self.seed, self.rank, self.mix)
            step += stride


class ContiguousWindows(Dataset):
    """Window ``i`` = tokens ``[i * (seq_len + 1), (i + 1) * (seq_len + 1))``, int64, shape ``(seq_len + 1,)``;
    the first ``max_windows`` that fit in the file."""

    def __init__(self, file: TokenFile, seq_len: int, max_windows: int):
        self.file, self.width = file, seq_len + 1
        self.count = min(max_windows, len(file) // self.width)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < self.count:
            raise IndexError(i)
        return torch.from_numpy(self.file.tokens[i * self.width:(i + 1) * self.width].astype(np.int64))


class PackedDataModule(LightningDataModule):
    """Train/val dataloaders over ``prepared``; batches are int64 ``(batch_size, seq_len + 1)`` token ids
    (inputs ``[:, :-1]``, targets ``[:, 1:]``). See the module docstring for sampling and resumption."""

    def __init__(self, prepared: PreparedData, seq_len: int, batch_size: int, seed: int, val_batches: int,
                 num_workers: int = 0, mix: RetrievalMix | None = None):
        super().__init__()
        for name, value, low in (("seq_len", seq_len, 1), ("batch_size", batch_size, 1),
                                 ("val_batches", val_batches, 1), ("num_workers", num_workers, 0),
                                 ("seed", seed, 0)):
            if value < low:
                raise ValueError(f"{name}={value} must be >= {low}")
        for split in ("train", "val"):
            if prepared.num_tokens(split) < seq_len + 1:
                raise ValueError(f"the {split} split has {prepared.num_tokens(split)} tokens, fewer than "
                                 f"seq_len + 1 = {seq_len + 1}; use a shorter seq_len or a bigger corpus")
        if prepared.streamed("train") and mix is not None:
            raise ValueError(STREAMED_MIX)
        if prepared.streamed("train") and not len(StreamedBlocks(prepared.root / "train", seq_len + 1)):
            raise ValueError(f"no litdata chunk of the train split holds seq_len + 1 = {seq_len + 1} tokens; "
                             f"use a shorter seq_len or a bigger corpus")
        self.prepared = prepared
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.val_batches, self.num_workers, self.mix = val_batches, num_workers, mix

    @classmethod
    def from_config(cls, data_cfg: DataConfig, seq_len: int, batch_size: int, seed: int,
                    val_batches: int) -> PackedDataModule:
        """Prepare ``data_cfg``'s corpus (cached) and wrap it; workers from ``data.num_workers``."""
        return cls(prepare(data_cfg), seq_len, batch_size, seed, val_batches, data_cfg.num_workers)

    def _file(self, split: str) -> TokenFile:
        return TokenFile(self.prepared.root / f"{split}.bin", self.prepared.dtype)

    def _rank_and_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def start_step(self) -> int:
        """The batch number the next training stream starts at: the trainer's micro-batch count, i.e.
        ``global_step * accumulate_grad_batches`` (0 with no trainer attached)."""
        trainer = self.trainer
        if trainer is None:
            return 0
        return trainer.global_step * trainer.accumulate_grad_batches

    def train_dataloader(self) -> DataLoader:
        rank, _ = self._rank_and_world()
        train = StreamedBlocks(self.prepared.root / "train", self.seq_len + 1) \
            if self.prepared.streamed("train") else self._file("train")
        stream = RandomWindowBatches(train, self.seq_len, self.batch_size, self.seed, rank, self.start_step(),
                                     self.mix)
        return DataLoader(stream, batch_size=None, num_workers=self.num_workers,
                          pin_memory=torch.cuda.is_available())

    def val_dataloader(self) -> DataLoader:
        rank, world = self._rank_and_world()
        windows = ContiguousWindows(self._file("val"), self.seq_len, self.val_batches * self.batch_size)
        # Our own DistributedSampler: Lightning then leaves it alone, and drop_last avoids the padding
        # (repeated windows) its default sampler would add.
        sampler = DistributedSampler(windows, num_replicas=world, rank=rank, shuffle=False, drop_last=True)
        return DataLoader(windows, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, pin_memory=torch.cuda.is_available())
