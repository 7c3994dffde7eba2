"""One HeadScale optimisation step vs one full fine-tuning step (and vs one HeadScale-log step), same model,
length and batch, side by side.

HeadScale freezes every weight (``HeadScaleLM``), so its backward propagates activation gradients only and
its optimizer updates n_layer x n_head scalars; full fine-tuning (``CausalLM``, the ``finetune`` stage's
module) also computes every weight gradient and runs AdamW over all weights. Each step is what the
Trainer does per batch: forward, loss, backward, gradient clipping, optimizer and scheduler step, zero_grad
(and HeadScale's projection). HeadScale-log (``headscale parameterization=log``) trains as many scalars, the
slopes a of a per-query temperature max(1, 1 + a ln((i+1)/L)) (started at a = 0.5, so every query beyond L
is scaled); its extra cost is that (B, H, T, 1) multiplier per layer. The steps alternate on the same batches,
so drifting machine load affects all alike; the medians over ``--steps`` steps after ``--warmup`` are compared
(goals: headscale/finetune <= 0.7, headscale-log/headscale ~ 1). Each step is timed twice: wall clock and the
process's CPU time. With one thread, CPU time is what a shared machine cannot inflate by preempting us (it
still pays for cache contention), so the ratios are printed from both; the load average is printed too.

``--compile`` adds ``torch.compile``d HeadScale and fine-tuning steps (the blocks compiled as ``CausalLM``'s
``trainer.compile=true`` does), interleaved with the eager ones, and prints compiled/eager speed-ups and the
compile time: the first step's wall time minus a steady step's. Inductor compiles in this process
(``compile_threads=1``), so its CPU time counts the whole compile.

Usage: ``python tools/benchmark_headscale.py [pretrain overrides ...] [--length 512] [--batch 8]
[--steps 10] [--warmup 2] [--threads 1] [--compile]`` (default model: the ``small`` recipe, 4 layers x 128 wide,
randomly initialised — timing does not depend on the weights).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from pathlib import Path

import torch

from nope_lightning.config import FinetuneConfig, HeadScaleConfig, OptimConfig, PretrainConfig, load_config
from nope_lightning.model import GPT, count_parameters
from nope_lightning.model.temperature import set_log_slopes
from nope_lightning.stages.headscale import CONSTRAINED_FLOOR, LAMBDA, LOG, HeadScaleLM
from nope_lightning.training.module import CausalLM, compile_blocks, lm_loss

REPO = Path(__file__).resolve().parents[1]


def stage_optim(stage_config: type) -> OptimConfig:
    """The default ``optim`` of a stage config class (HeadScale: lr 0.1; finetune: lr 1e-4)."""
    return next(f.default_factory() for f in dataclasses.fields(stage_config) if f.name == "optim")


def step_function(module: CausalLM, compiled: bool = False):
    """One training step of ``module`` exactly as the Trainer runs it, as a function of a (B, T+1) batch;
    ``compiled``: with compiled blocks, as ``CausalLM.configure_model`` compiles them (``compile_blocks``)."""
    if compiled:
        compile_blocks(module.model)
    forward = module.model
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    project = module.project if isinstance(module, HeadScaleLM) else (lambda: None)

    def step(batch: torch.Tensor) -> None:
        loss = lm_loss(forward(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, module.optim.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        project()

    return step


def timed(step, batch: torch.Tensor, device: torch.device) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one step."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start, cpu = time.perf_counter(), time.process_time()
    step(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="pretrain config overrides (model.*) for the model")
    parser.add_argument("--config", default=str(REPO / "conf/pretrain/small.yaml"))
    parser.add_argument("--length", type=int, default=512, help="target length T (tokens per sequence)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (1 is best on 2 cores)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd steps")
    parser.add_argument("--only", nargs="*", default=None,
                        help="time only these steps (headscale, headscale-log, finetune)")
    args = parser.parse_args()
    if args.compile:
        from torch._inductor import config as inductor_config

        inductor_config.compile_threads = 1

    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = load_config(PretrainConfig, args.config, args.overrides)
    torch.manual_seed(0)
    base = GPT(cfg.model, cfg.data.vocab_size, cfg.train_len)
    total = args.warmup + args.steps

    def copy() -> GPT:
        # One copy of the same weights per module: freezing is a property of the parameters themselves.
        model = GPT(cfg.model, cfg.data.vocab_size, cfg.train_len)
        model.load_state_dict(base.state_dict())
        return model

    def log_copy() -> GPT:
        model = copy()
        set_log_slopes(model, torch.full((cfg.model.n_layer, cfg.model.n_head), 0.5))
        return model

    optim = stage_optim(HeadScaleConfig)
    makers = {"headscale": lambda: HeadScaleLM(copy(), LAMBDA, optim, total, CONSTRAINED_FLOOR),
              "headscale-log": lambda: HeadScaleLM(log_copy(), LOG, optim, total, LOG.floor(True)),
              "finetune": lambda: CausalLM(copy(), stage_optim(FinetuneConfig), total)}
    names = args.only or list(makers)
    variants = [(name, False) for name in names]
    if args.compile:
        variants += [(name, True) for name in names if name != "headscale-log"]
    modules, steps = {}, {}
    for name, compiled in variants:
        label = name + ("+compile" if compiled else "")
        modules[label] = makers[name]().to(device)
        steps[label] = step_function(modules[label], compiled)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    first: dict[str, tuple[float, float]] = {}
    generator = torch.Generator().manual_seed(0)
    load = os.getloadavg()[0]
    for i in range(total):
        batch = torch.randint(0, cfg.data.vocab_size, (args.batch, args.length + 1), generator=generator).to(device)
        for name, step in steps.items():
            seconds = timed(step, batch, device)
            if i == 0:
                first[name] = seconds
            if i >= args.warmup:
                times[name].append(seconds)

    # medians[clock][name]: clock 0 = wall, 1 = CPU time
    medians = [{name: statistics.median(t[clock] for t in ts) for name, ts in times.items()} for clock in (0, 1)]
    print(f"model: {cfg.model.n_layer} layers x {cfg.model.n_embd} wide, {count_parameters(base):,} parameters; "
          f"T={args.length}, batch={args.batch}, {args.threads} thread(s), {device}; median of {args.steps} steps "
          f"after {args.warmup} warm-up; torch {torch.__version__}, {os.cpu_count()} CPUs, load average "
          f"{load:.1f} -> {os.getloadavg()[0]:.1f}" + (" (shared machine)" if load > 1 else ""))
    for name, module in modules.items():
        wall = [t[0] for t in times[name]]
        print(f"  {name:17s} trainable {count_parameters(module.model, True):>9,}  step {medians[0][name] * 1e3:8.1f} ms "
              f"(min {min(wall) * 1e3:.1f}, max {max(wall) * 1e3:.1f}), CPU {medians[1][name] * 1e3:8.1f} ms")

    def ratio(a: str, b: str, goal: str = "") -> None:
        if a in times and b in times:
            wall, cpu = (medians[clock][a] / medians[clock][b] for clock in (0, 1))
            print(f"ratio {a}/{b} = {cpu:.3f} CPU time, {wall:.3f} wall{goal}")

    ratio("headscale", "finetune", " (goal <= 0.7)")
    ratio("headscale-log", "headscale", " (goal ~ 1)")
    for name in ("headscale", "finetune"):
        compiled = f"{name}+compile"
        if compiled in times:
            ratio(name, compiled, " (compiled speed-up)")
            extra = [first[compiled][clock] - medians[clock][compiled] for clock in (0, 1)]
            print(f"  {compiled} compile time: {extra[0]:.0f} s wall, {extra[1]:.0f} s CPU")
    ratio("headscale+compile", "finetune+compile")


if __name__ == "__main__":
    main()
