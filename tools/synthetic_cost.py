"""GPU cost of paper 002's full grid (experiments/synthetic_paper/synthetic_paper.yaml), by arithmetic: FLOP, H100-hours.

    python tools/synthetic_cost.py [--sample 2000] [--epochs 20]

Per task at the recipe the grid file gives it (conf/synthetic-grid/paper.yaml: the paper recipe, its
``task_overrides`` included, e.g. PCFG's 100K steps; the file's first seed) it builds the data as a run does
(``SyntheticData``: the same generator, vocabulary and loader), the training split cut to ``--sample``
examples (a run has ``n_train``), and counts the positions the model computes:

* training: a batch is right-padded to its longest sequence (``pad_batch``), the model reads
  ``ids[:, :-1]``: a step of B rows of width W costs B*W positions, padding included. W is averaged over
  ``--epochs`` shuffles of the sample (full batches only: a run's one short batch per epoch is left out).
* FLOP per training step = 6*(N+H)*B*W + B*6*n_layer*d*W(W+1). 6 per weight and token (forward 2,
  backward 4; Kaplan et al. 2020): N the non-embedding parameters of the model the suite builds, H = d*V
  its output head (V: the task's vocabulary as litgpt pads it; the input embedding is a lookup). Causal
  attention: W(W+1)/2 (query, key) pairs per layer, each 2d FLOP for QK^T and 2d for AV (d = n_embd, all
  heads), x3 with the backward: 6d*W(W+1) per sequence and layer, i.e. ~6*n_layer*d*W per token.
* evaluation, forward only (2(N+H) per token, 2d*W(W+1) attention per layer): greedy decoding with the KV
  cache (``greedy_decode``) in batches of ``eval.batch_size``: a prefill of the batch's longest
  ``<bos> prompt <sep>``, then one position per new token up to the longest target + ``<eos>`` (the last
  never fed back): exact for a model that stops with the gold answer, capped by that budget otherwise.
  Every ``val_every_n_steps`` steps the validation set (ID, file order); at the end valid + test sorted by
  length (n_test examples at all test lengths).

Units: tokens are positions computed; FLOP are operations (not FLOP/s). Left out: the grid's attention
analysis (10 examples per length, forward only) and element-wise work (norms, softmax, optimizer).
No GPU here: these are arithmetic, not measurements; H100-hours assume an MFU (model FLOP utilization).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nope_lightning.config.core import load_config
from nope_lightning.config.parts import ModelConfig
from nope_lightning.config.synthetic import PAPER_NAMES, SyntheticConfig, SyntheticGridConfig, sequence_tokens
from nope_lightning.data.synthetic_batches import SyntheticData
from nope_lightning.model.gpt import litgpt_config, non_embedding_parameters
from nope_lightning.synthetic import Example, Vocabulary

GRID = Path(__file__).resolve().parents[1] / "conf/synthetic-grid/paper.yaml"
H100_BF16 = 989e12  # FLOP/s: H100 SXM dense bf16 peak (NVIDIA's datasheet; 1,979 T is with sparsity)
# Assumed MFUs: an 85M model on steps of a few thousand tokens is bound by kernel launches, not by the
# tensor cores (a step takes milliseconds at these rates: printed), so its MFU is low; 10 % is pessimistic.
MFUS = (0.1, 0.2, 0.4)


def head_parameters(model: ModelConfig, task: str) -> int:
    """Weights of the output head, d x V: V the task's vocabulary as litgpt pads it (multiple of 64)."""
    return model.n_embd * litgpt_config(model, len(Vocabulary.for_task(task))).padded_vocab_size


def causal_attention(width: np.ndarray | int, n_layer: int, d: int, forwards: int) -> np.ndarray | float:
    """FLOP of causal attention over sequences of ``width`` positions (any shape): ``forwards`` x 4d x
    W(W+1)/2 per layer (3 for training: the backward costs two forwards; 1 for decoding)."""
    return forwards * n_layer * 4 * d * width * (width + 1) / 2


@dataclass(frozen=True)
class RunCost:
    """One run's counts: sequence lengths (positions of ``<bos> prompt <sep> target <eos>``); per training
    step ``tokens_per_step`` (positions) and ``attention_per_step`` (FLOP); per validation pass and for
    the final test, the positions decoded and their attention FLOP."""

    mean_len: float
    max_len: int
    tokens_per_step: float
    attention_per_step: float
    val_tokens: int
    val_attention: float
    test_tokens: int
    test_attention: float

    def train_flops(self, n: int, steps: int) -> float:
        return steps * (6 * n * self.tokens_per_step + self.attention_per_step)

    def eval_flops(self, n: int, steps: int, val_every: int) -> float:
        validations = math.ceil(steps / val_every)  # every val_every steps, the last at the end
        return (validations * (2 * n * self.val_tokens + self.val_attention)
                + 2 * n * self.test_tokens + self.test_attention)

    def flops(self, n: int, steps: int, val_every: int) -> float:
        return self.train_flops(n, steps) + self.eval_flops(n, steps, val_every)


def decode_cost(examples: list[Example], batch_size: int, extra: int, n_layer: int,
                d: int) -> tuple[int, float]:
    """(positions, attention FLOP) of greedy-decoding ``examples`` in batches of ``batch_size``."""
    tokens, attention = 0, 0.0
    for start in range(0, len(examples), batch_size):
        batch = examples[start:start + batch_size]
        prompt = max(len(e.prompt) for e in batch) + 2  # <bos> prompt <sep>, padded to the longest
        budget = max(len(e.target) for e in batch) + 1 + extra  # SyntheticLM.generate's max_new_tokens
        width = prompt + budget - 1
        tokens += len(batch) * width
        attention += len(batch) * causal_attention(width, n_layer, d, forwards=1)
    return tokens, attention


def run_cost(cell: SyntheticConfig, sample: int, epochs: int) -> RunCost:
    """Counts of one run of ``cell``, its training split cut to ``sample`` examples (>= one batch)."""
    data = SyntheticData(dataclasses.replace(cell, n_train=sample))
    m, batch, eval_cfg = cell.model, cell.batch_size, cell.eval
    loader = data.train_dataloader()  # one loader, as Lightning keeps it: each epoch a fresh shuffle
    widths = np.array([ids.shape[1] - 1 for _ in range(epochs) for ids, _ in loader if len(ids) == batch])
    lengths = np.array([sequence_tokens(e) for e in data.train])
    valid = data.valid[: cell.trainer.val_batches * eval_cfg.batch_size]  # limit_val_batches
    val = decode_cost(valid, eval_cfg.batch_size, eval_cfg.extra_new_tokens, m.n_layer, m.n_embd)
    test = decode_cost(data.evaluation, eval_cfg.batch_size, eval_cfg.extra_new_tokens, m.n_layer, m.n_embd)
    attention = causal_attention(widths, m.n_layer, m.n_embd, forwards=3)
    return RunCost(float(lengths.mean()), int(lengths.max()), batch * float(widths.mean()),
                   batch * float(attention.mean()), *val, *test)


def steps_text(steps: dict[str, int]) -> str:
    """Optimizer steps per task in words: ``pcfg 100,000, the other 16 tasks 40,000`` (or ``every task
    40,000``)."""
    common = Counter(steps.values()).most_common(1)[0][0]
    others = [f"{task} {count:,}" for task, count in steps.items() if count != common]
    rest = f"the other {len(steps) - len(others)} tasks" if others else "every task"
    return ", ".join([*others, f"{rest} {common:,}"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=2000, help="training examples generated per task")
    parser.add_argument("--epochs", type=int, default=20, help="shuffles of the sample for batch widths")
    args = parser.parse_args()
    grid = load_config(SyntheticGridConfig, GRID)
    base, seeds = grid.base, len(grid.seeds)
    # Per task its first seed's NoPE cell, as the grid resolves it (task_overrides included).
    cells = {cell.task: cell for cell in grid.cells()
             if (cell.seed, cell.pos_encoding) == (grid.seeds[0], "nope")}
    # N per PE: T5's relative-bias table (buckets x heads, a lookup) is its only extra weight. train_len
    # sets only RoPE scaling's reference length, no weight.
    n_params = {pe: non_embedding_parameters(dataclasses.replace(base.model, pos_encoding=pe),
                                             train_len=base.model.max_positions) for pe in grid.pos_encodings}
    n = n_params["nope"]
    heads = {task: head_parameters(base.model, task) for task in grid.tasks}
    print(f"No GPU here: arithmetic, not measurements. Sample: {args.sample} training examples per task "
          f"(seed {grid.seeds[0]}), {args.epochs} epochs over it; batch {base.batch_size}; "
          f"eval batch {base.eval.batch_size}.")
    print("Non-embedding parameters N: " + ", ".join(f"{PAPER_NAMES[pe]} {v:,}" for pe, v in n_params.items())
          + f"; output head H = d x padded vocabulary: {min(heads.values()):,} to {max(heads.values()):,} "
          f"({min(heads.values()) / n:.2%} to {max(heads.values()) / n:.2%} of N).")
    print("\n| task | steps | seq len mean / max | batch width | tokens/step | tokens/run "
          f"| train FLOP/run (attention) | eval FLOP/run | FLOP, {len(n_params)} PEs x {seeds} seeds |")
    print("|---|---|---|---|---|---|---|---|---|")
    total = 0.0
    step_flops = []  # one training step's FLOP, per task (NoPE)
    for task, cell in cells.items():
        cost = run_cost(cell, args.sample, args.epochs)
        steps, val_every = cell.trainer.max_steps, cell.trainer.val_every_n_steps
        # The task's PEs (each its own N) x seeds.
        flops = seeds * sum(cost.flops(v + heads[task], steps, val_every) for v in n_params.values())
        total += flops
        train = cost.train_flops(n + heads[task], steps)
        step_flops.append(train / steps)
        print(f"| {task} | {steps:,} | {cost.mean_len:.1f} / {cost.max_len} "
              f"| {cost.tokens_per_step / base.batch_size:.1f} | {cost.tokens_per_step:,.0f} "
              f"| {steps * cost.tokens_per_step:.3g} "
              f"| {train:.3g} ({steps * cost.attention_per_step / train:.1%}) "
              f"| {cost.eval_flops(n + heads[task], steps, val_every):.3g} | {flops:.3g} |")
    runs = len(grid.tasks) * len(n_params) * seeds
    task_steps = steps_text({task: cell.trainer.max_steps for task, cell in cells.items()})
    print(f"\nTotal, {len(grid.tasks)} tasks x {len(n_params)} PEs x {seeds} seeds = {runs} runs, as "
          f"experiments/synthetic_paper/synthetic_paper.yaml runs them ({task_steps} steps): {total:.3g} FLOP.")
    for mfu in MFUS:
        hours = total / (H100_BF16 * mfu) / 3600
        step_ms = 1e3 * float(np.mean(step_flops)) / (H100_BF16 * mfu)
        print(f"H100-hours at {mfu:.0%} MFU ({H100_BF16 * mfu / 1e12:.0f} TFLOP/s sustained): {hours:.1f}; "
              f"{60 * hours / runs:.1f} min per run and {step_ms:.1f} ms per training step "
              "(mean over tasks).")


if __name__ == "__main__":
    main()
