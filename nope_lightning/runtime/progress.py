"""Training progress on stderr, counted in optimizer steps (``training.trainer.build_trainer`` installs it).

Our runs are step-based with one endless epoch, which Lightning's bar shows as "Epoch 0/-2 … v_num: 1120"
on stdout. This one shows "train 150/700 [elapsed<ETA] loss=…" on stderr, so stdout keeps only the
command's JSON result. When stderr is not a terminal (a log file), a bar would be a run of carriage
returns, so it writes plain lines instead, with the same ETA: one per tenth of the run, and one whenever a
minute passed without a line (a slow run would otherwise look stalled for many minutes).

Every ETA here is the measured pace (time per step since this fit began, tqdm's ``smoothing=0``), never a
rate assumed beforehand, so a busy machine lengthens it as it slows the run. When the 1-minute load average
exceeds the cores the run uses (processes x threads), the line and the bar say so: the other work is why.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from tqdm import tqdm as _tqdm

LINES = 10  # plain lines per run when stderr is not a terminal
QUIET_S = 60.0  # the longest a run goes without a plain line


class StepProgressBar(TQDMProgressBar):
    def __init__(self, clock: Callable[[], float] = time.monotonic, load: Callable[[], tuple] = os.getloadavg,
                 ) -> None:
        super().__init__()
        self._lines = not sys.stderr.isatty()
        self._clock, self._load = clock, load
        self._cores = os.cpu_count() or 1  # the cores this fit uses, known once it starts
        self._start = (0.0, 0)  # (time, step) when this fit began: a resumed run's ETA counts from there
        # (step, time) of the last line: with gradient accumulation a step spans batches, and gets one line
        self._written = (-1, 0.0)

    @property
    def validation_description(self) -> str:
        return "validate"

    @property
    def test_description(self) -> str:
        return "evaluate"

    def _bar(self, desc: str, *, leave: bool, row: int = 0) -> Tqdm:
        return Tqdm(desc=desc, position=2 * self.process_position + row, disable=self.is_disabled or self._lines,
                    leave=leave, dynamic_ncols=True, file=sys.stderr, smoothing=0, bar_format=self.BAR_FORMAT)

    def init_train_tqdm(self) -> Tqdm:
        return self._bar("train", leave=True)

    def init_validation_tqdm(self) -> Tqdm:
        return self._bar(self.validation_description, leave=False, row=1)

    def init_test_tqdm(self) -> Tqdm:
        return self._bar(self.test_description, leave=True)

    def get_metrics(self, trainer, pl_module) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the logger's version number, meaningless next to an MLflow run id
        return metrics

    def on_train_epoch_start(self, trainer, *_: Any) -> None:
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps)
        bar.initial = bar.n = trainer.global_step
        bar.set_description("train")
        self._start = (self._clock(), trainer.global_step)
        self._cores = min(os.cpu_count() or 1, trainer.num_devices * torch.get_num_threads())
        self._written = (-1, self._start[0])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step, total = trainer.global_step, trainer.max_steps
        if not self._should_update(step, total):
            return
        if self._lines:
            now = self._clock()
            if step != self._written[0] and (step == total or step % max(1, total // LINES) == 0
                                             or now - self._written[1] >= QUIET_S):
                self._written = (step, now)
                self._write_line(step, total, self.get_metrics(trainer, pl_module))
        elif step != self.train_progress_bar.n:
            self.train_progress_bar.n = step
            busy = load_above(self._cores, self._load)
            self.train_progress_bar.set_postfix({**self.get_metrics(trainer, pl_module),
                                                 **({"machine busy": busy} if busy else {})})

    def _write_line(self, step: int, total: int, metrics: dict[str, Any]) -> None:
        began, first = self._start
        elapsed = self._clock() - began
        eta = elapsed / (step - first) * (total - step) if step > first else 0.0
        shown = ", ".join(f"{k}={Tqdm.format_num(v)}" for k, v in metrics.items())
        print(f"train {step}/{total} ({100 * step // total}%) {_tqdm.format_interval(elapsed)} elapsed, "
              f"ETA {_tqdm.format_interval(eta)}" + (f", {shown}" if shown else "")
              + (f"; {note}" if (note := busy_note(self._cores, self._load)) else ""), file=sys.stderr, flush=True)


def load_above(cores: int, load: Callable[[], tuple] = os.getloadavg) -> str:
    """``load 3.6 on 2 cores`` when the 1-minute load average exceeds ``cores``, else ''."""
    now = load()[0]
    return f"load {now:.1f} on {cores} core{'s' if cores > 1 else ''}" if now > cores else ""


def busy_note(cores: int, load: Callable[[], tuple] = os.getloadavg) -> str:
    """``machine busy: load 3.6 on 2 cores, ETA follows the measured pace`` when the 1-minute load average
    exceeds ``cores`` (other work shares them: the ETA is long because the run is slowed), else ''."""
    busy = load_above(cores, load)
    return f"machine busy: {busy}, ETA follows the measured pace" if busy else ""


def duration(seconds: float) -> str:
    """``45 s``, ``14 min``, ``1 h 20 min``: a span in words, rounded to what a person plans with."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def pipeline_line(line: str) -> None:
    """One progress line of a pipeline (or its dry run) on stderr: ``pipeline [3/23] evaluate eval_nope: …``."""
    print(f"pipeline {line}", file=sys.stderr, flush=True)
