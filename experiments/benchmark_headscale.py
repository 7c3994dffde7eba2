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
(goals: headscale/finetune <= 0.6, headscale-log/headscale ~ 1).

Usage: ``python experiments/benchmark_headscale.py [pretrain overrides ...] [--length 512] [--batch 8]
[--steps 10] [--warmup 2] [--threads 1]`` (default model: the ``small`` recipe, 4 layers x 128 wide,
randomly initialised — timing does not depend on the weights).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from nope_lightning.config import FinetuneConfig, HeadScaleConfig, OptimConfig, PretrainConfig, load_config
from nope_lightning.model import GPT, count_parameters
from nope_lightning.model.temperature import set_log_scales
from nope_lightning.stages.headscale import CONSTRAINED_FLOOR, HeadScaleLM
from nope_lightning.stages.headscale_log import HeadScaleLogLM
from nope_lightning.stages.lm import CausalLM, lm_loss

REPO = Path(__file__).resolve().parents[1]


def stage_optim(stage_config: type) -> OptimConfig:
    """The default ``optim`` of a stage config class (HeadScale: lr 0.1; finetune: lr 1e-4)."""
    return next(f.default_factory() for f in dataclasses.fields(stage_config) if f.name == "optim")


def step_function(module: CausalLM, steps: int):
    """One training step of ``module`` exactly as the Trainer runs it, as a function of a (B, T+1) batch."""
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    project = module.project if isinstance(module, HeadScaleLM) else (lambda: None)

    def step(batch: torch.Tensor) -> None:
        loss = lm_loss(module.model(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, module.optim.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        project()

    return step


def timed(step, batch: torch.Tensor, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    step(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="pretrain config overrides (model.*) for the model")
    parser.add_argument("--config", default=str(REPO / "conf/pretrain/small.yaml"))
    parser.add_argument("--length", type=int, default=512, help="target length T (tokens per sequence)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (1 is best on 2 cores)")
    args = parser.parse_args()

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

    log_model = copy()
    set_log_scales(log_model, torch.full((cfg.model.n_layer, cfg.model.n_head), 0.5))
    modules = {"headscale": HeadScaleLM(copy(), stage_optim(HeadScaleConfig), total, CONSTRAINED_FLOOR),
               "headscale-log": HeadScaleLogLM(log_model, stage_optim(HeadScaleConfig), total),
               "finetune": CausalLM(copy(), stage_optim(FinetuneConfig), total)}
    for module in modules.values():
        module.to(device)
    steps = {name: step_function(module, total) for name, module in modules.items()}
    times: dict[str, list[float]] = {name: [] for name in steps}
    generator = torch.Generator().manual_seed(0)
    for i in range(total):
        batch = torch.randint(0, cfg.data.vocab_size, (args.batch, args.length + 1), generator=generator).to(device)
        for name, step in steps.items():
            seconds = timed(step, batch, device)
            if i >= args.warmup:
                times[name].append(seconds)

    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"model: {cfg.model.n_layer} layers x {cfg.model.n_embd} wide, {count_parameters(base):,} parameters; "
          f"T={args.length}, batch={args.batch}, {args.threads} thread(s), {device}; median of {args.steps} steps "
          f"after {args.warmup} warm-up")
    for name, module in modules.items():
        print(f"  {name:13s} trainable {count_parameters(module.model, True):>9,}  step {medians[name] * 1e3:8.1f} ms  "
              f"(min {min(times[name]) * 1e3:.1f}, max {max(times[name]) * 1e3:.1f})")
    ratio = medians["headscale"] / medians["finetune"]
    print(f"ratio headscale/finetune = {ratio:.3f} (goal <= 0.6: {'met' if ratio <= 0.6 else 'NOT met'})")
    print(f"ratio headscale-log/headscale = {medians['headscale-log'] / medians['headscale']:.3f} (goal ~ 1)")


if __name__ == "__main__":
    main()
