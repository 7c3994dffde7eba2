"""The config of ``headscale-search``, an Optuna study over HeadScale runs (``stages/headscale_search.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from nope_lightning.config.core import check_range
from nope_lightning.config.stages import HeadScaleConfig


@dataclass
class HeadScaleSearchConfig:
    """``nope-lightning run headscale-search base.checkpoint=… base.target_len=… base.init=default``.

    ``base`` is the HeadScale run every trial starts from; its ``init`` and ``optim.lr`` are replaced by the
    sampled values (so ``base.init=default`` is enough). ``storage`` empty means
    ``sqlite:///mlruns/optuna.db``; ``study_name`` empty derives one from the model and the settings.
    ``pruner_warmup_steps``: no trial is pruned before this optimizer step; ``pruner_startup_trials``: nor
    before this many trials finished.
    """

    base: HeadScaleConfig = MISSING
    num_trials: int = 20
    init_min: float = 1.0
    init_max: float = 2.5
    lr_min: float = 0.01
    lr_max: float = 0.3
    val_every_n_steps: int = 50
    pruner_warmup_steps: int = 50
    pruner_startup_trials: int = 3
    storage: str = ""
    study_name: str = ""
    seed: int = 1234
    name: str = ""

    def __post_init__(self) -> None:
        for key in ("num_trials", "val_every_n_steps"):
            check_range(key, getattr(self, key), 1)
        for key in ("pruner_warmup_steps", "pruner_startup_trials"):
            check_range(key, getattr(self, key), 0)
        check_range("init_min", self.init_min, 0.0, low_open=True)
        check_range("lr_min", self.lr_min, 0.0, low_open=True)
        if self.init_max < self.init_min or self.lr_max < self.lr_min:
            raise ValueError(f"empty search range: init {self.init_min}..{self.init_max}, "
                             f"lr {self.lr_min}..{self.lr_max}")
        if self.base.constraint and self.init_min < 1.0:
            raise ValueError(f"init_min={self.init_min} is below the focus constraint lambda >= 1; raise it or "
                             f"set base.constraint=false")
        if self.base.trainer.devices != 1 or self.base.trainer.num_nodes != 1:
            raise ValueError("headscale-search runs one trial per process (base.trainer.devices=1); start several "
                             "workers on the same storage to search in parallel")
