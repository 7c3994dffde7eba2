"""A stopping rule on a validation score, one for every run it is given to: stop at the first validation where the
score has been at or above a threshold at ``patience`` consecutive validations (the synthetic stage's ``stop_at``
and ``stop_patience``), or at ``trainer.max_steps``, the cap.

Lightning's ``EarlyStopping`` with ``stopping_threshold`` stops at the first validation strictly above the threshold
(an exact-match threshold of 1.0 would never stop) and its ``patience`` counts validations without improvement, so
``HeldThreshold`` replaces only its decision (``_evaluate_stopping_criteria``), keeping its monitor checks, its
all-ranks decision and its saved state: ``wait_count`` counts the validations in a row at or above the threshold.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from torch import Tensor


class HeldThreshold(EarlyStopping):
    """Stop once ``monitor`` (higher is better) has been >= ``threshold`` at ``patience`` validations in a row."""

    def __init__(self, monitor: str, threshold: float, patience: int = 1) -> None:
        super().__init__(monitor=monitor, mode="max", patience=patience, stopping_threshold=threshold,
                         check_finite=False, check_on_train_epoch_end=False)

    def _evaluate_stopping_criteria(self, current: Tensor) -> tuple[bool, str | None]:
        self.wait_count = self.wait_count + 1 if float(current) >= self.stopping_threshold else 0
        if self.wait_count < self.patience:
            return False, None
        self.stopping_reason = EarlyStoppingReason.STOPPING_THRESHOLD
        return True, (f"{self.monitor} >= {self.stopping_threshold} at {self.wait_count} validations in a row: "
                      "stopping")

    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        # Resumed from the checkpoint of the validation that met the rule (stopped after it, in testing): the run is
        # over, as it was then; without this it would train on to the next validation.
        if self.met:
            trainer.should_stop = True

    @property
    def met(self) -> bool:
        """Whether the rule ended the training (False: it ran to the cap)."""
        return self.stopping_reason == EarlyStoppingReason.STOPPING_THRESHOLD


def stopping_callbacks(monitor: str, threshold: float, patience: int) -> list[HeldThreshold]:
    """The rule as ``build_trainer``'s callbacks: none when ``threshold`` is 0 (off)."""
    return [HeldThreshold(monitor, threshold, patience)] if threshold else []


def stop_metrics(trainer: Trainer, callbacks: list[Any]) -> dict[str, float]:
    """``stop/step``, the optimizer step training ended at, and ``stop/rule_met``: 1 when a ``HeldThreshold``
    among ``callbacks`` ended it, 0 when it ran to ``max_steps`` (the cap)."""
    met = any(isinstance(c, HeldThreshold) and c.met for c in callbacks)
    return {"stop/step": float(trainer.global_step), "stop/rule_met": float(met)}
