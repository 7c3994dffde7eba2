"""``synthetic``: length generalization on the tasks of Kazemnejad et al. (2023).

``run(cfg)`` trains one GPT on one task with one position encoding:

* sequences ``<bos> prompt <sep> target <eos>``, right-padded; the loss covers the target and ``<eos>``
  only (``SyntheticLM`` overrides ``CausalLM.training_step`` and nothing else of the training);
* every ``trainer.val_every_n_steps`` steps it greedy-decodes the in-distribution validation set and
  keeps the weights with the best exact match (the first best, as the reference's HF Trainer);
* with those weights it greedy-decodes the validation (ID) and test (OOD) examples and reports exact
  match per length bucket, and the held-out ID test split (``n_id_test``) when it has one;
* ``stop_at`` > 0 ends training early, at the first validation where the stopping rule holds
  (``training.stopping_rule``).

Decoding is batched greedy with the model's KV cache (``eval.generate.greedy_decode``). Prompts are right-padded:
a causal model's positions 0..t never see the padding after them, and every PE (absolute ones and
NoPE's implicit position counting included) sees positions exactly as in training, which left padding
would shift.

Logged on the run: ``val/id_acc`` during training; ``synthetic/{task}/{pe}/id_acc``, ``.../ood_acc``
and ``.../len{L}/acc`` per bucket; ``stop/step`` and ``stop/rule_met``; with ``n_id_test``,
``.../id_test_acc``, ``.../id_test/len{L}/acc`` and ``id_test.json``; ``results.json``,
``per_length_acc.png`` and (``log_model``) ``model.safetensors`` of the selected weights. The ``synthetic-grid``
stage (``synthetic_grid.py``) runs ``train_and_evaluate`` per (task, PE, seed). Both train into a checkpoint folder
(this stage's: ``training_folder``), so a run stopped in training resumes where it stopped when the same command
runs again; the folder is deleted once the run has finished.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from lightning.pytorch import seed_everything
from safetensors.torch import save_file
from torchmetrics import MeanMetric

from nope_lightning.analysis.synthetic import grid as synthetic_grid
from nope_lightning.analysis.synthetic import grid_plots
from nope_lightning.config.core import to_dict
from nope_lightning.config.parts import ModelConfig
from nope_lightning.config.synthetic import PAPER_NAMES, SyntheticConfig
from nope_lightning.data.synthetic_batches import SyntheticData
from nope_lightning.eval.generate import greedy_decode
from nope_lightning.eval.synthetic_scoring import bucket_accuracies, log_id_test, score, scratchpad_errors
from nope_lightning.model.gpt import GPT, count_parameters
from nope_lightning.results.synthetic import Failure, SyntheticCell, problems_digest
from nope_lightning.runtime import tracking
from nope_lightning.synthetic import Example, Vocabulary
from nope_lightning.training.module import CausalLM, lm_loss
from nope_lightning.training.stopping_rule import stop_metrics, stopping_callbacks
from nope_lightning.training.trainer import check_strategy, resumable_fit, validation_checkpoint

N_ERRORS = 5  # wrong OOD predictions kept in results.json, for a look at how a model fails

# --- data ---------------------------------------------------------------------------------------------


def check_fits(data: SyntheticData, model: ModelConfig, extra_new_tokens: int) -> None:
    """Fail before training when the longest decode would exceed ``model.max_positions``."""
    needed = data.longest_sequence(data.train + data.evaluation + data.id_test) + extra_new_tokens
    if needed > model.max_positions:
        raise ValueError(f"model.max_positions={model.max_positions} is too small: the longest sequence "
                         f"(and decode budget) needs {needed} positions")


# --- decoding and scoring ----------------------------------------------------------------------------


class SyntheticLM(CausalLM):
    """``CausalLM`` with the loss on target tokens, greedy exact-match validation and best-weight tracking.

    ``best_state`` holds a CPU copy of the weights with the best validation exact match (strictly
    better only, so the earliest of equal ones); ``predictions[k]`` maps indices into the k-th test loader's
    split (``evaluation``, ``id_test``) to ids generated in ``trainer.test``. A checkpoint carries the best
    weights, their score and step, and the seconds trained so far (``trained_s``), so a resumed run selects as
    an uninterrupted one would and reports its whole training time.
    """

    def __init__(self, model: GPT, cfg: SyntheticConfig, data: SyntheticData) -> None:
        super().__init__(model, cfg.optim, cfg.trainer.max_steps, cfg.trainer.compile)
        self.vocab, self.eval_cfg = data.vocab, cfg.eval
        self.valid, self.tested = data.valid, (data.evaluation, data.id_test)
        self.val_acc = MeanMetric()
        self.best_acc, self.best_step = -1.0, 0
        self.best_state: dict[str, torch.Tensor] | None = None
        self.predictions: tuple[dict[int, list[int]], ...] = ({}, {})
        self.trained_s, self.fit_started = 0.0, time.perf_counter()

    def on_train_start(self) -> None:
        self.fit_started = time.perf_counter()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        trained_s = self.trained_s + time.perf_counter() - self.fit_started
        checkpoint["synthetic"] = {"best_acc": self.best_acc, "best_step": self.best_step,
                                   "best_state": self.best_state, "trained_s": trained_s}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        saved = checkpoint["synthetic"]
        self.best_acc, self.best_step, self.best_state = saved["best_acc"], saved["best_step"], saved["best_state"]
        self.trained_s = saved["trained_s"]

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids, labels = batch
        loss = lm_loss(self(ids[:, :-1]), labels)  # mean over target tokens (IGNORE skipped)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def generate(self, examples: Sequence[Example]) -> list[list[int]]:
        """Greedy outputs for ``examples``, up to the longest gold target + ``<eos>`` + the extra budget."""
        budget = max(len(e.target) for e in examples) + 1 + self.eval_cfg.extra_new_tokens
        # The uncompiled model: decoding changes the sequence length at every step.
        return greedy_decode(self.model, [self.vocab.encode_prompt(e) for e in examples], budget,
                             eos_id=self.vocab.eos_id, pad_id=self.vocab.pad_id, vocab_size=len(self.vocab),
                             device=self.device)

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        examples = [self.valid[i] for i in batch.tolist()]
        correct = score(self.vocab, examples, self.generate(examples))
        self.val_acc.update(torch.tensor(correct, dtype=torch.float32, device=self.device))

    def on_validation_epoch_end(self) -> None:
        acc = float(self.val_acc.compute())
        self.val_acc.reset()
        self.log("val/id_acc", acc, prog_bar=True)
        if acc > self.best_acc:
            self.best_acc, self.best_step = acc, self.global_step
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def test_step(self, batch: torch.Tensor, batch_idx: int, dataloader_idx: int = 0) -> None:
        indices, split = batch.tolist(), self.tested[dataloader_idx]
        self.predictions[dataloader_idx].update(zip(indices, self.generate([split[i] for i in indices]), strict=True))

    def restore_best(self) -> None:
        assert self.best_state is not None, "no validation ran: build_trainer always validates at the end"
        self.model.load_state_dict(self.best_state)


# --- one run ------------------------------------------------------------------------------------------


def failures(vocab: Vocabulary, examples: Sequence[Example], generated: Sequence[list[int]],
             correct: Sequence[bool], train_max: int) -> list[Failure]:
    """The first ``N_ERRORS`` wrong OOD predictions as readable strings."""
    wrong = [(e, ids) for e, ids, ok in zip(examples, generated, correct, strict=True)
             if not ok and e.length > train_max]
    return [Failure(e.length, " ".join(e.prompt), " ".join(e.target), " ".join(vocab.decode(ids)))
            for e, ids in wrong[:N_ERRORS]]


class Trained(NamedTuple):
    """What one run leaves for the grid: its result, the selected model (on CPU) and its data."""

    result: SyntheticCell
    model: GPT
    data: SyntheticData


def build_model(cfg: SyntheticConfig, data: SyntheticData) -> GPT:
    """The run's GPT, initialised from ``cfg.seed``: same seed, same initial weights for every PE (the
    PE-specific tables are created last)."""
    seed_everything(cfg.seed, verbose=False)
    return GPT(cfg.model, len(data.vocab), train_len=data.longest_sequence(data.train))


def save_weights(model: GPT, path: Path) -> None:
    """``model``'s weights as one safetensors file (read back with ``safetensors.torch.load_file``)."""
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(path))


def train_and_evaluate(cfg: SyntheticConfig, checkpoints: Path) -> Trained:
    """Train, select on ID validation, decode ID + OOD, log everything to an MLflow run. It trains into the folder
    ``checkpoints`` as pretraining does (``training.trainer.resumable_fit``), with a checkpoint after every
    validation (``validation_checkpoint``), from which the same call after a stop continues in the same MLflow run,
    with the same batches, selection and stopping-rule state (``ResumedBatches``, ``SyntheticLM``,
    ``HeldThreshold``): it ends with the results of a run never stopped, having lost at most one validation
    interval of training."""
    check_strategy(cfg.trainer)
    data = SyntheticData(cfg)
    check_fits(data, cfg.model, cfg.eval.extra_new_tokens)
    model = build_model(cfg, data)
    module = SyntheticLM(model, cfg, data)
    callbacks = stopping_callbacks("val/id_acc", cfg.stop_at, cfg.stop_patience)
    with resumable_fit(checkpoints, cfg, resume_keys(cfg)) as resumable, warnings.catch_warnings():
        # Lightning warns that a resume mid-epoch is unreliable unless the loader has a state_dict: ResumedBatches
        # resumes the batches exactly without one (its tests), so the warning would only mislead.
        warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
        trainer = resumable.fit(module, data, stage="synthetic", name=cfg.run_name, max_steps=cfg.trainer.max_steps,
                                metrics=lambda _: {}, callbacks=callbacks,
                                checkpoints=[validation_checkpoint(checkpoints)])
    trained = time.perf_counter()
    module.restore_best()
    trainer.test(module, datamodule=data, verbose=False)
    evaluated = time.perf_counter()

    generated = [module.predictions[0][i] for i in range(len(data.evaluation))]
    correct = score(data.vocab, data.evaluation, generated)
    ood = [e.length > cfg.train_max for e in data.evaluation]
    by_example = dict(zip(map(id, data.evaluation), correct, strict=True))  # by identity: unhashable
    run_id, train_s = trainer.logger.run_id, round(module.trained_s + trained - module.fit_started, 1)
    result = SyntheticCell(
        run_id, cfg.task, cfg.pos_encoding, cfg.seed, cfg.scratchpad, cfg.train_max,
        max(e.length for e in data.test), float(np.mean([ok for ok, o in zip(correct, ood, strict=True) if not o])),
        float(np.mean([ok for ok, o in zip(correct, ood, strict=True) if o])), module.best_acc, module.best_step,
        trainer.global_step, train_s, round(evaluated - trained, 1), count_parameters(model),
        bucket_accuracies(data.evaluation, correct, cfg.train_max, cfg.eval.bucket_width),
        failures(data.vocab, data.evaluation, generated, correct, cfg.train_max),
        tuple(by_example[id(e)] for e in data.test), problems_digest(data.test))
    stopped = stop_metrics(trainer, callbacks)
    tracking.log_metrics(cfg.tracking, run_id, stopped, step=trainer.global_step)
    result = dataclasses.replace(result, scratchpad_errors=scratchpad_errors(
        data.vocab, data.evaluation, generated, correct, cfg.train_max, cfg.scratchpad))
    if cfg.stop_at:  # a cell trained without the rule keeps its results.json as before
        result = dataclasses.replace(result, stopped_by_rule=bool(stopped["stop/rule_met"]))
    if data.id_test:
        acc, buckets = log_id_test(cfg.tracking, run_id, metric_prefix(cfg.task, cfg.pos_encoding), data.vocab,
                                   data.id_test, [module.predictions[1][i] for i in range(len(data.id_test))],
                                   cfg.eval.bucket_width, trainer.global_step)
        result = dataclasses.replace(result, id_test_acc=acc, id_test_buckets=buckets)
    log_run(cfg, result, model)
    return Trained(result, model, data)


def metric_prefix(task: str, pos_encoding: str) -> str:
    return f"synthetic/{task}/{pos_encoding}"


def log_run(cfg: SyntheticConfig, result: SyntheticCell, model: GPT) -> None:
    """Final metrics, ``results.json``, ``per_length_acc.png`` and the selected weights on the run."""
    run_id, prefix = result.run_id, metric_prefix(cfg.task, cfg.pos_encoding)
    metrics = {f"{prefix}/id_acc": result.id_acc, f"{prefix}/ood_acc": result.ood_acc,
               "model/parameters": result.parameters,
               **{f"{prefix}/len{b.bucket}/acc": b.acc for b in result.buckets}}
    tracking.log_metrics(cfg.tracking, run_id, metrics, step=result.steps)
    tracking.log_json(cfg.tracking, run_id, result.to_dict(), "results.json")
    curve = {synthetic_grid.bucket_start(b.bucket): b.acc for b in result.buckets}
    title = f"{cfg.task}: {PAPER_NAMES.get(cfg.pos_encoding, cfg.pos_encoding)}, seed {cfg.seed}"
    tracking.log_figure(cfg.tracking, run_id, grid_plots.plot_curves({cfg.pos_encoding: curve}, cfg.train_max,
                                                               title, "exact match"), "per_length_acc.png")
    if cfg.log_model:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.safetensors"
            save_weights(model, path)
            tracking.client(cfg.tracking).log_artifact(run_id, str(path))


def resume_keys(cfg: SyntheticConfig) -> tuple[str, ...]:
    """The config sections a resumed run must match (all but ``tracking``); they name ``training_folder``."""
    return tuple(f.name for f in dataclasses.fields(cfg) if f.name != "tracking")


def training_folder(cfg: SyntheticConfig) -> Path:
    """Where the ``synthetic`` stage trains (``train_and_evaluate``'s checkpoints): ``checkpoints/synthetic/<run
    name>-<12 hex of its resume_keys>`` beside the artifact root (``mlruns/`` by default): the same command finds
    its stopped run there, and a changed config trains in its own folder, not refused by another's checkpoints."""
    keys = resume_keys(cfg)
    same = {k: v for k, v in to_dict(cfg).items() if k in keys}
    digest = hashlib.sha256(json.dumps(same, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return Path(cfg.tracking.artifact_root).parent / "checkpoints" / "synthetic" / f"{cfg.run_name}-{digest}"


def run(cfg: SyntheticConfig) -> dict[str, Any]:
    """The ``synthetic`` stage: one (task, PE, seed), resumed from ``training_folder`` when a run of the same
    config stopped in training; returns ``results.json``'s content less ``ood_correct`` (per-example data, read from
    the file by the claims, never a value a later step references)."""
    out = training_folder(cfg)
    result = train_and_evaluate(cfg, out).result
    shutil.rmtree(out)  # finished: MLflow holds all of it, and a rerun trains anew, as before checkpoints
    return {k: v for k, v in result.to_dict().items() if k != "ood_correct"}


# --- declared results: the registry's ``Stage.results`` (what a later step may reference; the dry run) ---


def result_keys(cfg: SyntheticConfig, train_len: int | None = None) -> dict[str, type]:
    """The scalars of ``results.json`` that ``run`` returns, its format version included (its per-bucket
    accuracies and errors are lists; ``ood_correct``, one 0/1 character per test example, is no scalar)."""
    return {"version": int, "run_id": str, "task": str, "pos_encoding": str, "seed": int, "scratchpad": str,
            "train_max_len": int, "test_max_len": int, "id_acc": float, "ood_acc": float,
            "best_val_acc": float, "best_step": int, "steps": int, "train_seconds": float,
            "eval_seconds": float, "parameters": int, "test_digest": str}
