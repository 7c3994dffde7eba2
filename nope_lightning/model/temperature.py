"""Position-aware attention temperatures: a multiplier of each query row that depends on its absolute position.

Two kinds, per layer and head h, for the query at absolute position i (0-based) of a model trained at L tokens:

* **log-length scaling** — ``lambda_h(i) = max(1, 1 + a_h ln((i + 1) / L))`` with ``a_h >= 0``. It is exactly 1
  for every query inside the training length (i + 1 <= L: the log is <= 0, so the max picks 1), so the model's
  logits on sequences of up to L tokens are bit-identical to the plain model's; beyond L it grows like paper
  001's fitted best uniform temperature ``1 + a ln s`` (s = extension ratio), but per query instead of per run.
  ``a`` is an evaluation-time setting (``model.log_scale_a`` uniform, or ``model.log_scale_table`` per head,
  what HeadScale-log learns): a non-persistent buffer, never part of an export.
* **Scalable-Softmax** (SSMax, Nakanishi 2025, arXiv 2501.19399) — ``s_h ln n`` with n = i + 1 the number of
  keys the causal query sees and ``s_h`` a learned parameter trained from scratch (``model.ssmax=true``).
  Init ``s_h = 1 / ln L``: the multiplier is then exactly 1 at n = L, so at initialisation the model attends at
  its training length exactly as the standard softmax does, and each head learns from there how much sharper
  (n > L) or flatter (n < L) to be; any other constant would start every head off the standard scale at L.

Both multiply the per-head temperature (``head_scale``) and fold into q, so the attention kernel keeps one
scalar scale (SDPA/flash fast path): ``softmax(lambda_h * tau_h(i) * q_i.k_j / sqrt(d) + bias_ij)``. As for
the per-head temperature, an additive position bias (ALiBi, T5) is not scaled. SSMax is supported (and tested)
with nope, alibi and rope (a per-row scale of q commutes with RoPE's rotation); ``ModelConfig`` refuses others.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from nope_lightning.config import ModelConfig
    from nope_lightning.model.gpt import GPT


def ssmax_init(train_len: int) -> float:
    """``s = 1 / ln L``: the SSMax multiplier ``s ln n`` is 1 at n = L (see the module docstring)."""
    if train_len < 2:
        raise ValueError(f"SSMax needs train_len >= 2 (its scale is 1 at n = train_len; ln 1 = 0), got {train_len}")
    return 1.0 / math.log(train_len)


class PositionTemperature(nn.Module):
    """The per-query multipliers of one attention layer.

    ``log_scale`` (n_head,) or None: the slopes a_h of log-length scaling (a non-persistent buffer, set with
    ``set_log_scales``; HeadScale-log turns it into a trainable parameter). ``ssmax`` (n_head,) or None: SSMax's
    learned s_h (a parameter, exported with the model). With neither, the layer has no tensor at all and
    ``forward`` is never called (``active`` is False): the plain model is untouched.
    """

    def __init__(self, n_head: int, train_len: int, ssmax: bool = False) -> None:
        super().__init__()
        self.n_head, self.train_len = n_head, train_len
        self.register_buffer("log_scale", None, persistent=False)
        self.ssmax = nn.Parameter(torch.full((n_head,), ssmax_init(train_len))) if ssmax else None

    @property
    def active(self) -> bool:
        return self.log_scale is not None or self.ssmax is not None

    def reset_parameters(self) -> None:
        # Needed for meta-device (FSDP) init, as Attention.reset_parameters: neutral log scaling, SSMax's init.
        with torch.no_grad():
            if self.log_scale is not None:
                self.log_scale.zero_()
            if self.ssmax is not None:
                self.ssmax.fill_(ssmax_init(self.train_len))

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """positions (B | 1, T) int (absolute query positions) -> multipliers (B | 1, n_head, T, 1) float32."""
        n = (positions + 1).float()[:, None, :, None]  # keys a causal query sees
        scale = torch.ones_like(n)
        if self.log_scale is not None:
            # Inside L the log is <= 0 and a >= 0, so the clamp returns exactly 1.0 (the bit-identity above).
            a = self.log_scale.float().view(1, -1, 1, 1)
            scale = (1.0 + a * torch.log(n / self.train_len)).clamp(min=1.0)
        if self.ssmax is not None:
            scale = scale * self.ssmax.float().view(1, -1, 1, 1) * torch.log(n)
        return scale


def resolve_log_scales(cfg: ModelConfig) -> torch.Tensor | None:
    """The (n_layer, n_head) slopes a a config asks for (``log_scale_table`` or a uniform ``log_scale_a``),
    or None (no log-length scaling)."""
    from nope_lightning.model.attention import load_temperature_table

    if cfg.log_scale_table:
        return load_temperature_table(cfg.log_scale_table, cfg.n_layer, cfg.n_head, key="log_scale")
    if cfg.log_scale_a > 0:
        return torch.full((cfg.n_layer, cfg.n_head), cfg.log_scale_a)
    return None


def set_log_scales(model: GPT, table: torch.Tensor | None) -> None:
    """Write the slopes a (n_layer, n_head), >= 0, into the attention layers (None: switch log scaling off).
    A layer whose slopes are trainable (HeadScale-log) is written in place, keeping its parameter."""
    layers = [attn.position_temperature for attn in model.attention_layers]
    if table is None:
        for layer in layers:
            layer.log_scale = None
        return
    assert tuple(table.shape) == (len(layers), layers[0].n_head), table.shape
    if bool((table < 0).any()):
        raise ValueError(f"log-length slopes a must be >= 0 (got min {float(table.min()):g}): with a < 0 the "
                         f"temperature max(1, 1 + a ln((i+1)/L)) is 1 everywhere")
    device = model.lm_head.weight.device
    with torch.no_grad():
        for layer, row in zip(layers, table, strict=True):
            if isinstance(layer.log_scale, nn.Parameter):
                layer.log_scale.copy_(row)
            else:
                layer.log_scale = row.detach().float().clone().to(device)


def log_scales(model: GPT) -> torch.Tensor | None:
    """The current (n_layer, n_head) slopes a, detached, or None when log scaling is off."""
    layers = [attn.position_temperature for attn in model.attention_layers]
    if layers[0].log_scale is None:
        return None
    return torch.stack([layer.log_scale.detach() for layer in layers])


def make_log_scales_trainable(model: GPT) -> None:
    """Turn every layer's ``log_scale`` buffer into a parameter that requires grad (HeadScale-log). It then
    appears in ``state_dict`` as ``transformer.h.<l>.attn.position_temperature.log_scale`` (so training
    checkpoints hold it), which an export never does: slopes leave a run as a table file only."""
    for attn in model.attention_layers:
        layer = attn.position_temperature
        if layer.log_scale is None:
            raise ValueError("set the initial slopes (set_log_scales) before making them trainable")
        layer.log_scale = nn.Parameter(layer.log_scale.detach().clone(), requires_grad=True)
