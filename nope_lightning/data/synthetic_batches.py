"""The synthetic tasks' data: one task's splits and loaders (``SyntheticData``); training batches right-padded with
the loss on target tokens only (``pad_batch``) and, under a curriculum over the lengths (the synthetic stage's
``curriculum_steps``, a recipe: the examples themselves are unchanged), batches that start with the shortest examples
and widen to all of them (``CurriculumBatches``); and the batches a run resumed at step k sees (``ResumedBatches``)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Sampler

from nope_lightning.config.synthetic import SyntheticConfig, sequence_tokens
from nope_lightning.synthetic import Example, Vocabulary, make_split

IGNORE = -100  # F.cross_entropy's ignore_index: labels of non-target positions


def pad_batch(encoded: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad ``(input_ids, loss_mask)`` pairs (``Vocabulary.encode``) into a training batch.

    Returns ids (B, T+1) and labels (B, T): ``labels[:, t]`` is ``ids[:, t+1]`` where that token is a
    target token (or the final ``<eos>``), else ``IGNORE`` — prompt and padding carry no loss.
    """
    width = max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    labels = torch.full((len(encoded), width - 1), IGNORE, dtype=torch.long)
    for row, (seq, mask) in enumerate(encoded):
        ids[row, : len(seq)] = torch.tensor(seq)
        target = torch.tensor(mask[1:], dtype=torch.bool)
        labels[row, : len(seq) - 1] = torch.where(target, torch.tensor(seq[1:]), IGNORE)
    return ids, labels


class CurriculumBatches(Sampler[list[int]]):
    """``steps`` batches of ``batch_size`` indices into the training examples (``lengths``: each one's task
    length), batch s drawn uniformly, with replacement, from the examples of length <= ``cap(s)``: the shortest
    length at s = 0, rising linearly to the longest at s = ``ramp`` and staying there (``SyntheticConfig``'s
    ``curriculum_steps``). With replacement, so that a cap holding fewer examples than a batch still fills it; one
    pass is the whole training (Lightning stops at ``max_steps``), so no epoch boundary reshuffles it."""

    def __init__(self, lengths: Sequence[int], batch_size: int, steps: int, ramp: int,
                 generator: torch.Generator) -> None:
        self.order = np.argsort(lengths, kind="stable")
        self.sorted = np.asarray(lengths)[self.order]
        self.batch_size, self.steps, self.ramp, self.generator = batch_size, steps, ramp, generator

    def cap(self, step: int) -> int:
        """The longest length batch ``step`` may draw."""
        shortest, longest = int(self.sorted[0]), int(self.sorted[-1])
        return longest if step >= self.ramp else shortest + (longest - shortest) * step // self.ramp

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.steps):
            pool = int(np.searchsorted(self.sorted, self.cap(step), side="right"))
            yield self.order[torch.randint(pool, (self.batch_size,), generator=self.generator).numpy()].tolist()


class ResumedBatches:
    """``loader``'s batches as a run resumed after its first ``done`` sees them: the first iteration draws those
    ``done`` again and drops them, and yields the rest of the epoch they end in; later iterations are the loader's
    own. Drawing them again, rather than saving the loader's state, keeps its random generator on the path an
    uninterrupted run takes (a ``DataLoader`` draws from it at every epoch's start and for every permutation), so
    the resumed run trains on the same batches in the same order: ~1 s per 10,000 small batches. An epoch is drawn
    as Lightning takes it: exactly ``len(loader)`` batches, never one more (a sized loader's end is known, and asking
    past it would make a ``RandomSampler`` draw one more, empty, permutation and move the generator)."""

    def __init__(self, loader: DataLoader, done: int) -> None:
        self.loader, self.done = loader, done

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        # A generator: nothing is drawn until the first batch is asked for, and Lightning, resuming, asks for an
        # iterator more than once before it takes batches from one.
        if not self.done:
            yield from self.loader
            return
        done, self.done = self.done, 0
        for _ in range(done // len(self.loader)):  # exactly len() an epoch, as Lightning takes them (``__doc__``)
            for _ in itertools.islice(self.loader, len(self.loader)):
                pass
        batches = iter(self.loader)
        for _ in range(done % len(self.loader)):
            next(batches)
        yield from batches


class SyntheticData(LightningDataModule):
    """One task's splits (deterministic in ``cfg.seed``) and vocabulary.

    Training batches are ``pad_batch`` tensors; evaluation batches are indices (B,) into ``valid``
    (validation) or ``evaluation`` (test: valid + test sorted by size, so a batch pads little; then ``id_test``,
    the held-out ID split, by a second loader when it has examples), which the module decodes — examples are
    frozen dataclasses, which Lightning cannot move between devices.
    """

    def __init__(self, cfg: SyntheticConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab = Vocabulary.for_task(cfg.task)
        split = functools.partial(make_split, cfg.task, seed=cfg.seed, scratchpad=cfg.scratchpad,
                                  train_max_len=cfg.max_lens[0], test_max_len=cfg.max_lens[1])
        self.train = split("train", n=cfg.n_train)
        self.valid = split("valid", n=cfg.n_valid)
        self.test = split("test", n=cfg.n_test)
        self.id_test = split("id_test", n=cfg.n_id_test, avoid=self.valid) if cfg.n_id_test else []
        self.encoded = [self.vocab.encode(example) for example in self.train]
        self.evaluation = sorted(self.valid + self.test, key=lambda e: len(e.prompt) + len(e.target))
        # what a trainer weighs for activation checkpointing (``training.trainer.ResumableFit``): the longest batch
        self.batch_size, self.seq_len = cfg.batch_size, self.longest_sequence(self.train)

    def longest_sequence(self, examples: Sequence[Example]) -> int:
        """Tokens of the longest ``<bos> prompt <sep> target <eos>`` among ``examples``."""
        return max(map(sequence_tokens, examples))

    def train_dataloader(self) -> Iterable:
        """The training batches; in a run resumed at optimizer step k (Lightning restored ``trainer.global_step``
        before it asks for them), those after the first k (``ResumedBatches``)."""
        generator = torch.Generator().manual_seed(self.cfg.seed)
        collate = functools.partial(pad_batch, pad_id=self.vocab.pad_id)
        if self.cfg.curriculum_steps:
            batches = CurriculumBatches([e.length for e in self.train], self.cfg.batch_size,
                                        self.cfg.trainer.max_steps, self.cfg.curriculum_steps, generator)
            loader = DataLoader(self.encoded, batch_sampler=batches, collate_fn=collate)
        else:
            loader = DataLoader(self.encoded, batch_size=self.cfg.batch_size, shuffle=True, generator=generator,
                                collate_fn=collate)
        done = self.trainer.global_step * self.trainer.accumulate_grad_batches if self.trainer else 0
        return ResumedBatches(loader, done) if done else loader

    def val_dataloader(self) -> DataLoader:
        return DataLoader(range(len(self.valid)), batch_size=self.cfg.eval.batch_size)

    def test_dataloader(self) -> list[DataLoader]:
        return [DataLoader(range(len(split)), batch_size=self.cfg.eval.batch_size)
                for split in (self.evaluation, self.id_test) if split]
