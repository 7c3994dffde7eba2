"""``headscale``: per-head softmax temperatures lambda^(h) tuned at ``target_len`` on a frozen model (paper 001
§3.2, App. A).

Every weight of the exported model is frozen (``requires_grad=False``, so autograd computes no weight
gradient at all: the backward pass only propagates activation gradients down to the lowest lambda); the
only trainable tensors are the attention layers' ``head_scale`` (n_head,) parameters, n_layer x n_head
scalars in units of 1/sqrt(d), folded into q. They start from the best uniform lambda of a scale-search
(``init=search``), from 1.0 (``init=default``, the ablation) or from a given number, and are trained with
``CausalLM``'s AdamW + warm-up/cosine on windows of ``target_len`` tokens from the pre-training corpus
(``seed`` differs from pre-training's, so the windows differ).

Focus constraint lambda >= 1 (paper Eq. 6), enforced by **projection**: after every optimizer step the
parameters are clamped in place (``HeadScaleLM.optimizer_step``). The clamped tensor is both what the next
forward multiplies into q and what AdamW continues from, so the constraint holds exactly in both, whatever
the lr (a step to -1e3 lands on 1.0). This is projected gradient descent. A parametrization was rejected:
``1 + softplus(theta)`` can never equal 1, so neither ``init=default`` nor a head that wants the bound can
be represented, and ``1 + theta^2`` has zero gradient at theta = 0, so ``init=default`` would never move.
With ``constraint=false`` (the ablation) the same projection keeps lambda >= ``UNCONSTRAINED_FLOOR`` = 0.01:
a temperature must stay positive (lambda = 0 is uniform attention, lambda < 0 inverts every head's
preferences, and ``evaluate`` refuses such a table); the reference ablation clamps at 0, which allows 0.

Logged (MLflow run tagged ``stage=headscale``, nested under ``tracking.parent_run_id``): the config,
``train/loss``, ``train/lr``, ``headscale/lambda_{mean,min,max}`` per step, ``val/len{T}/loss`` and
``…/ppl`` (every ``trainer.val_every_n_steps``; 0: at the end); artifacts ``headscale/lambda.safetensors``
+ ``.json`` (``evaluate extension.temperature_table=runs:/<id>/headscale/lambda.safetensors``),
``headscale.json`` (table, init, constraint, final val loss, entropies) and ``plots/entropy_vs_lambda.png``
(Fig 5). ``parameterization=log`` (HeadScale-log, ``headscale_log.py``) trains per-head slopes a of a per-query
temperature instead, the same way, saved as ``headscale/log_scale.safetensors``.

Resume: ``out_dir`` (default ``mlruns/checkpoints/headscale/<name>``) holds ``checkpoints/`` (``step*.ckpt``
every ``trainer.checkpoint_every_n_steps`` and ``last.ckpt``), ``config.yaml`` and ``mlflow_run_id``. A
checkpoint holds the temperatures, their AdamW state and the loop state, not the frozen weights (the export
has them), so it is kilobytes at any model size. A rerun of a killed run with the same config continues its
MLflow run from ``last.ckpt`` and ends with bit-identical temperatures.

Strategies: one device and DDP skip every weight gradient. FSDP (GPU) runs, but FSDP1 with
``use_orig_params=True`` flattens each block's frozen weights together with its lambdas into one flat
parameter that requires grad, so torch computes (and discards) the frozen weights' gradients there.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from nope_lightning import tracking
from nope_lightning.checkpoint import LoadedModel, load_model
from nope_lightning.config import HeadScaleConfig, OptimConfig
from nope_lightning.model import GPT, count_parameters, set_head_scales
from nope_lightning.model.attention import TABLE_KINDS, save_temperature_table
from nope_lightning.stages.lm import (
    CausalLM,
    check_resumable,
    check_target_len,
    check_tokenizer,
    checkpoint_callback,
    local_shard,
    out_dir_lock,
    record_run,
    resumed_run_id,
    trained_state,
)

if TYPE_CHECKING:
    from nope_lightning.data import PreparedData

CONSTRAINED_FLOOR = 1.0  # paper Eq. 6, lambda >= 1/sqrt(d), in our units of 1/sqrt(d)
UNCONSTRAINED_FLOOR = 0.01  # constraint=false: only keeps lambda a (positive) temperature
ENTROPY_CHUNK = 256  # query rows per entropy step (memory ~ 3 * H * chunk * T floats)
CONVERGED_TAIL = 8  # "converged" entropy: mean over the last 1/8 of the target_len positions
TABLE_FILE = "headscale/lambda.safetensors"
#: Sections that must match for a run to continue from the checkpoint in its out_dir.
RESUME_KEYS = ("checkpoint", "target_len", "init", "scale_search", "constraint", "parameterization", "steps",
               "batch_size", "seed", "optim")


def lambda_floor(constraint: bool) -> float:
    """The projection's lower bound on lambda (units of 1/sqrt(d))."""
    return CONSTRAINED_FLOOR if constraint else UNCONSTRAINED_FLOOR


def freeze_for_headscale(model: GPT) -> None:
    """Freeze every weight of ``model``; its n_layer ``head_scale`` (n_head,) tensors become the only
    trainable ones (asserted: n_layer * n_head trainable scalars)."""
    model.requires_grad_(False)
    for attn in model.attention_layers:
        attn.head_scale.requires_grad_(True)
    expected = model.cfg.n_layer * model.cfg.n_head
    trainable = count_parameters(model, trainable_only=True)
    assert trainable == expected, f"HeadScale trains {trainable} scalars, expected n_layer*n_head={expected}"


class HeadScaleLM(CausalLM):
    """``CausalLM`` on a frozen ``model`` whose temperatures are projected onto lambda >= ``floor`` after
    every optimizer step (see the module docstring for why a projection)."""

    def __init__(self, model: GPT, optim: OptimConfig, max_steps: int, floor: float, compile: bool = False) -> None:
        freeze_for_headscale(model)
        super().__init__(model, optim, max_steps, compile)
        self.floor = floor
        self.strict_loading = False  # checkpoints hold the temperatures only (``on_save_checkpoint``)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Keep only the trainable temperatures: the frozen weights are the export's, so a checkpoint is
        kilobytes (the λ table, its AdamW moments, the loop state) whatever the model's size."""
        trainable = {f"model.{name}" for name in self.trainable_parameters()}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        self.project()
        self.log_dict(self.lambda_stats(), on_step=True, on_epoch=False)

    @torch.no_grad()
    def project(self) -> None:
        """Clamp the temperatures in place (under FSDP each rank clamps its shard: clamping is elementwise)."""
        for scale in self.trainable_parameters().values():
            scale.clamp_(min=self.floor)

    @torch.no_grad()
    def lambda_stats(self) -> dict[str, torch.Tensor]:
        """Mean, min and max lambda over all heads. Reduced over ranks, so it is right when FSDP shards the
        table (each rank holds a slice, possibly empty) and unchanged when every rank holds all of it."""
        local = torch.cat([local_shard(p).detach().float().flatten() for p in self.trainable_parameters().values()])
        inf = local.new_tensor([math.inf])
        stats = torch.stack([local.sum(), local.new_tensor(float(local.numel())),
                             torch.cat([local, inf]).min(), torch.cat([local, -inf]).max()])
        every = self.all_gather(stats).reshape(-1, 4)
        return {"headscale/lambda_mean": every[:, 0].sum() / every[:, 1].sum(),
                "headscale/lambda_min": every[:, 2].min(), "headscale/lambda_max": every[:, 3].max()}


# --- checks and inputs --------------------------------------------------------------------------------


def best_uniform_lambda(result: dict, fingerprint: str, target_len: int, ref: str) -> float:
    """The best uniform lambda at ``target_len`` of a scale-search ``result``, for the model ``fingerprint``."""
    if result.get("model_fingerprint") != fingerprint:
        raise ValueError(f"scale_search={ref} was run on another model (fingerprint "
                         f"{str(result.get('model_fingerprint'))[:12]}, this checkpoint is {fingerprint[:12]}); "
                         f"run scale-search on this checkpoint")
    best = result.get("best", {})
    if str(target_len) not in best:
        raise ValueError(f"scale_search={ref} has no result for target_len={target_len} (it has "
                         f"{sorted(best, key=int)}); run scale-search with target_lengths including {target_len}")
    return float(best[str(target_len)])


def initial_lambda(cfg: HeadScaleConfig, loaded: LoadedModel) -> float:
    """The uniform starting temperature (units of 1/sqrt(d)) that ``cfg.init`` asks for."""
    if cfg.init == "default":
        return 1.0
    if cfg.init != "search":
        return float(cfg.init)
    from nope_lightning.stages.scale_search import load_result

    return best_uniform_lambda(load_result(cfg.scale_search, cfg.tracking), loaded.fingerprint, cfg.target_len,
                               cfg.scale_search)


def validation_windows(prepared: PreparedData, length: int, count: int) -> torch.Tensor:
    """The first ``count`` contiguous (length + 1)-token windows of the val split (the validation loader's
    first windows): int64 (count', length + 1), count' <= count when the split is short."""
    tokens = prepared.tokens("val")
    count = min(count, len(tokens) // (length + 1))
    return torch.from_numpy(np.asarray(tokens[:count * (length + 1)], dtype=np.int64).reshape(count, length + 1))


# --- training -----------------------------------------------------------------------------------------


def default_name(cfg: HeadScaleConfig, loaded: LoadedModel) -> str:
    base = loaded.config.name or loaded.folder.parent.name
    init = cfg.init if cfg.init in ("search", "default") else f"{float(cfg.init):g}"
    return (f"headscale-{base}-L{cfg.target_len}-init{init}" + ("" if cfg.constraint else "-free")
            + ("-log" if cfg.parameterization == "log" else ""))


def checked_inputs(cfg: HeadScaleConfig) -> tuple[LoadedModel, PreparedData, float]:
    """The model, its prepared data and the initial lambda, after every check that needs no compute."""
    from nope_lightning.data import prepare

    loaded = load_model(cfg.checkpoint, cfg.tracking)
    check_target_len(loaded.config, cfg.target_len)
    prepared = prepare(loaded.config.data)
    check_tokenizer(prepared, loaded)
    if cfg.parameterization == "log":
        from nope_lightning.stages.headscale_log import SLOPE_FLOOR, initial_slope

        init, floor = initial_slope(cfg, loaded), SLOPE_FLOOR
    else:
        init, floor = initial_lambda(cfg, loaded), lambda_floor(cfg.constraint)
    if init < floor:
        raise ValueError(f"the initial lambda {init:g} is below the focus constraint lambda >= {floor:g}; "
                         f"use init >= {floor:g} or constraint=false")
    if cfg.seed == loaded.config.seed:
        warnings.warn(f"seed={cfg.seed} equals pre-training's: HeadScale's windows should be drawn with another "
                      f"seed (paper App. A)", stacklevel=2)
    return loaded, prepared, init


def run(cfg: HeadScaleConfig, callbacks: Sequence = ()) -> dict[str, Any]:
    """Tune the temperatures; ``callbacks`` are extra Lightning callbacks (the Optuna pruner)."""
    from nope_lightning.run import check_strategy

    check_strategy(cfg.trainer)
    loaded, prepared, init = checked_inputs(cfg)
    name = cfg.name or default_name(cfg, loaded)
    out = Path(cfg.out_dir or f"mlruns/checkpoints/headscale/{name}")
    with out_dir_lock(out):
        return train(cfg, callbacks, loaded, prepared, init, name, out)


def train(cfg: HeadScaleConfig, callbacks: Sequence, loaded: LoadedModel, prepared: PreparedData, init: float,
          name: str, out: Path) -> dict[str, Any]:
    """Train into ``out``, resuming its last checkpoint (the same λ, AdamW moments, schedule and data
    position) when a killed run of the same config left one."""
    from lightning.pytorch import seed_everything
    from lightning.pytorch.utilities import rank_zero_only

    from nope_lightning.data import PackedDataModule
    from nope_lightning.run import build_trainer

    resume_from = check_resumable(out, cfg, RESUME_KEYS)
    run_id = resumed_run_id(out, cfg, resume_from)
    model, log = loaded.model, cfg.parameterization == "log"
    seed_everything(cfg.seed, workers=True, verbose=False)
    if log:
        from nope_lightning.stages import headscale_log

        module = headscale_log.start(model, init, cfg)
        key, state_key, table_file, symbol = "log_scale", headscale_log.STATE_KEY, headscale_log.TABLE_FILE, "a"
    else:
        set_head_scales(model, torch.full((model.cfg.n_layer, model.cfg.n_head), init))
        module = HeadScaleLM(model, cfg.optim, cfg.steps, lambda_floor(cfg.constraint), cfg.trainer.compile)
        key, state_key, table_file, symbol = "head_scale", "transformer.h.{}.attn.head_scale", TABLE_FILE, "lambda"
    data = PackedDataModule(prepared, cfg.target_len, cfg.batch_size, cfg.seed, cfg.trainer.val_batches,
                            loaded.config.data.num_workers)
    logger = tracking.lightning_logger(cfg.tracking, "headscale", name, run_id)
    if rank_zero_only.rank == 0:
        record_run(out, cfg, logger.run_id)
        if run_id is None:
            tracking.log_config(cfg.tracking, logger.run_id, cfg)
            tracking.log_metrics(cfg.tracking, logger.run_id, {
                f"headscale/init_{symbol}": init, "headscale/trainable_parameters": count_parameters(model, True)})

    checkpoints = checkpoint_callback(out, cfg.trainer.checkpoint_every_n_steps, cfg.steps)
    trainer = build_trainer(cfg.trainer, logger=logger, callbacks=[*callbacks, checkpoints],
                            default_root_dir=str(out), grad_clip=cfg.optim.grad_clip, max_steps=cfg.steps)
    trainer.fit(module, datamodule=data, ckpt_path=resume_from, weights_only=True)
    monitor = f"val/len{cfg.target_len}/loss"
    if monitor not in trainer.callback_metrics:  # resumed at the last step: killed during the final validation
        trainer.validate(module, datamodule=data, verbose=False)
    state = trained_state(trainer)
    if not trainer.is_global_zero:
        return {}
    table = torch.stack([state[state_key.format(i)].float().cpu() for i in range(model.cfg.n_layer)])
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    summary = {"checkpoint": cfg.checkpoint, "model_fingerprint": loaded.fingerprint,
               "train_len": loaded.config.train_len, "target_len": cfg.target_len, "units": TABLE_KINDS[key][1],
               "init": {"mode": cfg.init, symbol: init, "scale_search": cfg.scale_search},
               "constraint": cfg.constraint, f"{symbol}_floor": module.floor, "steps": trainer.global_step,
               "val_loss": metrics[monitor], key: table.tolist()}
    log_outputs(cfg, logger.run_id, loaded, prepared, summary, out / table_file, trainer.strategy.root_device)
    return {"run_id": logger.run_id, "out_dir": str(out), "table": str(out / table_file),
            "step": trainer.global_step, "world_size": trainer.world_size, f"init_{symbol}": init, **metrics}


# --- outputs ------------------------------------------------------------------------------------------


def log_outputs(cfg: HeadScaleConfig, run_id: str, loaded: LoadedModel, prepared: PreparedData, summary: dict,
                path: Path, device: torch.device) -> None:
    """Save the table (``summary["head_scale"]``, or ``["log_scale"]`` for HeadScale-log) at ``path`` and log
    it, the Fig 5 plot (entropies of the model reloaded the way ``evaluate`` loads a table) and
    ``headscale.json``."""
    log = cfg.parameterization == "log"
    key = "log_scale" if log else "head_scale"
    table = torch.tensor(summary[key])
    save_temperature_table(path, table, {"checkpoint": cfg.checkpoint, "target_len": cfg.target_len,
                                         "model_fingerprint": summary["model_fingerprint"]}, key=key)
    tracking.log_artifacts(cfg.tracking, run_id, path.parent, "headscale")
    if cfg.entropy_windows:
        setting = {("log_scale_table" if log else "temperature_table"): str(path)}
        tuned = load_model(str(loaded.folder), cfg.tracking, **setting).model.to(device).eval()
        entropy = converged_entropy(tuned, validation_windows(prepared, cfg.target_len, cfg.entropy_windows))
        summary["converged_entropy"] = {"unit": "nats", "per_head": entropy.tolist(),
                                        "positions": f"last 1/{CONVERGED_TAIL} of {cfg.target_len}"}
        figure = entropy_vs_lambda_figure(entropy.numpy(), table.numpy(), cfg.target_len,
                                          *(("slope a", 0.0) if log else ()))
        tracking.log_figure(cfg.tracking, run_id, figure, "plots/entropy_vs_lambda.png")
    tracking.log_json(cfg.tracking, run_id, summary, "headscale.json")


@torch.no_grad()
def converged_entropy(model: GPT, windows: torch.Tensor) -> torch.Tensor:
    """Attention entropy (nats) per head averaged over ``windows`` and the last 1/``CONVERGED_TAIL`` of their
    positions: (n_layer, n_head) float32. ``windows`` (N, T + 1) token ids; the inputs are ``[:, :-1]``."""
    from nope_lightning.eval.perplexity import mask_bias
    from nope_lightning.metrics import attention_entropy_from_qk
    from nope_lightning.model.probes import attention_probe

    length = windows.size(1) - 1
    sums = torch.zeros(model.cfg.n_layer, model.cfg.n_head, length, dtype=torch.float64)

    def accumulate(layer: int, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> None:
        # The probe's q already carries lambda and 1/sqrt(d): its softmax multiplier is 1.
        sums[layer] += attention_entropy_from_qk(q, k, 1.0, ENTROPY_CHUNK, mask_bias(mask)).sum(0).double().cpu()

    device = next(model.parameters()).device
    with attention_probe(model, accumulate):
        for window in windows:  # one window at a time bounds activation memory at long target lengths
            model(window[None, :-1].to(device))
    tail = max(1, length // CONVERGED_TAIL)
    return (sums[..., -tail:].mean(-1) / len(windows)).float()


def entropy_vs_lambda_figure(entropy: np.ndarray, table: np.ndarray, target_len: int,
                             what: str = "lambda (x 1/sqrt(d))", floor: float = 1.0):
    """Fig 5 style: learned ``what`` (y: lambda in units of 1/sqrt(d), or HeadScale-log's slope a) against
    converged entropy (x, nats) per head, one colour per layer, a dotted line at ``floor``. ``entropy`` and
    ``table`` are (n_layer, n_head)."""
    from nope_lightning.eval.plots import plt  # pyplot with the headless backend selected

    n_layer = table.shape[0]
    colours = plt.get_cmap("viridis")(np.linspace(0, 1, n_layer))
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for layer in range(n_layer):
        ax.scatter(entropy[layer], table[layer], color=colours[layer], label=f"layer {layer}", s=18)
    ax.axhline(floor, color="gray", linestyle=":", linewidth=1)
    ax.set_xlabel(f"converged attention entropy at {target_len} (nats)")
    ax.set_ylabel(f"learned {what}")
    ax.set_title(f"HeadScale at {target_len}: per-head {what.split(' (')[0]} vs entropy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=max(1, n_layer // 8))
    fig.tight_layout()
    return fig

