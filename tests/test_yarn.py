"""YaRN against independent computations: the reference code's rule (``yarn``) and the paper's (``yarn_paper``).

The reference is transcribed here from the YaRN authors' ``LlamaYaRNScaledRotaryEmbedding`` / Hugging Face's
``_compute_yarn_parameters`` (find_correction_dim, floor/ceil correction range, linear ramp over the pair
index, mscale 0.1 ln s + 1), in the same float32 arithmetic HF uses.
"""

from __future__ import annotations

import math

import pytest
import torch

from nope_lightning.config import ModelConfig, RopeScalingConfig
from nope_lightning.model import GPT
from nope_lightning.model.rope_scaling import scaled_inv_freq


def hf_yarn(dim: int, base: float, factor: float, original_len: int, beta_fast: float = 32.0,
            beta_slow: float = 1.0) -> tuple[torch.Tensor, float]:
    """Hugging Face's ``_compute_yarn_parameters`` (truncate=True), step by step, float32."""
    def find_correction_dim(num_rotations):
        return (dim * math.log(original_len / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(find_correction_dim(beta_fast)), 0)
    high = min(math.ceil(find_correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, 0.1 * math.log(factor) + 1.0


@pytest.mark.parametrize("dim,base,factor,L", [(128, 10000.0, 4.0, 4096), (64, 10000.0, 8.0, 2048),
                                               (32, 10000.0, 2.0, 256), (16, 500000.0, 16.0, 64)])
def test_yarn_matches_the_reference_implementation(dim, base, factor, L):
    ours, m = scaled_inv_freq(dim, base, RopeScalingConfig("yarn", factor), L, 8 * L)
    ref, ref_m = hf_yarn(dim, base, factor, L)
    assert torch.allclose(ours.float(), ref, rtol=1e-6, atol=0)
    assert m == pytest.approx(ref_m, rel=1e-12)


def test_yarn_correction_range_of_llama2_by_hand():
    # d=128, base 1e4, L=4096: dim(32) = 128 ln(4096/(64 pi)) / (2 ln 1e4) = 20.95 -> 20,
    # dim(1) = 128 ln(4096/(2 pi)) / (2 ln 1e4) = 45.03 -> 46: pairs < 20 keep theta, pairs >= 46 get theta/s.
    theta = 10000.0 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    yarn, _ = scaled_inv_freq(128, 10000.0, RopeScalingConfig("yarn", 4.0), 4096, 4096)
    assert torch.allclose(yarn[:21], theta[:21]) and not torch.allclose(yarn[21], theta[21])
    assert torch.allclose(yarn[46:], theta[46:] / 4) and not torch.allclose(yarn[45], theta[45] / 4)
    gamma = 1 - (33 - 20) / (46 - 20)  # pair 33, halfway up the ramp
    assert yarn[33].item() == pytest.approx((1 - gamma) * theta[33].item() / 4 + gamma * theta[33].item())


def test_yarn_paper_follows_the_papers_equations():
    d, base, L, s = 16, 10000.0, 64, 4.0
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    yarn, m = scaled_inv_freq(d, base, RopeScalingConfig("yarn_paper", s, beta_fast=32, beta_slow=1), L, L)
    rotations = L * theta / (2 * math.pi)
    for j in range(d // 2):
        gamma = min(1.0, max(0.0, (rotations[j].item() - 1) / 31))
        assert yarn[j].item() == pytest.approx((1 - gamma) * theta[j].item() / s + gamma * theta[j].item())
    assert m == pytest.approx(0.1 * math.log(s) + 1)


def test_the_two_yarn_ramps_differ_in_the_middle_pairs():
    ref, _ = scaled_inv_freq(128, 10000.0, RopeScalingConfig("yarn", 4.0), 4096, 4096)
    paper, _ = scaled_inv_freq(128, 10000.0, RopeScalingConfig("yarn_paper", 4.0), 4096, 4096)
    relative = (paper / ref - 1).abs()
    assert relative.max().item() > 0.3  # the gap the issue measured (44 % at s=4)
    assert relative[:5].max().item() < 1e-12 and relative[-5:].max().item() < 1e-12  # both ends agree


def test_model_rotates_by_the_reference_yarn_tables():
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=32, intermediate_size=64, pos_encoding="rope",
                      max_positions=256, rope_scaling=RopeScalingConfig("yarn", 4.0))
    cos, sin = GPT(cfg, 97, train_len=32).rope_tables(128, torch.device("cpu"))
    ref, m = hf_yarn(16, 10000.0, 4.0, 32)
    angles = torch.arange(128, dtype=torch.float64)[:, None] * ref.double()
    assert torch.allclose(cos[0, :, :8].double(), angles.cos() * m, atol=1e-5)
    assert torch.allclose(sin[0, :, 8:].double(), angles.sin() * m, atol=1e-5)
