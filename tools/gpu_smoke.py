"""GPU smoke run of the paper's pretraining setup: FSDP2 + bf16 + flash attention on the 1.1B model (or a cut
of it), printing throughput, MFU and the cost of HeadScale's per-head temperature on the attention kernel.

It trains ``conf/pretrain/tinyllama-1.1b.yaml`` (``--size`` picks a smaller cut by n_layer/n_embd) through the
project's own path, ``GPT`` + ``CausalLM`` + ``build_trainer`` with ``trainer.strategy=fsdp2`` and
``bf16-mixed``, on random token ids (throughput does not depend on the text, and no corpus is needed), for
``--steps`` optimizer steps, and prints one JSON object (rank 0):

* ``tokens_per_s``: all ranks together, over steps ``--warmup``..``--steps`` (CUDA synchronised at both ends);
* ``flops_per_token`` and ``mfu`` = tokens_per_s x flops_per_token / (world_size x peak). Model FLOPs per
  token (``benchmark_pretrain.model_flops_per_token``): **6 N + 6 n_layer T d** for forward + backward, N the
  non-embedding parameters (lm_head included), T the sequence length, d = n_embd; the attention term counts
  q k^T and the weighted sum of v (4 T d per layer forward, full square) halved for the causal mask. Recompute
  under activation checkpointing is not counted (model FLOPs, not hardware FLOPs);
* ``peak_tflops_per_device``: the GPU's dense bf16 tensor-core peak from ``PEAK_BF16_TFLOPS`` (by device name),
  or ``--peak-tflops`` (required for an unknown device, e.g. the CPU);
* ``attention_lambda``: forward + backward time of one attention layer (projections and causal attention) on
  the run's shape with frozen weights, plain vs the model's ``Attention`` with a trainable per-head λ table
  (HeadScale's setting: λ folded into W_q, λ receiving a gradient), timed side by side in this process, eager and,
  when the run compiles, compiled, with their throughput ratio (goal >= 0.97; printed, not asserted);
* ``activation_checkpointing`` (the setting and what ``auto`` decided), ``compile``, ``fused_adamw``,
  ``accumulate`` and ``peak_memory_gib`` beside ``estimated_gib_without_checkpointing`` (``training.memory``).

Attention runs through PyTorch SDPA: on CUDA restricted to the flash backend (``sdpa_kernel``), so the run fails
rather than silently timing another kernel; the flash-attn package (``model.attention_backend=flash``) is not
what is measured. ``--device cpu --size tiny`` runs the same code path in seconds (tests/test_gpu_smoke.py).

Usage: ``python tools/gpu_smoke.py [--size 1.1b|300m|120m|tiny] [--steps 300] [--devices 1]
[--accumulate N] [--peak-tflops X] [--out FILE] [pretrain overrides key=value ...]``. It trains with the recipe's
settings (compiled blocks, fused AdamW, checkpointing auto); the "before" row below is
``trainer.activation_checkpointing=true trainer.compile=false optim.fused=false``.

Measured 2026-11-27 on one NVIDIA H200 (torch 2.11.0+cu130, Lightning 2.6.6; 989 TFLOP/s peak), FSDP2 on one
process, bf16 over fp32 master weights, batch 8 x 2,048 unless named; each row one run of 20-30 optimizer steps
after 10 (4 with accumulation) left out, the JSONs in ``docs/gpu_smoke/`` (file named in brackets):

=============================================================  =========  =====  ========
1.1B (1,100 M parameters)                                      tokens/s   MFU    peak GiB
=============================================================  =========  =====  ========
checkpointing on, eager, foreach AdamW (before) [call1-base]    39,481    0.270    23.3
checkpointing off [call1-noac]                                  48,502    0.332    56.9
  + compiled blocks [call1-noac_compile]                        60,918    0.416    44.8
  + fused AdamW, checkpointing auto (off) [call1-best]          64,187    0.439    44.8
    the same, 4 micro-batches a step [call2-acc4]               68,922    0.471    45.8
    the same, 16 micro-batches a step: the recipe [call3-acc16] 80,150    0.548    45.8
    batch 16, one micro-batch a step [call2-b16]                66,762    0.456    72.8
    batch 16 x 8 micro-batches (the recipe's batch) [call3-…]   90,286    0.617    74.7
300M cut, compiled, fused, auto (off) [call1-best_300m]        144,827    0.287    21.6
120M cut, the same [call1-best_120m]                           222,772    0.161    12.2
=============================================================  =========  =====  ========

Each choice was kept because its row beat the one above it on the same machine. The best row again on another
H200 machine [call2-best] gave 62,587 tokens/s (0.428): rows differ by ~2-3 % between machines. The cuts' model FLOPs per token are small
against their per-step costs (optimizer, norms, the 32,000-word head), so their MFU is lower at this batch.
Per-head λ over plain attention (``attention_lambda``): 0.87-0.88 before λ's own gradient (``_LambdaGradient``,
call 1), then 0.93-0.94 eager and 0.96-0.975 compiled (calls 2-3: 0.975, 0.966, 0.973, 0.960, 0.973). The
activation estimate is 53.2 GiB for batch 8 (measured 56.9 eager, 44.8 compiled) and 90.1 for batch 16
(74.7 compiled): ``auto`` turns checkpointing off on an H200 at both and on at batch 16 on an 80 GB H100.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import DataLoader, IterableDataset

from nope_lightning.config import PretrainConfig, load_config
from nope_lightning.model import GPT, count_parameters
from nope_lightning.model.attention import Attention
from nope_lightning.model.gpt import litgpt_config
from nope_lightning.training.memory import footprint
from nope_lightning.training.module import CausalLM
from nope_lightning.training.trainer import build_trainer, check_strategy

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark script, run from anywhere
from benchmark_pretrain import model_flops_per_token  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "conf/pretrain/tinyllama-1.1b.yaml"

#: Cuts of the 1.1B config (22 layers x 2048, 32 heads, 4 query groups, SwiGLU 5632), as overrides; head size
#: stays 64. Parameters with the 32,000-token vocabulary: 1.1B, ~313M, ~125M; ``tiny`` is the CPU test size.
SIZES = {
    "1.1b": [],
    "300m": ["model.n_layer=22", "model.n_embd=1024", "model.n_head=16", "model.intermediate_size=2816"],
    "120m": ["model.n_layer=12", "model.n_embd=768", "model.n_head=12", "model.intermediate_size=2048"],
    "tiny": ["model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.n_query_groups=2",
             "model.intermediate_size=176", "model.max_positions=128", "data.vocab_size=512", "train_len=64",
             "batch_size=2"],
}

#: Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s by device-name substring, first match wins (NVIDIA
#: datasheets: H100 SXM and H200 989, H100 PCIe 756, H100 NVL 835, A100 312).
PEAK_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0),
                    ("A100", 312.0))

LAMBDA_GOAL = 0.97


def peak_tflops(device_name: str, given: float | None) -> float:
    """The per-device bf16 peak (TFLOP/s): ``given``, else the table's entry for ``device_name``."""
    if given:
        return given
    for key, value in PEAK_BF16_TFLOPS:
        if key in device_name:
            return value
    raise ValueError(f"no bf16 peak known for {device_name!r}: pass --peak-tflops (its dense bf16 TFLOP/s)")


def smoke_config(size: str, overrides: list[str]) -> PretrainConfig:
    """The 1.1B pretrain config cut to ``size``, with attention through SDPA (timed with its flash backend)."""
    return load_config(PretrainConfig, CONFIG, [*SIZES[size], "model.attention_backend=sdpa", *overrides])


class RandomTokens(IterableDataset):
    """Endless int64 batches (batch_size, seq_len + 1) of uniform random ids in [0, vocab), seeded per rank."""

    def __init__(self, vocab: int, batch_size: int, seq_len: int, seed: int) -> None:
        self.shape, self.vocab, self.seed = (batch_size, seq_len + 1), vocab, seed

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + rank_zero_only.rank)
        while True:
            yield torch.randint(self.vocab, self.shape, generator=generator)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer(Callback):
    """Wall time of optimizer steps ``warmup``..max_steps, the device synchronised at both ends (CUDA runs
    asynchronously), and the last step's loss."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.elapsed, self.loss = warmup, 0.0, 0.0, math.nan

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step == self.warmup:
            synchronize(trainer.strategy.root_device)
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, *args) -> None:
        if trainer.global_step == trainer.max_steps:
            synchronize(trainer.strategy.root_device)
            self.elapsed = time.perf_counter() - self.start
            # Lightning hands back the loss it backpropagated: divided by the accumulated micro-batches.
            self.loss = float(outputs["loss"]) * trainer.accumulate_grad_batches


def sdpa_backend(device: torch.device):
    """SDPA restricted to the flash kernel on CUDA (an error, not a silent fallback); any backend on CPU."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


def attention_lambda_ratio(cfg: PretrainConfig, vocab: int, device: torch.device, iters: int,
                           rounds: int = 3, compiled: bool = False) -> dict[str, float]:
    """Forward + backward ms of one attention layer (qkv projection, causal attention, output projection) on bf16
    x (batch, train_len, n_embd) with frozen weights, in HeadScale's setting: ``Attention`` with a trainable
    per-head λ in [1, 2] (folded into W_q, ``Attention.project``) vs plain attention (the same weights, no
    temperature: projection, SDPA, projection); the best of ``rounds`` interleaved rounds of ``iters`` calls
    each, and ``throughput_ratio`` = plain / λ time. ``compiled``: both through ``torch.compile`` (what
    ``trainer.compile`` does to a block)."""
    model_cfg = litgpt_config(cfg.model, vocab)
    attn = Attention(model_cfg, 0).to(device, torch.bfloat16).requires_grad_(False)
    with torch.no_grad():
        attn.temperature.per_head.uniform_(1.0, 2.0)
    attn.temperature.per_head.requires_grad_(True)
    x = torch.randn(cfg.batch_size, cfg.train_len, model_cfg.n_embd, device=device, dtype=torch.bfloat16,
                    requires_grad=True)
    rope = x.new_empty(1, cfg.train_len, 0)  # the 1.1B recipe is NoPE: nothing rotates
    head, groups = model_cfg.head_size, model_cfg.n_head // model_cfg.n_query_groups

    def plain() -> torch.Tensor:
        q, k, v = (t.unflatten(-1, (-1, head)).transpose(1, 2) for t in attn.qkv(x).split(
            (model_cfg.n_head * head, model_cfg.n_query_groups * head, model_cfg.n_query_groups * head), dim=-1))
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=head ** -0.5)
        return attn.proj(y.transpose(1, 2).flatten(2))

    calls = {"plain": plain, "lambda": lambda: attn(x, rope, rope)}
    if compiled:
        calls = {name: torch.compile(call) for name, call in calls.items()}
    grads = {name: torch.randn_like(call()) for name, call in calls.items()}  # also the warm-up call

    def seconds(name: str) -> float:
        synchronize(device)
        start = time.perf_counter()
        for _ in range(iters):
            calls[name]().backward(grads[name])
        synchronize(device)
        return (time.perf_counter() - start) / iters

    best = {name: math.inf for name in calls}
    with sdpa_backend(device):
        for _ in range(rounds):
            for name in calls:
                best[name] = min(best[name], seconds(name))
    return {"plain_ms": best["plain"] * 1e3, "lambda_ms": best["lambda"] * 1e3,
            "throughput_ratio": best["plain"] / best["lambda"], "goal": LAMBDA_GOAL}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Prints one JSON object (rank 0): tokens_per_s, mfu, flops_per_token "
                                            "(6 N + 6 n_layer T d), peak_tflops_per_device, attention_lambda "
                                            "(plain vs per-head λ attention, eager and under --compile: throughput_ratio, goal 0.97), ...; "
                                            "the module docstring describes each field.")
    parser.add_argument("overrides", nargs="*", help="pretrain config overrides (key=value), applied after --size")
    parser.add_argument("--size", choices=list(SIZES), default="1.1b",
                        help="1.1b: conf/pretrain/tinyllama-1.1b.yaml as is; 300m/120m: narrower, shallower cuts; "
                             "tiny: the CPU test size")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--devices", type=int, default=1, help="processes (GPUs) on this node")
    parser.add_argument("--strategy", choices=("fsdp2", "fsdp", "ddp", "auto"), default="fsdp2")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (batch_size per device each)")
    parser.add_argument("--accumulate", type=int, default=1,
                        help="micro-batches per optimizer step (the 1.1B recipe: 16)")
    parser.add_argument("--warmup", type=int, default=20, help="first steps left out of the timing")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="per-device dense bf16 peak in TFLOP/s (default: the table by device name)")
    parser.add_argument("--attention-iters", type=int, default=20, help="calls per round of the λ timing")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON object to this file")
    args = parser.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        parser.error(f"--warmup={args.warmup} must be in [0, --steps={args.steps})")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no CUDA GPU is visible; use --device cpu --size tiny for the CPU path")
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    try:  # before any compute: an unknown device, a bad override or a compile this build cannot do, in one line
        peak = peak_tflops(device_name, args.peak_tflops)
        cfg = smoke_config(args.size, args.overrides)
        cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(
            cfg.trainer, accelerator="gpu" if args.device == "cuda" else "cpu", devices=args.devices,
            strategy=args.strategy, precision="bf16-mixed", max_steps=args.steps, val_every_n_steps=0,
            val_batches=1, accumulate_grad_batches=args.accumulate, progress_bar=False))
        check_strategy(cfg.trainer)
    except ValueError as err:
        raise SystemExit(f"gpu_smoke: {err}") from None
    vocab = cfg.data.vocab_size
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model, vocab, cfg.train_len)
    flops = model_flops_per_token(model, cfg.train_len)  # before sharding: the plain model's parameters
    parameters = count_parameters(model)
    module = CausalLM(model, cfg.optim, args.steps, cfg.trainer.compile)
    loader = DataLoader(RandomTokens(vocab, cfg.batch_size, cfg.train_len, cfg.seed), batch_size=None)
    timer = StepTimer(args.warmup)
    tokens = cfg.batch_size * cfg.train_len
    need = footprint(model, tokens, args.devices, bf16=True)
    trainer = build_trainer(cfg.trainer, callbacks=[timer], grad_clip=cfg.optim.grad_clip, enable_checkpointing=False,
                            batch_tokens=tokens)
    device = trainer.strategy.root_device
    with sdpa_backend(device):
        trainer.fit(module, train_dataloaders=loader, val_dataloaders=loader)
    modes = ("eager", "compiled") if cfg.trainer.compile else ("eager",)  # compiled: what the run's blocks do
    attention = {mode: attention_lambda_ratio(cfg, vocab, device, args.attention_iters, compiled=mode == "compiled")
                 for mode in modes}

    tokens_per_s = ((args.steps - args.warmup) * args.accumulate * cfg.batch_size * cfg.train_len * trainer.world_size
                    / timer.elapsed)
    result = {
        "device": device.type, "device_name": device_name, "world_size": trainer.world_size, "size": args.size,
        "n_layer": cfg.model.n_layer, "n_embd": cfg.model.n_embd, "parameters": parameters,
        "seq_len": cfg.train_len, "batch_size_per_device": cfg.batch_size, "steps": args.steps,
        "timed_steps": args.steps - args.warmup, "accumulate": args.accumulate, "strategy": args.strategy, "precision": cfg.trainer.precision,
        "activation_checkpointing": {"setting": cfg.trainer.activation_checkpointing,
                                     "on": getattr(trainer.strategy, "activation_checkpointing", None)},
        "compile": cfg.trainer.compile, "fused_adamw": cfg.optim.fused, "tokens_per_s": tokens_per_s,
        "flops_per_token": flops, "flops_formula": "6 N + 6 n_layer T d (N non-embedding parameters incl. lm_head; "
                                                   "causal attention)",
        "peak_tflops_per_device": peak, "mfu": tokens_per_s * flops / (trainer.world_size * peak * 1e12),
        "final_loss": timer.loss,
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "estimated_gib_without_checkpointing": {k: v / 2**30 for k, v in dataclasses.asdict(need).items()}
        | {"total": need.total / 2**30},
        "attention_lambda": attention,
    }
    if trainer.is_global_zero:
        print(json.dumps(result, indent=1))
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
