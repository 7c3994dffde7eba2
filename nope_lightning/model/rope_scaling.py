"""RoPE frequency tables and the context-extension methods used as baselines.

For head size d the RoPE inverse frequencies are ``theta_j = base^(-2j/d)``, j = 0..d/2-1, and position
p rotates pair j by angle ``p * theta_j``. A method returns new frequencies ``theta'_j`` and an attention
factor ``m`` that multiplies cos and sin (so the attention logits are scaled by ``m^2``). With
s = ``factor`` (target length / original length L):

* ``pi`` — Position Interpolation (Chen et al. 2023): positions are divided by s,
  ``theta'_j = theta_j / s``.
* ``ntk`` — NTK-aware scaling (bloc97 2023): the base is enlarged, ``base' = base * s^(d/(d-2))``, so the
  lowest frequency is interpolated by s while the highest is untouched.
* ``dynamic_ntk`` — NTK-aware with a factor that follows the current length T (Emozilla 2023, as in
  HF transformers): ``base' = base * ((s*T/L) - (s-1))^(d/(d-2))`` when T > L, the plain base otherwise.
* ``yarn`` — YaRN as its authors' code and Hugging Face's ``_compute_yarn_parameters`` compute it (what
  published YaRN numbers use): the correction dimensions ``low = floor(dim(beta_fast))`` and
  ``high = ceil(dim(beta_slow))``, clipped to [0, d-1], where ``dim(r) = d ln(L / (2 pi r)) / (2 ln base)``
  is the (continuous) pair index that makes r rotations over L; the ramp is linear in the pair index j,
  ``gamma_j = 1 - clamp((j - low) / (high - low), 0, 1)`` (``high`` nudged by 0.001 when equal to ``low``),
  ``theta'_j = (1-gamma_j)*theta_j/s + gamma_j*theta_j`` ("NTK-by-parts": pairs below ``low`` keep their
  frequency, pairs above ``high`` are interpolated by s), and the attention factor ``m = 0.1*ln(s) + 1``.
* ``yarn_paper`` — the paper's equations (Peng et al. 2023, Eq. 16-20): the same blend, with the ramp
  linear in ``r_j = L / lambda_j``, the number of rotations of pair j over L (``lambda_j = 2*pi/theta_j``):
  ``gamma(r) = 0`` for r < beta_slow, ``1`` for r > beta_fast; the same ``m``. Its frequencies differ from
  ``yarn``'s by up to ~45 % (s=4) in the middle pairs.
"""

from __future__ import annotations

import math

import torch

from nope_lightning.config.parts import RopeScalingConfig


def base_inv_freq(head_size: int, base: float) -> torch.Tensor:
    """Plain RoPE inverse frequencies ``base^(-2j/d)``, shape (d/2,), float64."""
    return base ** (-torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)


def yarn_ramp(rotations: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """The paper's gamma(r): 0 below ``alpha`` rotations, 1 above ``beta``, linear in between."""
    return ((rotations - alpha) / (beta - alpha)).clamp(0.0, 1.0)


def yarn_correction_range(head_size: int, base: float, original_len: int, beta_fast: float,
                          beta_slow: float) -> tuple[int, int]:
    """YaRN's (low, high) pair indices: the pairs making ``beta_fast`` and ``beta_slow`` rotations over
    ``original_len``, rounded outwards and clipped to [0, head_size - 1] (the reference code's rule)."""
    def dim(rotations: float) -> float:
        return head_size * math.log(original_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    return max(math.floor(dim(beta_fast)), 0), min(math.ceil(dim(beta_slow)), head_size - 1)


def yarn_dim_ramp(n_pairs: int, low: int, high: int) -> torch.Tensor:
    """The reference YaRN gamma over pair indices 0..n_pairs-1 (float64): 1 below ``low``, 0 above
    ``high``, linear in between."""
    span = high - low if high != low else 0.001  # the reference's guard against a zero-width ramp
    return 1.0 - ((torch.arange(n_pairs, dtype=torch.float64) - low) / span).clamp(0.0, 1.0)


def scaled_inv_freq(head_size: int, base: float, scaling: RopeScalingConfig, original_len: int,
                    seq_len: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (d/2,) float64 and the cos/sin factor m for ``scaling`` at length ``seq_len``.

    ``original_len`` is L, the length the model was trained at; ``seq_len`` matters only for dynamic NTK.
    """
    s, d = scaling.factor, head_size
    if scaling.method == "none" or s == 1.0:
        return base_inv_freq(d, base), 1.0
    if scaling.method == "pi":
        return base_inv_freq(d, base) / s, 1.0
    if scaling.method == "ntk":
        return base_inv_freq(d, base * s ** (d / (d - 2))), 1.0
    if scaling.method == "dynamic_ntk":
        if seq_len <= original_len:
            return base_inv_freq(d, base), 1.0
        return base_inv_freq(d, base * ((s * seq_len / original_len) - (s - 1)) ** (d / (d - 2))), 1.0
    if scaling.method in ("yarn", "yarn_paper"):
        theta = base_inv_freq(d, base)
        if scaling.method == "yarn":
            low, high = yarn_correction_range(d, base, original_len, scaling.beta_fast, scaling.beta_slow)
            gamma = yarn_dim_ramp(d // 2, low, high)
        else:
            gamma = yarn_ramp(original_len * theta / (2 * math.pi), scaling.beta_slow, scaling.beta_fast)
        return (1 - gamma) * theta / s + gamma * theta, 0.1 * math.log(s) + 1.0
    raise ValueError(f"unknown RoPE scaling method {scaling.method!r}")


def rope_cos_sin(inv_freq: torch.Tensor, seq_len: int, factor: float = 1.0,
                 device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (seq_len, d) in litgpt's half-split layout, multiplied by ``factor`` (YaRN's m)."""
    positions = torch.arange(seq_len, dtype=torch.float64)
    angles = torch.outer(positions, inv_freq)  # (T, d/2)
    angles = torch.cat([angles, angles], dim=-1)  # litgpt rotates halves [x1, x2] -> [-x2, x1]
    cos, sin = angles.cos() * factor, angles.sin() * factor
    return cos.to(device=device, dtype=torch.float32), sin.to(device=device, dtype=torch.float32)
