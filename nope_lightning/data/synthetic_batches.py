"""The synthetic tasks' training batches: right-padded with the loss on target tokens only (``pad_batch``), and,
under a curriculum over the lengths (the synthetic stage's ``curriculum_steps``, a recipe: the examples themselves
are unchanged), batches that start with the shortest examples and widen to all of them (``CurriculumBatches``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

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
