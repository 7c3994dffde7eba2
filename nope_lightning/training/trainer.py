"""The one place a Lightning ``Trainer`` is built, and ``resumable_fit``: training into an ``out_dir`` that a
rerun of a killed run continues (pretrain, finetune, headscale).

An ``out_dir`` holds ``checkpoints/`` (``step*.ckpt`` every ``trainer.checkpoint_every_n_steps``, and ``last.ckpt``
then and every ``trainer.checkpoint_minutes``), ``config.yaml`` (the resolved config) and ``mlflow_run_id`` (the
MLflow run a rerun continues, also when it stopped before its first checkpoint: it restarts in the same run).

A stop signal inside ``Trainer.fit`` ends the fit at the next step on every rank (``StepBoundarySignals``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector
from lightning.pytorch.utilities import rank_zero_only

from nope_lightning.config.core import flatten, load_config, to_dict, to_yaml
from nope_lightning.config.parts import TrainerConfig
from nope_lightning.model.attention import Block
from nope_lightning.model.checkpoint import newest_intact, torch_load
from nope_lightning.runtime import stopping, tracking
from nope_lightning.runtime.locks import hold_lock
from nope_lightning.runtime.progress import StepProgressBar
from nope_lightning.training.module import FSDP2Strategy

# --- the Trainer ---------------------------------------------------------------------------------------


def configure_threads(cfg: TrainerConfig) -> int:
    """Set torch's intra-op threads: ``cfg.threads``, or for 0 the CPU cores shared out among the processes.

    Measured on 2 cores with the small model (``tools/benchmark_pretrain.py``, docs/performance.md): one process
    trains faster on 2 threads than on 1, and 2 DDP processes x 1 thread are faster still; so ``threads=0``
    gives each of the ``devices`` processes ``cores // devices`` threads. GPU runs keep torch's default.
    """
    threads = cfg.threads
    if threads == 0:
        if _uses_gpu(cfg):
            return torch.get_num_threads()
        threads = max(1, (os.cpu_count() or 1) // cfg.devices)
    torch.set_num_threads(threads)
    return threads


def _uses_gpu(cfg: TrainerConfig) -> bool:
    return cfg.accelerator in ("gpu", "cuda") or (cfg.accelerator == "auto" and torch.cuda.is_available())


#: What FSDP2's ``MixedPrecisionPolicy`` expresses: fp32 throughout, or bf16 compute over fp32 master weights.
FSDP2_PRECISIONS = ("32-true", "bf16-mixed")


def compile_problem(cuda: bool) -> str:
    """Why ``torch.compile`` cannot run here, or '' when it can: dynamo must support this Python, and inductor
    needs Triton for CUDA code and a C++ compiler (``$CXX``, else g++) for CPU code."""
    if not torch._dynamo.is_dynamo_supported():
        return f"torch {torch.__version__} cannot compile under Python {sys.version.split()[0]}"
    if cuda:
        from torch.utils._triton import has_triton

        return "" if has_triton() else "Triton is not installed (inductor's CUDA kernels need it)"
    compiler = os.environ.get("CXX", "g++")
    return "" if shutil.which(compiler) else f"no C++ compiler ({compiler}) for inductor's CPU code"


def check_strategy(cfg: TrainerConfig) -> None:
    """Fail before any compute on a strategy (or a compile) this machine cannot run."""
    if cfg.compile and (problem := compile_problem(_uses_gpu(cfg))):
        raise ValueError(f"trainer.compile=true, but {problem}; set trainer.compile=false")
    if cfg.strategy == "fsdp" and not (_uses_gpu(cfg) and torch.cuda.is_available()):
        raise ValueError("trainer.strategy=fsdp needs CUDA GPUs (it is Lightning's FSDP1); on CPU use "
                         "trainer.strategy=fsdp2 (FSDP2 runs on gloo) or ddp, with trainer.devices=2")
    if cfg.strategy == "fsdp2" and cfg.precision not in FSDP2_PRECISIONS:
        raise ValueError(f"trainer.strategy=fsdp2 takes trainer.precision={' or '.join(FSDP2_PRECISIONS)} "
                         f"(bf16-mixed: bf16 compute, fp32 weights and gradient reduction), not {cfg.precision}")
    if cfg.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError(f"trainer.accelerator={cfg.accelerator} but no CUDA GPU is visible; use accelerator=cpu")


def _strategy(cfg: TrainerConfig, batch_tokens: int):
    if cfg.strategy == "fsdp2":
        return FSDP2Strategy(cfg, bf16=cfg.precision == "bf16-mixed", batch_tokens=batch_tokens)
    if cfg.strategy != "fsdp":
        return cfg.strategy
    # One FSDP unit per transformer block; orig params so frozen (HeadScale) and trainable tensors mix. FSDP1
    # takes its checkpointing policy before the model exists, so "auto" cannot be decided here: it checkpoints.
    return FSDPStrategy(auto_wrap_policy={Block},
                        activation_checkpointing_policy=None if cfg.activation_checkpointing == "false" else {Block},
                        state_dict_type="full", use_orig_params=True, sharding_strategy="FULL_SHARD")


def _precision(cfg: TrainerConfig) -> str:
    # Under fsdp2, bf16-mixed is FSDP2's MixedPrecisionPolicy (FSDP2Strategy.shard), not Lightning's autocast:
    # parameters are all-gathered in bf16, so every matmul already runs in bf16.
    return "32-true" if cfg.strategy == "fsdp2" else cfg.precision


def build_trainer(cfg: TrainerConfig, *, logger: Any = None, callbacks: list | None = None,
                  default_root_dir: str | None = None, grad_clip: float = 0.0, max_steps: int | None = None,
                  enable_checkpointing: bool = True, batch_tokens: int = 0) -> Trainer:
    """A ``lightning.pytorch.Trainer`` from ``TrainerConfig``: step-based, no epochs, no sanity check.

    ``batch_tokens``: tokens per device per micro-batch, what ``activation_checkpointing=auto`` weighs under fsdp2.

    Validation runs every ``val_every_n_steps`` optimizer steps (0: only at the end) on ``val_batches``.
    With ``progress_bar`` on, progress goes to stderr in optimizer steps (``progress.StepProgressBar``).
    """
    check_strategy(cfg)
    configure_threads(cfg)
    steps = max_steps or cfg.max_steps
    val_every = cfg.val_every_n_steps if 0 < cfg.val_every_n_steps < steps else steps
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    trainer = Trainer(
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        num_nodes=cfg.num_nodes,
        strategy=_strategy(cfg, batch_tokens),
        precision=_precision(cfg),
        max_steps=steps,
        max_epochs=-1,
        val_check_interval=val_every,
        check_val_every_n_epoch=None,
        limit_val_batches=cfg.val_batches,
        num_sanity_val_steps=0,
        log_every_n_steps=cfg.log_every_n_steps,
        gradient_clip_val=grad_clip or None,
        accumulate_grad_batches=cfg.accumulate_grad_batches,
        enable_progress_bar=cfg.progress_bar,
        enable_model_summary=False,
        enable_checkpointing=enable_checkpointing,
        use_distributed_sampler=False,  # our data modules shard by rank themselves
        logger=logger if logger is not None else False,
        callbacks=[*(callbacks or []), *([StepProgressBar()] if cfg.progress_bar else [])],
        default_root_dir=default_root_dir,
    )
    trainer._signal_connector = StepBoundarySignals(trainer)  # Lightning has no setting for its connector
    return trainer


class StepBoundarySignals(_SignalConnector):
    """Lightning's signal connector with a handler that runs no collective: a stop signal (SIGINT, SIGTERM,
    SIGHUP) is recorded (``stopping.defer``) and forwarded to the ranks this process launched, and the fit
    stops at the start of the next step, on every rank at the same place (Lightning's loops broadcast rank 0's
    flag there, outside any handler, and raise ``SIGTERMException``). Lightning's own SIGTERM handler
    broadcasts from inside the handler: landing in one rank's forward while the other waits in the gradient
    all-reduce, the two collectives never match and both ranks hang. A second signal a second later stops at
    once; Ctrl-C then does not raise KeyboardInterrupt in the middle of a collective either."""

    def register_signal_handlers(self) -> None:
        self.received_sigterm = False
        self._original_handlers = self._get_current_signal_handlers()
        for signum in stopping.STOP_SIGNALS:
            self._register_signal(signum, self._stop_at_next_step)

    def _stop_at_next_step(self, signum: int, frame: Any) -> None:
        stopping.defer(signum)
        if not self.received_sigterm and self.trainer.strategy.launcher is not None:
            self.trainer.strategy.launcher.kill(signum)
        self.received_sigterm = True


# --- training into an out_dir that a rerun resumes -------------------------------------------------------

RUN_ID_FILE = "mlflow_run_id"


@dataclass(frozen=True)
class ResumableFit:
    """Training into ``out`` (what ``resumable_fit`` yields): ``checkpoint`` is the checkpoint it resumes (None:
    a fresh run) and ``run_id`` the MLflow run it continues (None: a new one). ``cfg`` is the stage's config,
    with ``trainer``, ``optim`` and ``tracking`` sections."""

    out: Path
    cfg: Any
    checkpoint: Path | None
    run_id: str | None

    def fit(self, module: LightningModule, data: LightningDataModule, *, stage: str, name: str, max_steps: int,
            metrics: Callable[[Trainer], dict[str, float]], callbacks: Sequence[Callback] = (),
            checkpoints: Sequence[ModelCheckpoint] | None = None) -> Trainer:
        """Fit ``module`` on ``data`` for ``max_steps`` optimizer steps, from ``checkpoint`` when there is one;
        returns the trainer (``trainer.logger.run_id``: the MLflow run, tagged ``stage``, named ``name``).

        Global rank 0 first records ``out``'s config and run id and, in a new run, logs the config and
        ``metrics(trainer)`` (a resumed run logged them when it started). ``callbacks`` go before the
        checkpoint callbacks (e.g. Optuna's pruner), which are ``checkpoint_callbacks``'s unless ``checkpoints``
        names others (``validation_checkpoint``). A module whose checkpoints hold only part of its state sets
        ``strict_loading = False``.
        """
        cfg = self.cfg
        if rank_zero_only.rank == 0 and (self.checkpoint or self.run_id):  # a rerun says what it continues
            what = (f"resumes from its checkpoint at step {checkpoint_step(self.checkpoint)}" if self.checkpoint
                    else "restarts from step 0: no checkpoint yet")
            print(f"{stage} {name}: {what}" + (f" (MLflow run {self.run_id})" if self.run_id else ""),
                  file=sys.stderr, flush=True)
        logger = tracking.lightning_logger(cfg.tracking, stage, name, self.run_id)
        checkpoints = checkpoint_callbacks(self.out, cfg.trainer, max_steps) if checkpoints is None else checkpoints
        trainer = build_trainer(cfg.trainer, logger=logger, callbacks=[*callbacks, *checkpoints],
                                default_root_dir=str(self.out), grad_clip=cfg.optim.grad_clip, max_steps=max_steps,
                                batch_tokens=data.batch_size * data.seq_len)
        if rank_zero_only.rank == 0:
            record_run(self.out, cfg, logger.run_id)
            if self.run_id is None:
                tracking.log_config(cfg.tracking, logger.run_id, cfg)
                tracking.log_metrics(cfg.tracking, logger.run_id, metrics(trainer))
        trainer.fit(module, datamodule=data, ckpt_path=self.checkpoint, weights_only=True)
        return trainer


@contextlib.contextmanager
def resumable_fit(out: Path, cfg: Any, keys: tuple[str, ...], resume: bool = True) -> Iterator[ResumableFit]:
    """Hold ``out``'s lock for the block, which trains into ``out`` with the yielded ``ResumableFit.fit``.

    Before yielding (so before any compute in the block) it refuses, in one line, an ``out`` that another
    process trains into, that holds a run of another config (in the sections ``keys``) or a damaged
    checkpoint, a run that ``resume=false`` would overwrite, and a run id this store does not hold.
    """
    with out_dir_lock(out):
        checkpoint = check_resumable(out, cfg, keys, resume)
        stopping.STATE.out_dir = out  # what a stop's line says a rerun resumes
        yield ResumableFit(out, cfg, checkpoint, resumed_run_id(out, cfg, checkpoint, keys))


@contextlib.contextmanager
def out_dir_lock(out: Path) -> Iterator[None]:
    """Held (by global rank 0) while a process trains into ``out``: a second writer fails at once with one
    line instead of interleaving checkpoints and metrics. The lock file sits beside ``out``, so refusing a
    bad input leaves no folder behind."""
    if rank_zero_only.rank != 0:
        yield
        return
    with hold_lock(out.parent / f".{out.name}.lock", f"out_dir={out}"):
        yield


def config_differences(saved: Any, cfg: Any, keys: tuple[str, ...]) -> list[str]:
    """Flattened keys under the sections ``keys`` whose values differ between two configs."""
    a, b = flatten(to_dict(saved)), flatten(to_dict(cfg))
    return sorted(k for k in b if k.split(".")[0] in keys and a.get(k) != b[k])


def check_resumable(out: Path, cfg: Any, keys: tuple[str, ...], resume: bool = True) -> Path | None:
    """The checkpoint to resume from (``out/checkpoints/last.ckpt``, else the newest intact ``step*.ckpt``),
    or None for a fresh run; raises before any compute when ``out`` holds a run with another config (in the
    sections ``keys``), a damaged checkpoint, or a run that ``resume=false`` would overwrite."""
    last = latest_checkpoint(out)
    if last is None:
        return None
    if not resume:
        raise ValueError(f"{out} already holds a run; set resume=true to continue it, or choose another "
                         f"name=/out_dir= (nothing was overwritten)")
    diff = config_differences(load_config(type(cfg), out / "config.yaml"), cfg, keys)
    if diff:
        raise ValueError(f"checkpoint {last} comes from another config (differs in {', '.join(diff[:6])}); "
                         f"use another name=/out_dir= for the new config")
    torch_load(last)  # a damaged file fails here, naming the newest intact checkpoint, before anything starts
    return last


def latest_checkpoint(out: Path) -> Path | None:
    """``out/checkpoints/last.ckpt``, else the newest intact ``step*.ckpt`` (a damaged ``last.ckpt`` is deleted,
    as its refusal advises); None when there is none."""
    last = out / "checkpoints" / "last.ckpt"
    if last.exists():
        return last
    return newest_intact(last.parent) if last.parent.is_dir() else None


def checkpoint_step(path: Path) -> int:
    """The optimizer step a Lightning checkpoint was saved at (read through mmap: no tensor is copied)."""
    return int(torch.load(path, map_location="cpu", mmap=True, weights_only=True)["global_step"])


def resume_note(out: Path) -> str:
    """What a rerun does with a stopped stage that trained into ``out``: resumes from its checkpoint at step s,
    or restarts (no checkpoint yet)."""
    last = latest_checkpoint(out)
    if last is None:
        return "restarts: no checkpoint yet"
    try:
        return f"resumes from its checkpoint at step {checkpoint_step(last)}"
    except Exception:  # noqa: BLE001 — cut short while being written: the rerun names the intact one it takes
        return "resumes from its newest intact checkpoint"


def resumed_run_id(out: Path, cfg: Any, resume_from: Path | None, keys: tuple[str, ...]) -> str | None:
    """The MLflow run that resuming ``out`` continues (None: a new run). An out_dir remembers its run's id;
    when this store does not hold that run (another store, or the store was deleted) it is one line naming
    both ways out, never MLflow's traceback. Without a checkpoint (stopped before its first) the same config's
    unfinished run is continued from step 0 rather than a second run of the same name opened beside it."""
    file = out / RUN_ID_FILE
    if not file.exists():
        return None
    run_id, store = file.read_text().strip(), cfg.tracking.uri
    if resume_from is None:
        same = not config_differences(load_config(type(cfg), out / "config.yaml"), cfg, keys)
        unfinished = tracking.has_run(cfg.tracking, run_id) and tracking.client(cfg.tracking).get_run(
            run_id).info.status != "FINISHED"  # a finished run whose checkpoints were deleted is not reopened
        return run_id if same and unfinished else None
    if tracking.has_run(cfg.tracking, run_id):
        return run_id
    saved = load_config(type(cfg), out / "config.yaml").tracking.uri
    where = (f"tracking.uri={saved}, not {store}: pass tracking.uri={saved} to continue it" if saved != store
             else f"{store}, which no longer holds it")
    raise ValueError(f"{out} continues MLflow run {run_id} of {where}; or train into another out_dir=/name= "
                     f"(or delete {out}) for a clean run")


def record_run(out: Path, cfg: Any, run_id: str) -> None:
    """Write what a rerun needs to resume ``out``: the resolved config and the MLflow run id."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(to_yaml(cfg))
    (out / RUN_ID_FILE).write_text(run_id)


def fit_result_keys(length: int) -> dict[str, type]:
    """What a stage that trained with ``ResumableFit.fit`` returns: its run, out_dir, optimizer steps and
    processes, and the last logged training loss and learning rate and validation loss (nats) and perplexity
    at ``length`` tokens."""
    return {"run_id": str, "out_dir": str, "step": int, "world_size": int, "train/loss": float,
            "train/lr": float, f"val/len{length}/loss": float, f"val/len{length}/ppl": float}


class OutDirCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint``, less its "Checkpoint directory … exists and is not empty" warning: the
    folder is the out_dir's own, which ``check_resumable`` accepted (same config, intact checkpoints) and whose
    lock this process holds, so a resumed run finding its checkpoints there is the expected case, not a hazard.
    Lightning has no setting for it: the warning is filtered, by its text, around ``setup`` only."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
            super().setup(trainer, pl_module, stage)


def validation_checkpoint(out: Path) -> ModelCheckpoint:
    """``out/checkpoints/last.ckpt`` after every validation, and only then: for a run whose validations decide what
    it keeps or when it stops (the synthetic stage's best weights and stopping rule). A checkpoint written at a
    validation's step but before it (``checkpoint_callbacks``'s, by steps or time) resumes past that validation,
    which Lightning counts as done, so the resumed run would never see it."""
    # One file, the newest, named as check_resumable looks for it (Lightning writes ``save_last``'s only beside a
    # top-k one).
    return OutDirCheckpoint(dirpath=out / "checkpoints", filename="last", save_top_k=1, save_on_train_epoch_end=False,
                            enable_version_counter=False)


def checkpoint_callbacks(out: Path, cfg: TrainerConfig, max_steps: int) -> list[ModelCheckpoint]:
    """``out/checkpoints/step*.ckpt`` every ``cfg.checkpoint_every_n_steps`` optimizer steps (0: at the end) and
    ``last.ckpt`` then, and ``last.ckpt`` every ``cfg.checkpoint_minutes`` of training too (Lightning's
    ``ModelCheckpoint`` takes a step or a time interval, not both: a second one writes only ``last.ckpt``; neither
    counts versions, which would make the other's ``last.ckpt`` a ``last-v1.ckpt``)."""
    every = cfg.checkpoint_every_n_steps or max_steps
    steps = OutDirCheckpoint(dirpath=out / "checkpoints", filename="step{step:06d}", save_last=True,
                             every_n_train_steps=every, save_top_k=-1, auto_insert_metric_name=False,
                             enable_version_counter=False)
    if not cfg.checkpoint_minutes:
        return [steps]
    return [steps, OutDirCheckpoint(dirpath=out / "checkpoints", save_last=True, save_top_k=0,
                                    train_time_interval=timedelta(minutes=cfg.checkpoint_minutes),
                                    enable_version_counter=False)]
