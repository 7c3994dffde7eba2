"""The T5 relative bias against transformers' own bucket function, and which buckets a task's test split reaches
that its training never does (tools/t5_buckets.py)."""

import math
import sys

import pytest
import torch

from nope_lightning.config.parts import ModelConfig
from nope_lightning.model.attention import t5_buckets
from nope_lightning.model.gpt import GPT
from tests.conftest import load_script


@pytest.mark.parametrize(("buckets", "max_distance"), [(32, 128), (64, 256), (16, 64), (8, 20)])
def test_buckets_equal_transformers_decoder_buckets(buckets, max_distance):
    """Paper 002's T5 is a decoder (``is_decoder=True``: ``bidirectional=False``); transformers' bucket of
    ``memory - query = -(i - j)`` is ours of ``i - j``, for every distance up to far past ``max_distance``."""
    from transformers.models.t5.modeling_t5 import T5Attention

    distance = torch.arange(0, 3000)
    oracle = T5Attention._relative_position_bucket(-distance, bidirectional=False, num_buckets=buckets,
                                                   max_distance=max_distance)
    assert torch.equal(t5_buckets(distance, buckets, max_distance), oracle)


def test_defaults_are_t5_base_and_one_table_for_all_layers():
    """t5-base's 32 buckets and transformers' max distance 128, one (bucket, head) table: every layer's bias
    is the same tensor, as in T5, where only block 0 owns the table."""
    cfg = ModelConfig(n_layer=3, n_head=2, n_embd=16, intermediate_size=32, pos_encoding="t5", max_positions=300)
    assert (cfg.t5_num_buckets, cfg.t5_max_distance) == (32, 128)
    model = GPT(cfg, vocab_size=32, train_len=16)
    tables = [p for name, p in model.named_parameters() if "rel_bias" in name]
    assert len(tables) == 1 and tables[0].shape == (32, 2)


def test_untrained_buckets_by_hand():
    """copy's longest training sequence is 45 positions (distance 44): bucket 16 + floor(16 ln(44/16) / ln 8) = 23;
    its longest test sequence, 85 positions (distance 84): bucket 16 + floor(16 ln(84/16) / ln 8) = 28. So test
    distances fall in five buckets (24-28) whose biases training never moved."""
    tool = load_script("tools/t5_buckets.py")
    try:
        by_hand = [16 + math.floor(16 * math.log(d / 16) / math.log(8)) for d in (44, 84)]
        assert by_hand == [23, 28]
        assert tool.reach("copy", "train", "none", 500, 32, 128) == (45, 23)
        assert tool.reach("copy", "test", "none", 500, 32, 128) == (85, 28)
    finally:
        sys.modules.pop("t5_buckets", None)
