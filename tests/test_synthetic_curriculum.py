"""A curriculum over the training lengths (``curriculum_steps``, a recipe of the synthetic stage): the longest length
a batch draws rises linearly from the shortest training length to the longest, then every length is drawn; off by
default, where the training batches are the plain shuffled ones; a bad value fails at load; a grid takes it as a
task's recipe and keeps its identity when it is off."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data import RandomSampler

from nope_lightning.config import load_config
from nope_lightning.config.synthetic import SyntheticConfig, SyntheticGridConfig, sequence_tokens
from nope_lightning.data.synthetic_batches import CurriculumBatches
from nope_lightning.pipeline.steps import identity, step_hash
from nope_lightning.stages import synthetic as stage
from tests.conftest import REPO

TINY = REPO / "conf/synthetic/tiny.yaml"
#: 400 examples, 50 of each length 1..8, in a scrambled order (the sampler must not rely on the order).
LENGTHS = [1 + (7 * i) % 8 for i in range(400)]


def batches(seed: int = 0, steps: int = 40, ramp: int = 20) -> list[list[int]]:
    return list(CurriculumBatches(LENGTHS, 16, steps, ramp, torch.Generator().manual_seed(seed)))


def test_the_cap_rises_linearly_from_the_shortest_length_to_the_longest():
    drawn = batches()
    assert len(drawn) == 40 and all(len(b) == 16 for b in drawn)
    # by hand: cap(s) = 1 + floor(7 s / 20) for s < 20, then 8
    expected = {0: 1, 2: 1, 3: 2, 5: 2, 6: 3, 10: 4, 17: 6, 18: 7, 19: 7, 20: 8, 39: 8}
    for step, cap in expected.items():
        assert max(LENGTHS[i] for i in drawn[step]) <= cap
    assert {LENGTHS[i] for i in drawn[0]} == {1}  # the first batch: the shortest examples only
    after = Counter(LENGTHS[i] for b in drawn[20:] for i in b)
    assert set(after) == set(range(1, 9))  # every length once the ramp is over
    # uniform over the examples allowed: 320 draws of 8 equally common lengths, each near 40
    assert all(20 <= n <= 60 for n in after.values())


def test_the_batches_follow_the_seed():
    assert batches(0) == batches(0) != batches(1)


def test_off_by_default_the_training_batches_are_the_shuffled_ones():
    plain = stage.SyntheticData(load_config(SyntheticConfig, TINY))
    assert isinstance(plain.train_dataloader().sampler, RandomSampler)
    data = stage.SyntheticData(load_config(SyntheticConfig, TINY, ["curriculum_steps=4"]))
    loader = data.train_dataloader()
    assert isinstance(loader.batch_sampler, CurriculumBatches) and len(loader) == 8  # trainer.max_steps
    first = loader.batch_sampler.cap(0)
    assert first == min(e.length for e in data.train) == 1
    ids, labels = next(iter(loader))  # collated as the plain batches are
    assert ids.shape[0] == 16 and labels.shape == (16, ids.shape[1] - 1)


def test_a_tiny_run_trains_on_the_curriculum_s_batches(tracking_overrides, monkeypatch):
    """What the trainer feeds the model, not only what the loader holds: each step's padded width (Lightning
    could replace a batch sampler)."""
    cfg = load_config(SyntheticConfig, TINY, [*tracking_overrides, "curriculum_steps=4"])
    widths, train_step = [], stage.SyntheticLM.training_step

    def recording(self, batch, batch_idx):
        widths.append(batch[0].shape[1])
        return train_step(self, batch, batch_idx)

    monkeypatch.setattr(stage.SyntheticLM, "training_step", recording)
    assert stage.run(cfg)["steps"] == 8 == len(widths)
    train = stage.SyntheticData(cfg).train
    by_length = {n: max(sequence_tokens(e) for e in train if e.length == n) for n in (1, 4)}
    assert widths[0] == by_length[1] < by_length[4] == max(widths)  # length 1 first, the longest by the end


@pytest.mark.parametrize("overrides, message", [
    (["curriculum_steps=9"], "curriculum_steps=9 exceeds trainer.max_steps=8: the model would never train on the "
                             "longest lengths; set curriculum_steps <= 8"),
    (["curriculum_steps=-1"], "curriculum_steps=-1 is out of range"),
])
def test_a_bad_curriculum_fails_at_load(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(SyntheticConfig, TINY, overrides)


def test_a_grid_takes_a_curriculum_as_a_task_s_recipe_and_keeps_its_identity_without_one():
    plain = load_config(SyntheticGridConfig, None, ["tasks=[sort,copy]"])
    grid = load_config(SyntheticGridConfig, None, ["tasks=[sort,copy]", "task_overrides.sort=[curriculum_steps=1000]"])
    assert {c.task: c.curriculum_steps for c in grid.cells("p")} == {"sort": 1000, "copy": 0}
    assert "curriculum_steps" not in identity(plain)["base"]  # at its default: the step hash of before
    assert step_hash(grid) != step_hash(plain) and grid.config_hash != plain.config_hash
