"""What a step will cost, in seconds of the development machine, from its resolved config alone (the dry run
shows it per step; the pipeline's study ETA starts from it and then follows the measured pace).

A step's work is counted in model FLOP (Kaplan et al. 2020; ``tools/synthetic_cost.py`` counts the same way):
per token at a window of T positions, training costs 6 (N + H) + 6 n_layer d T and a forward 2 (N + H) +
2 n_layer d T, N the non-embedding parameters (``model.gpt.non_embedding_parameters``), H = d x V the output head,
n_layer d T the causal attention. What each stage computes:

* ``pretrain``: its training tokens (``training.budget``: steps x batch x processes x accumulation x T);
  ``finetune`` its own; ``headscale`` its own at ``HEADSCALE_SHARE`` of full training (it trains no weight, but
  runs the whole backward through the activations), ``headscale-search`` its trials at most.
* ``evaluate``: forwards only: per perplexity length l, ceil(ppl_tokens / stride) windows of l tokens per corpus;
  ``position_windows`` windows of the longest length (x ``ENTROPY_COST`` with the entropy probe); per passkey
  length depths x keys prompts of l + max_new_tokens positions; long-context samples at the longest passkey length.
  ``scale-search``: one such evaluation (perplexity and curves only) per trial.
* ``synthetic``, ``synthetic-grid``: per cell steps x batch x the training width, taken as the longest test
  sequence scaled by train_max / test_max (the task's own measure), plus a fixed cost per cell.

FLOP become seconds at rates measured on the development machine (2 CPU cores, torch 2.13.0+cpu), calibrated on
the regime study's measured steps (its README: a 12 x 64 pretraining 771-818 s, a lambda search 147-169 s,
HeadScale 69-87 s, an evaluation 36-50 s) and the synthetic study's 1-thread cells; docs/running.md gives how
close the totals come on the other studies. Another machine runs at another pace, which the pipeline measures
from the first step on (``pipeline.eta``).
"""

from __future__ import annotations

import math
from typing import Any

from nope_lightning.config.parts import ModelConfig
from nope_lightning.config.stages import PretrainConfig
from nope_lightning.config.synthetic import SyntheticConfig, SyntheticGridConfig
from nope_lightning.model.gpt import non_embedding_parameters
from nope_lightning.runtime.progress import duration
from nope_lightning.training.budget import training_tokens, with_budget

# Rates measured on the development machine: model FLOP per second of wall clock, every overhead of a step
# (data, optimizer, validation, logging) included, so they hold for models of about the size measured.
TRAIN_RATE = 7.7e10  # 2 DDP processes x 1 thread: the 12 x 64 regime pretraining (6.04e13 FLOP in ~780 s)
ONE_PROCESS_TRAIN_RATE = 6.6e10  # one process on 2 threads: the regime HeadScale (200 steps, ~68 s)
FORWARD_RATE = 1.05e11  # evaluation forwards: the regime lambda search (17 trials, 158 s)
SYNTHETIC_RATE = 2.9e10  # a synthetic cell on 1 thread: between sort_symbols alone (89 s a cell) and parity
HEADSCALE_SHARE = 0.81  # a HeadScale step / a full fine-tuning step (docs/performance.md, T = 256)
ENTROPY_COST = 2.5  # a forward with the attention-entropy probe / one without (docs/performance.md, T = 1024-2048)
DECODE_S = 0.0044  # one generated token of one passkey prompt: a one-position forward, bound by its overhead
STAGE_S = {"evaluate": 10.0, "scale-search": 10.0, "headscale": 10.0, "finetune": 10.0, "pretrain": 15.0,
           "synthetic": 5.0, "import": 5.0, "export": 5.0, "prepare": 5.0, "report": 20.0}  # load, log, plot
TRIAL_S = 2.0  # a search trial's own overhead (its nested run, its curves)


_PARAMETERS: dict[tuple[str, int], int] = {}  # (repr of a ModelConfig, train_len) -> N


def parameters(model: ModelConfig, train_len: int) -> int:
    """``non_embedding_parameters`` once per architecture: building even a meta model takes tens of ms, and a
    study asks for one model at every step."""
    key = (repr(model), train_len)
    if key not in _PARAMETERS:
        _PARAMETERS[key] = non_embedding_parameters(model, train_len)
    return _PARAMETERS[key]


def per_token(model: ModelConfig, vocab: int, train_len: int, length: int, passes: int) -> float:
    """FLOP per token at a window of ``length`` positions: ``passes`` 2 (forward) or 6 (training) x
    (N + d x ``vocab`` + n_layer d ``length``)."""
    n = parameters(model, train_len) + model.n_embd * vocab
    return passes * (n + model.n_layer * model.n_embd * length)


def seconds(stage: str, cfg: Any, model: PretrainConfig | None) -> float | None:
    """Estimated wall seconds of one step of ``stage`` with resolved config ``cfg`` on ``model`` (the model it
    trains or reads: architecture, train_len, vocabulary; None when it is not built by this file); None when the
    work cannot be known from the config (a model from elsewhere)."""
    fixed = STAGE_S.get(stage, 0.0)
    if stage in ("import", "export", "prepare", "report"):
        return fixed
    if stage in ("synthetic", "synthetic-grid"):
        return synthetic_seconds(cfg)
    if model is None:
        return None
    if stage == "pretrain":
        cfg = with_budget(cfg)
        tokens = training_tokens(cfg.trainer, cfg.trainer.max_steps, cfg.batch_size, cfg.train_len)
        return fixed + tokens * train_flop(model, cfg.train_len) / train_rate(cfg.trainer.devices)
    if stage == "evaluate":
        flop, decode_s = evaluate_work(cfg, model)
        return fixed + flop / FORWARD_RATE + decode_s
    if stage == "scale-search":
        trials = min(cfg.num_trials, len(cfg.lambdas)) if cfg.num_trials else len(cfg.lambdas)
        flop = perplexity_flop(model, cfg.target_lengths, cfg.ppl_tokens, cfg.stride, cfg.position_windows, 1.0)
        return fixed + trials * (TRIAL_S + flop / FORWARD_RATE)
    if stage == "headscale-search":
        return cfg.num_trials * seconds("headscale", cfg.base, model)
    if stage in ("headscale", "finetune"):
        steps = cfg.steps if stage == "headscale" else cfg.total_steps
        share = HEADSCALE_SHARE if stage == "headscale" else 1.0
        tokens = training_tokens(cfg.trainer, steps, cfg.batch_size, cfg.target_len)
        return fixed + share * tokens * train_flop(model, cfg.target_len) / train_rate(cfg.trainer.devices)
    return None


def train_rate(processes: int) -> float:
    """FLOP/s of training in ``processes`` processes (DDP) on the development machine's 2 cores."""
    return TRAIN_RATE if processes > 1 else ONE_PROCESS_TRAIN_RATE


def train_flop(model: PretrainConfig, length: int) -> float:
    return per_token(model.model, model.data.vocab_size, model.train_len, length, 6)


def perplexity_flop(model: PretrainConfig, lengths: list[int], ppl_tokens: int, stride: int, windows: int,
                    curves: float) -> float:
    """Forward FLOP of scoring ``ppl_tokens`` targets at each length (windows of ``stride`` new targets; 0:
    ``train_len // 8``) and ``windows`` position windows of the longest, those at ``curves`` x a forward."""
    if not lengths:
        return 0.0
    stride = stride or max(1, model.train_len // 8)
    forward = [math.ceil(ppl_tokens / stride) * length * forward_flop(model, length) for length in lengths]
    longest = max(lengths)
    return sum(forward) + curves * windows * longest * forward_flop(model, longest)


def forward_flop(model: PretrainConfig, length: int) -> float:
    return per_token(model.model, model.data.vocab_size, model.train_len, length, 2)


def evaluate_work(cfg: Any, model: PretrainConfig) -> tuple[float, float]:
    """(forward FLOP, decoding seconds) of an ``evaluate`` step: perplexity and curves per corpus, passkey
    prompts and long-context samples (at the longest passkey length), each generating ``max_new_tokens``."""
    lengths = cfg.perplexity_lengths(model.train_len)
    curves = ENTROPY_COST if cfg.entropy else 1.0
    flop = max(1, len(cfg.corpora)) * perplexity_flop(model, lengths, cfg.ppl_tokens, cfg.stride,
                                                      cfg.position_windows, curves)
    passkey = cfg.passkey_lengths_for(model.train_len)
    prompts = cfg.passkey_depths * cfg.passkey_keys
    flop += sum(prompts * (n + cfg.max_new_tokens) * forward_flop(model, n) for n in passkey)
    decode_s = len(passkey) * prompts * cfg.max_new_tokens * DECODE_S
    if cfg.longctx_samples and passkey:
        samples = cfg.longctx_samples * len(cfg.longctx_tasks)
        flop += samples * max(passkey) * forward_flop(model, max(passkey))
        decode_s += samples * cfg.max_new_tokens * DECODE_S
    return flop, decode_s


def synthetic_seconds(cfg: SyntheticConfig | SyntheticGridConfig) -> float:
    """Every cell (task x PE x seed) one after another: steps x batch x width training tokens each."""
    total = 0.0
    for cell in cfg.cells() if isinstance(cfg, SyntheticGridConfig) else [cfg]:
        width = cell.test_positions[0] * cell.train_max / cell.test_max
        vocab = 64  # a task's vocabulary as litgpt pads it: tens of symbols, one padded block
        flop = 6 * (parameters(cell.model, cell.model.max_positions) + cell.model.n_embd * vocab
                    + cell.model.n_layer * cell.model.n_embd * width)
        total += STAGE_S["synthetic"] + cell.trainer.max_steps * cell.batch_size * width * flop / SYNTHETIC_RATE
    return total


def total(steps: list[dict]) -> dict[str, Any]:
    """A plan's totals over its entries' ``estimate_s`` and ``finished``: ``estimate_s`` (every step),
    ``remaining_s`` (the steps the store has not finished), ``unestimated`` (steps without an estimate)."""
    known = [s for s in steps if s["estimate_s"] is not None]
    return {"estimate_s": round(sum(s["estimate_s"] for s in known), 1),
            "remaining_s": round(sum(s["estimate_s"] for s in known if not s["finished"]), 1),
            "finished_steps": sum(bool(s["finished"]) for s in steps), "unestimated": len(steps) - len(known),
            "step_count": len(steps)}


def total_line(totals: dict[str, Any]) -> str:
    """``estimate 1 h 40 min for 56 steps on the development machine; 14 finished in the store, ~1 h 15 min
    left[; 2 steps without an estimate]``."""
    parts = [f"estimate {duration(totals['estimate_s'])} for {totals['step_count']} steps on the development "
             f"machine (2 CPU cores; another machine's pace is measured as the run goes)",
             f"{totals['finished_steps']} finished in the store, ~{duration(totals['remaining_s'])} left"]
    if totals["unestimated"]:
        parts.append(f"{totals['unestimated']} steps without an estimate (models made elsewhere)")
    return "; ".join(parts)
