"""Pretraining throughput, measured side by side in one run (performance claims live here, not in tests).

Prints, for one model/batch/data configuration (default: the ``small`` CPU recipe):

1. tokens/s of the pretrain stage's code path (``CausalLM`` + ``PackedDataModule`` + ``build_trainer``)
   vs a bare PyTorch loop over the same model, optimizer, schedule, clipping and batches (goal >= 0.95);
2. the bare loop at 1 and 2 intra-op threads, and the stage with DDP on 2 processes x 1 thread
   (the choice behind ``trainer.threads=0``);
3. achieved model FLOP/s (6 N + 6 n_layer T d per token, forward + backward; N = non-embedding
   parameters) vs a measured fp32 matmul peak on the same thread count (goal >= 0.7).

4. with ``--compile`` (instead of 1-3): the bare loop eager vs ``torch.compile``d (what ``trainer.compile=true``
   does), interleaved repeats at ``--compile-threads`` threads, tokens/s by process CPU time (what a shared
   machine cannot inflate by preempting us) and wall clock, and the compile time (warm-up steps' wall time
   beyond steady steps). Inductor compiles in this process (``compile_threads=1``).

5. with ``--busy`` (instead of 1-4): the stage as DDP 2 processes x 1 thread vs one process x 2 threads, on a quiet
   machine and beside ``--hogs`` busy-loop processes (competing work that wants the cores), each setting's
   tokens/s and the DDP / one-process ratio side by side, with the load average each phase ran under.

Usage: ``python tools/benchmark_pretrain.py [pretrain overrides ...] [--steps 30] [--warmup 5]
[--repeats 2] [--compile | --busy [--hogs 2]]``. Timing excludes the first ``--warmup`` steps (allocator and kernel warm-up) and all
validation; each setting keeps the best of ``--repeats`` interleaved runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import Callback

from nope_lightning.config import PretrainConfig, load_config
from nope_lightning.data import PackedDataModule, prepare
from nope_lightning.data.datamodule import sample_batch
from nope_lightning.model import GPT
from nope_lightning.training.module import CausalLM, compile_blocks, lm_loss, warmup_cosine
from nope_lightning.training.trainer import build_trainer

REPO = Path(__file__).resolve().parents[1]


class StepTimer(Callback):
    """Wall time of optimizer steps ``warmup .. end``; rank 0 writes it to ``out`` (JSON), so the
    measurement also comes back from spawned DDP processes."""

    def __init__(self, warmup: int, out: str) -> None:
        self.warmup, self.out, self.start = warmup, out, 0.0

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step == self.warmup:
            self.start = time.perf_counter()

    def on_train_end(self, trainer, *args) -> None:
        if trainer.is_global_zero:
            Path(self.out).write_text(json.dumps({"elapsed": time.perf_counter() - self.start}))


def model_flops_per_token(model: GPT, seq_len: int) -> float:
    """Training FLOPs per token: 6 N (matmuls, fwd + bwd) + 6 n_layer T d (attention scores and values)."""
    cfg = model.cfg
    embed = model.transformer.wte.weight.numel() + getattr(model, "wpe", torch.nn.Embedding(0, 1)).weight.numel()
    n = sum(p.numel() for p in model.parameters()) - embed
    return 6 * n + 6 * cfg.n_layer * seq_len * cfg.n_embd


def matmul_peak(threads: int, size: int = 1024, repeats: int = 20) -> float:
    """Measured fp32 matmul FLOP/s at ``threads`` threads (best of ``repeats``)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * size**3 / best


def bare_loop(cfg: PretrainConfig, vocab: int, tokens, steps: int, warmup: int, threads: int,
              compiled: bool = False) -> tuple[float, float, float]:
    """A plain PyTorch training loop (same init, optimizer groups, schedule, clipping, data), through
    compiled blocks when ``compiled`` (``compile_blocks``, what ``trainer.compile=true`` does): (tokens/s wall, tokens/s process CPU time, warm-up wall seconds)."""
    torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model, vocab, cfg.train_len)
    if compiled:
        compile_blocks(model)
    forward = model
    module = CausalLM(model, cfg.optim, steps)  # only to reuse the exact optimizer parameter groups
    o = cfg.optim
    optimizer = torch.optim.AdamW([g for g in module.param_groups() if g["params"]], lr=o.lr,
                                  betas=(o.beta1, o.beta2), eps=o.eps)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, o.warmup_steps, steps, o.min_lr_ratio))
    model.train()
    begin = time.perf_counter()
    for step in range(steps):
        if step == warmup:
            start, cpu = time.perf_counter(), time.process_time()
        batch = sample_batch(tokens, step, cfg.train_len, cfg.batch_size, cfg.seed, 0)
        loss = lm_loss(forward(batch[:, :-1]), batch[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        optimizer.step()
        schedule.step()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    tokens_timed = (steps - warmup) * cfg.batch_size * cfg.train_len
    return tokens_timed / wall, tokens_timed / cpu, start - begin


def stage_loop(cfg: PretrainConfig, prepared, steps: int, warmup: int, threads: int, devices: int = 1) -> float:
    """tokens/s (all processes together) of the stage's Lightning path."""
    seed_everything(cfg.seed, verbose=False)
    trainer_cfg = dataclasses.replace(cfg.trainer, max_steps=steps, threads=threads, devices=devices,
                                      accelerator="cpu", strategy="ddp_spawn" if devices > 1 else "auto",
                                      val_every_n_steps=0, val_batches=1, progress_bar=False)
    model = GPT(cfg.model, prepared.tokenizer.vocab_size, cfg.train_len)
    data = PackedDataModule(prepared, cfg.train_len, cfg.batch_size, cfg.seed, 1)
    with tempfile.TemporaryDirectory() as tmp:
        timer = StepTimer(warmup, f"{tmp}/time.json")
        trainer = build_trainer(trainer_cfg, callbacks=[timer], grad_clip=cfg.optim.grad_clip,
                                enable_checkpointing=False, default_root_dir=tmp)
        trainer.fit(CausalLM(model, cfg.optim, steps), datamodule=data)
        elapsed = json.loads(Path(f"{tmp}/time.json").read_text())["elapsed"]
    return (steps - warmup) * cfg.batch_size * cfg.train_len * devices / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="pretrain config overrides (key=value)")
    parser.add_argument("--config", default=str(REPO / "conf/pretrain/small.yaml"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2, help="runs per setting; the best is kept")
    parser.add_argument("--compile", action="store_true", help="compare eager and compiled loops only")
    parser.add_argument("--compile-threads", type=int, default=1,
                        help="intra-op threads of the compile comparison (1: one DDP process's share of 2 cores)")
    parser.add_argument("--busy", action="store_true", help="DDP vs one process, quiet and beside busy loops")
    parser.add_argument("--hogs", type=int, default=2, help="busy-loop processes of --busy's loaded phase")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cfg = load_config(PretrainConfig, args.config, args.overrides)
    prepared = prepare(cfg.data)
    tokens = prepared.tokens("train")
    vocab = prepared.tokenizer.vocab_size
    if args.compile:
        compile_comparison(cfg, vocab, tokens, args)
        return
    if args.busy:
        busy_comparison(cfg, prepared, args)
        return
    flops = model_flops_per_token(GPT(cfg.model, vocab, cfg.train_len), cfg.train_len)

    # Each setting runs --repeats times, interleaved with the others, and keeps its best: a busy moment on a
    # shared machine then cannot decide a ratio.
    rows: dict[str, float] = {}
    for _ in range(args.repeats):
        for threads in (1, 2):
            for name, measure in ((f"bare loop, {threads} thread(s)",
                                   lambda t=threads: bare_loop(cfg, vocab, tokens, args.steps, args.warmup, t)[0]),
                                  (f"stage, {threads} thread(s)",
                                   lambda t=threads: stage_loop(cfg, prepared, args.steps, args.warmup, t))):
                rows[name] = max(rows.get(name, 0.0), measure())
        ddp = stage_loop(cfg, prepared, args.steps, args.warmup, 1, devices=2)
        rows["stage, DDP 2 processes x 1 thread"] = max(rows.get("stage, DDP 2 processes x 1 thread", 0.0), ddp)
    peaks = {t: matmul_peak(t) for t in (1, 2)}

    print(f"\nmodel: {cfg.model.n_layer} layers x {cfg.model.n_embd}, {cfg.model.pos_encoding}, "
          f"T={cfg.train_len}, batch={cfg.batch_size}, vocab={vocab}; {flops / 1e6:.2f} MFLOP/token; "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    print(f"fp32 matmul peak (1024^3): 1 thread {peaks[1] / 1e9:.1f} GFLOP/s, 2 threads {peaks[2] / 1e9:.1f}")
    print(f"{'setting':38s} {'tokens/s':>9s} {'GFLOP/s':>8s} {'of peak':>8s}")
    for name, tps in rows.items():
        threads = 2 if "2 thread" in name or "DDP" in name else 1
        print(f"{name:38s} {tps:9.0f} {tps * flops / 1e9:8.2f} {tps * flops / peaks[threads]:8.2f}")
    for threads in (1, 2):
        ratio = rows[f"stage, {threads} thread(s)"] / rows[f"bare loop, {threads} thread(s)"]
        print(f"stage / bare loop at {threads} thread(s): {ratio:.3f} (goal >= 0.95)")


def spin() -> None:
    """A competing job: one core's worth of busy loop, until terminated."""
    while True:
        pass


def busy_comparison(cfg: PretrainConfig, prepared, args: argparse.Namespace) -> None:
    """Part 5: DDP 2 x 1 thread vs 1 process x 2 threads, quiet and beside ``args.hogs`` busy loops; best of
    ``--repeats`` interleaved runs per (phase, setting)."""
    settings = {"DDP 2 processes x 1 thread": (1, 2), "1 process x 2 threads": (2, 1)}
    rows: dict[tuple[str, str], float] = {}
    loads: dict[str, list[float]] = {"quiet": [], "busy": []}
    for phase in ("quiet", "busy"):
        hogs = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.hogs if phase == "busy" else 0)]
        for hog in hogs:
            hog.start()
        try:
            for _ in range(args.repeats):
                for name, (threads, devices) in settings.items():
                    tps = stage_loop(cfg, prepared, args.steps, args.warmup, threads, devices=devices)
                    rows[phase, name] = max(rows.get((phase, name), 0.0), tps)
                    loads[phase].append(os.getloadavg()[0])
        finally:
            for hog in hogs:
                hog.terminate()
                hog.join()
    print(f"\nmodel: {cfg.model.n_layer} layers x {cfg.model.n_embd}, T={cfg.train_len}, batch={cfg.batch_size}; "
          f"{args.steps} steps ({args.warmup} warm-up), best of {args.repeats}; torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs; busy: {args.hogs} busy-loop processes beside the run")
    print(f"{'setting':28s} {'quiet tok/s':>11s} {'busy tok/s':>10s} {'busy/quiet':>10s}")
    for name in settings:
        quiet, busy = rows["quiet", name], rows["busy", name]
        print(f"{name:28s} {quiet:11.0f} {busy:10.0f} {busy / quiet:10.2f}")
    for phase in ("quiet", "busy"):
        ratio = rows[phase, "DDP 2 processes x 1 thread"] / rows[phase, "1 process x 2 threads"]
        print(f"{phase}: DDP / one process {ratio:.2f}; 1-minute load average after each run "
              + ", ".join(f"{load:.1f}" for load in loads[phase]))


def compile_comparison(cfg: PretrainConfig, vocab: int, tokens, args: argparse.Namespace) -> None:
    """Part 4: eager vs compiled bare loop, interleaved; medians of ``--repeats`` runs each."""
    import statistics

    from torch._inductor import config as inductor_config

    inductor_config.compile_threads = 1
    load = os.getloadavg()[0]
    runs: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    for _ in range(args.repeats):
        for compiled in (False, True):
            runs[compiled].append(bare_loop(cfg, vocab, tokens, args.steps, args.warmup, args.compile_threads,
                                            compiled))
    wall, cpu = ({c: statistics.median(r[i] for r in runs[c]) for c in runs} for i in (0, 1))
    # Compile time: the first compiled run's warm-up beyond what its steps take at the steady rate (later
    # runs reuse Inductor's caches). Eager warm-up is subtracted the same way.
    step_tokens = cfg.batch_size * cfg.train_len
    compile_s = runs[True][0][2] - args.warmup * step_tokens / wall[True]
    print(f"\nmodel: {cfg.model.n_layer} layers x {cfg.model.n_embd}, T={cfg.train_len}, batch={cfg.batch_size}, "
          f"vocab={vocab}, {args.compile_threads} thread(s); torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}" + (" (shared machine)" if load > 1 else ""))
    for compiled in (False, True):
        print(f"  {'compiled' if compiled else 'eager':8s} tokens/s {wall[compiled]:7.0f} wall, {cpu[compiled]:7.0f} "
              f"CPU time (median of {args.repeats})")
    speedup = cpu[True] / cpu[False]
    print(f"compiled/eager speed-up: {speedup:.3f} CPU time, {wall[True] / wall[False]:.3f} wall; compile time "
          f"{compile_s:.0f} s wall")
    steps = cfg.trainer.max_steps
    run_eager = steps * step_tokens / cpu[False]
    print(f"amortized over this recipe's {steps} steps: {run_eager / (steps * step_tokens / cpu[True] + compile_s):.3f}")


if __name__ == "__main__":
    main()
