"""Whether a training run needs activation checkpointing: its memory per device without it, against the device's.

``trainer.activation_checkpointing=auto`` (the default) recomputes each block's activations in the backward pass
only when the estimate below exceeds ``HEADROOM`` of the device's memory; recomputation costs a second forward
of every block (about a third more model FLOPs per step), so a run that fits trains faster without it.

The estimate, in bytes per device (``Footprint``), for a litgpt LLaMA block (RMSNorm, fused qkv, SDPA's flash or
memory-efficient kernel, which keeps no T x T matrix, SwiGLU MLP):

* **states**: fp32 weights (4 bytes), and for each trainable weight its fp32 gradient and AdamW's two moments
  (12 more), sharded over the world size as FSDP shards them;
* **activations** per token and layer, in the compute dtype (2 bytes under bf16, else 4): the tensors autograd
  keeps for the backward: the two norms' inputs and outputs (RMSNorm computes in fp32: 8 bytes each a channel
  whatever the compute dtype), the attention's q, k, v and output and the projection's input
  (3 d + 2 kv_dim), the MLP's input (d), both branches, the gate's output and the down projection's input (4 i);
* **logits**: the head's output in the compute dtype plus the loss's fp32 copy and its fp32 softmax
  (``training.module.lm_loss``): (b + 8) V bytes per token.

It leaves out what does not scale with the run (the CUDA context, the allocator's fragmentation, FSDP's
all-gathered bf16 copy of one block), which ``HEADROOM`` covers. ``tools/gpu_smoke.py`` prints the estimate
beside the measured peak.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from nope_lightning.config.parts import TrainerConfig
from nope_lightning.model.gpt import GPT

#: Share of the device's memory a run may plan to fill without checkpointing.
HEADROOM = 0.8


@dataclass(frozen=True)
class Footprint:
    """Bytes per device a training step holds at its peak without activation checkpointing."""

    states: int
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return self.states + self.activations + self.logits


def footprint(model: GPT, batch_tokens: int, world_size: int = 1, bf16: bool = False) -> Footprint:
    """The estimate (module docstring) for ``model`` trained on ``batch_tokens`` tokens per device per step (one
    micro-batch: batch x sequence length), sharded over ``world_size`` ranks, in bf16 or fp32 compute."""
    cfg = model.config
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    states = (16 * trainable + 4 * frozen) // world_size
    width = 2 if bf16 else 4
    d, kv, hidden = cfg.n_embd, 2 * cfg.n_query_groups * cfg.head_size, cfg.intermediate_size
    per_token_layer = width * (3 * d + kv + d + 4 * hidden) + 2 * (2 * 4 * d)
    activations = batch_tokens * cfg.n_layer * per_token_layer
    logits = batch_tokens * cfg.padded_vocab_size * (width + 8)
    return Footprint(states, activations, logits)


def device_bytes(cfg: TrainerConfig, device: torch.device) -> int:
    """The memory one process may use: the GPU's total memory, or on CPU the host's RAM shared out among the
    ``cfg.devices`` processes of this node."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // cfg.devices


def needs_checkpointing(cfg: TrainerConfig, need: Footprint, device: torch.device) -> bool:
    """``cfg.activation_checkpointing`` resolved: true/false as set; auto: whether ``need`` exceeds ``HEADROOM``
    of ``device_bytes``."""
    if cfg.activation_checkpointing != "auto":
        return cfg.activation_checkpointing == "true"
    return need.total > HEADROOM * device_bytes(cfg, device)
