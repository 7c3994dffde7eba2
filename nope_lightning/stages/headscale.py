"""``headscale``: n_layer x n_head attention-temperature scalars tuned at ``target_len`` on a frozen model
(paper 001 §3.2, App. A), in one of two parameterizations (``parameterization=``, ``Parameterization``):
``lambda`` (HeadScale, the paper's) trains the per-head temperatures lambda^(h) (units of 1/sqrt(d));
``log`` (HeadScale-log) trains the slopes a_h of the per-query temperature ``max(1, 1 + a_h ln((i+1)/L))``
(``model/temperature.py``), which leaves every query inside L untouched; ``lambda_past`` (HeadScale past L)
trains the per-head lambda of the queries at positions >= L only (``temperature.past_only``: exactly 1 inside
L, so the tuned model is the untuned one bit for bit on every position < L and only the queries past L give
lambda a gradient), from the same init, under the same constraint and floors, on the same data as ``lambda``;
it needs a model with NoPE layers (``temperature.require_nope_layers``).

Hybrids (``model.layer_pattern`` / ``nope_every``): every layer's scalars train, RoPE layers' included (past L a
RoPE layer sees unseen rotations too; a head that needs no rescaling keeps its start), in the usual table shape.

Every weight of the exported model is frozen (``requires_grad=False``, so autograd computes no weight
gradient at all: the backward pass only propagates activation gradients down to the lowest trained scalar).
The scalars start from the scale-search's answer (``init=search``: the best uniform lambda at ``target_len``,
or its fit a), from the plain model (``init=default``: lambda 1, a 0; the ablation) or from a given number,
and train with ``CausalLM``'s AdamW + warm-up/cosine on ``target_len``-token windows of the pre-training
corpus (``seed`` differs from pre-training's, so the windows differ).

Constraints hold by **projection**: after every optimizer step the parameters are clamped in place
(``HeadScaleLM.optimizer_step``), so the next forward and AdamW continue from the bound at any lr. For lambda,
the focus constraint lambda >= 1 (paper Eq. 6); a parametrization was rejected (``1 + softplus(theta)`` never
equals 1, ``1 + theta^2`` has no gradient at theta = 0, so ``init=default`` could not move). ``constraint=false``
(the ablation) keeps lambda >= ``UNCONSTRAINED_FLOOR`` = 0.01, a positive temperature (the reference clamps at
0; lambda <= 0 is uniform or inverted attention, which ``evaluate`` refuses). For a, a >= 0: a negative slope is
the same model as 0, so that bound has no ablation.

Logged (MLflow run tagged ``stage=headscale``, under ``tracking.parent_run_id``): the config, ``train/loss``,
``train/lr``, ``headscale/lambda_{mean,min,max}`` (``headscale/a_…``) per step, ``val/len{T}/loss`` and ``…/ppl``;
artifacts ``headscale/lambda.safetensors`` + ``.json`` (``evaluate extension.temperature.table=runs:/<id>/…``),
``headscale/log_scale.*`` (``extension.temperature.log_slope_table=…``) or ``headscale/lambda_past.*`` (with
``extension.temperature.past_only=true``, which its metadata demands), ``headscale.json`` (table, init,
constraint, final val loss, entropies) and ``plots/entropy_vs_lambda.png`` (Fig 5).

Resume: ``out_dir`` (default ``mlruns/checkpoints/headscale/<name>``) holds ``checkpoints/``, ``config.yaml`` and
``mlflow_run_id``; a checkpoint holds the scalars, their AdamW state and the loop state (kilobytes at any model
size), and a rerun of a killed run continues its MLflow run and ends with bit-identical values.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import seed_everything

from nope_lightning.analysis.lengthgen import plots
from nope_lightning.config.parts import OptimConfig
from nope_lightning.config.stages import HeadScaleConfig
from nope_lightning.data.datamodule import PackedDataModule
from nope_lightning.data.prepare import PreparedData, prepare
from nope_lightning.data.retrieval import recipe_mix
from nope_lightning.eval.entropy import converged_entropy, validation_windows
from nope_lightning.model.checkpoint import LoadedModel, load_model
from nope_lightning.model.extension import best_temperature, fitted_slope, scale_search_for
from nope_lightning.model.gpt import GPT, count_parameters
from nope_lightning.model.temperature import (
    LOG_SLOPE,
    PER_HEAD,
    PER_HEAD_PAST,
    TableKind,
    require_nope_layers,
    save_table,
    set_log_slopes,
    set_past_only,
    set_temperatures,
    train_only,
)
from nope_lightning.results.headscale import CONVERGED_TAIL, ConvergedEntropy, HeadScaleResult
from nope_lightning.results.search import ScaleSearchResult
from nope_lightning.runtime import tracking
from nope_lightning.training.budget import check_target_len
from nope_lightning.training.module import (
    CausalLM,
    check_tokenizer,
    local_shard,
    trained_state,
)
from nope_lightning.training.trainer import ResumableFit, check_strategy, fit_result_keys, resumable_fit

CONSTRAINED_FLOOR = 1.0  # paper Eq. 6, lambda >= 1/sqrt(d), in our units of 1/sqrt(d)
UNCONSTRAINED_FLOOR = 0.01  # constraint=false: only keeps lambda a (positive) temperature
#: Sections that must match for a run to continue from the checkpoint in its out_dir.
RESUME_KEYS = ("checkpoint", "target_len", "init", "scale_search", "constraint", "parameterization", "data_mix",
               "steps", "batch_size", "seed", "optim")


@dataclass(frozen=True)
class Parameterization:
    """What HeadScale trains, as data: every layer's ``Temperature.<attribute>`` (n_head,), set with
    ``write(model, (n_layer, n_head) table)``, named ``symbol`` in metrics and ``headscale.json``, saved as
    a ``table`` file at ``table_file``; ``init=default`` is ``default_init``, ``init=search`` reads
    ``from_search(scale-search result, target_len, setting)``; the projection's bound is ``floors[0]``
    (``floors[1]`` with ``constraint=false``); ``axis``: Fig 5's y label; ``suffix`` ends default run names;
    ``past_only``: the scalars act on queries at positions >= L only (``Temperature.past_only``), in training, in
    the entropies of Fig 5 and in the table file's metadata."""

    attribute: str
    write: Callable[[torch.nn.Module, torch.Tensor], None]
    symbol: str
    table: TableKind
    table_file: str
    default_init: float
    from_search: Callable[[ScaleSearchResult, int, str], float]
    floors: tuple[float, float]
    axis: str
    suffix: str
    past_only: bool = False

    def floor(self, constraint: bool) -> float:
        return self.floors[0] if constraint else self.floors[1]


LAMBDA = Parameterization(attribute="per_head", write=set_temperatures, symbol="lambda", table=PER_HEAD,
                          table_file="headscale/lambda.safetensors", default_init=1.0, from_search=best_temperature,
                          floors=(CONSTRAINED_FLOOR, UNCONSTRAINED_FLOOR), axis="lambda (x 1/sqrt(d))", suffix="")
# constraint=false is refused for log (HeadScaleConfig), so both of its floors are a >= 0.
LOG = Parameterization(attribute="log_slope", write=set_log_slopes, symbol="a", table=LOG_SLOPE,
                       table_file="headscale/log_scale.safetensors", default_init=0.0,
                       from_search=lambda result, target_len, setting: fitted_slope(result, setting),
                       floors=(0.0, 0.0), axis="slope a", suffix="-log")
LAMBDA_PAST = dataclasses.replace(LAMBDA, table=PER_HEAD_PAST, table_file="headscale/lambda_past.safetensors",
                                  axis="lambda past L (x 1/sqrt(d))", suffix="-past", past_only=True)
PARAMETERIZATIONS = {"lambda": LAMBDA, "log": LOG, "lambda_past": LAMBDA_PAST}


def freeze_for_headscale(model: GPT, param: Parameterization) -> None:
    """Freeze every weight of ``model``; its layers' ``param.attribute`` tensors (already set) become the only
    trainable ones (asserted: n_layer * n_head trainable scalars)."""
    train_only(model, param.attribute)
    expected = model.cfg.n_layer * model.cfg.n_head
    trainable = count_parameters(model, trainable_only=True)
    assert trainable == expected, f"HeadScale trains {trainable} scalars, expected n_layer*n_head={expected}"


class HeadScaleLM(CausalLM):
    """``CausalLM`` on a frozen ``model`` whose ``param`` scalars are projected onto ``>= floor`` after every
    optimizer step (see the module docstring for why a projection)."""

    def __init__(self, model: GPT, param: Parameterization, optim: OptimConfig, max_steps: int, floor: float,
                 compile: bool = False) -> None:
        freeze_for_headscale(model, param)
        super().__init__(model, optim, max_steps, compile)
        self.param, self.floor = param, floor
        self.strict_loading = False  # checkpoints hold the trained scalars only (``on_save_checkpoint``)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Keep only the trained scalars: the frozen weights are the export's, so a checkpoint is kilobytes
        (the table, its AdamW moments, the loop state) whatever the model's size."""
        trainable = {f"model.{name}" for name in self.trainable_parameters()}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        self.project()
        self.log_dict(self.stats(), on_step=True, on_epoch=False)

    @torch.no_grad()
    def project(self) -> None:
        """Clamp the trained scalars in place (under FSDP each rank clamps its shard: clamping is elementwise)."""
        for scale in self.trainable_parameters().values():
            scale.clamp_(min=self.floor)

    @torch.no_grad()
    def stats(self) -> dict[str, torch.Tensor]:
        """Mean, min and max over all heads. Reduced over ranks, so it is right when FSDP shards the table
        (each rank holds a slice, possibly empty) and unchanged when every rank holds all of it."""
        local = torch.cat([local_shard(p).detach().float().flatten() for p in self.trainable_parameters().values()])
        inf = local.new_tensor([math.inf])
        stats = torch.stack([local.sum(), local.new_tensor(float(local.numel())),
                             torch.cat([local, inf]).min(), torch.cat([local, -inf]).max()])
        every = self.all_gather(stats).reshape(-1, 4)
        prefix = f"headscale/{self.param.symbol}"
        return {f"{prefix}_mean": every[:, 0].sum() / every[:, 1].sum(), f"{prefix}_min": every[:, 2].min(),
                f"{prefix}_max": every[:, 3].max()}


def initial_value(cfg: HeadScaleConfig, loaded: LoadedModel) -> float:
    """The uniform starting value of every trained scalar that ``cfg.init`` asks for (lambda in units of
    1/sqrt(d), or the slope a)."""
    param = PARAMETERIZATIONS[cfg.parameterization]
    if cfg.init == "default":
        return param.default_init
    if cfg.init != "search":
        return float(cfg.init)
    setting = f"scale_search={cfg.scale_search}"
    result = scale_search_for(cfg.scale_search, cfg.tracking, loaded.fingerprint, setting)
    return param.from_search(result, cfg.target_len, setting)


def default_name(cfg: HeadScaleConfig, loaded: LoadedModel) -> str:
    base = loaded.config.name or loaded.folder.parent.name
    init = cfg.init if cfg.init in ("search", "default") else f"{float(cfg.init):g}"
    return (f"headscale-{base}-L{cfg.target_len}-init{init}" + ("" if cfg.constraint else "-free")
            + PARAMETERIZATIONS[cfg.parameterization].suffix)


def checked_inputs(cfg: HeadScaleConfig) -> tuple[LoadedModel, PreparedData, float]:
    """The model, its prepared data and the initial value, after every check that needs no compute."""
    loaded = load_model(cfg.checkpoint, cfg.tracking)
    param = PARAMETERIZATIONS[cfg.parameterization]
    if param.past_only:
        require_nope_layers(loaded.model, f"parameterization={cfg.parameterization}")
    check_target_len(loaded.config, cfg.target_len)
    prepared = prepare(loaded.config.data)
    check_tokenizer(prepared, loaded)
    init, floor = initial_value(cfg, loaded), param.floor(cfg.constraint)
    if init < floor:
        raise ValueError(f"the initial {param.symbol} {init:g} is below the focus constraint {param.symbol} >= "
                         f"{floor:g}; use init >= {floor:g} or constraint=false")
    if cfg.seed == loaded.config.seed:
        warnings.warn(f"seed={cfg.seed} equals pre-training's: HeadScale's windows should be drawn with another "
                      f"seed (paper App. A)", stacklevel=2)
    return loaded, prepared, init


def run(cfg: HeadScaleConfig, callbacks: Sequence = ()) -> dict[str, Any]:
    """Tune the scalars; ``callbacks`` are extra Lightning callbacks (the Optuna pruner)."""
    check_strategy(cfg.trainer)
    loaded, prepared, init = checked_inputs(cfg)
    name = cfg.name or default_name(cfg, loaded)
    out = Path(cfg.out_dir or f"mlruns/checkpoints/headscale/{name}")
    with resumable_fit(out, cfg, RESUME_KEYS) as resumable:
        return train(cfg, resumable, callbacks, loaded, prepared, init, name)


def train(cfg: HeadScaleConfig, resumable: ResumableFit, callbacks: Sequence, loaded: LoadedModel,
          prepared: PreparedData, init: float, name: str) -> dict[str, Any]:
    """Train into ``resumable.out``, resuming its last checkpoint (the same values, AdamW moments, schedule and
    data position) when a killed run of the same config left one."""
    model, param = loaded.model, PARAMETERIZATIONS[cfg.parameterization]
    seed_everything(cfg.seed, workers=True, verbose=False)
    param.write(model, torch.full((model.cfg.n_layer, model.cfg.n_head), init))
    set_past_only(model, param.past_only)
    module = HeadScaleLM(model, param, cfg.optim, cfg.steps, param.floor(cfg.constraint), cfg.trainer.compile)
    mix = recipe_mix(prepared.tokenizer, loaded.config.retrieval, cfg.target_len) if cfg.data_mix == "recipe" else None
    data = PackedDataModule(prepared, cfg.target_len, cfg.batch_size, cfg.seed, cfg.trainer.val_batches,
                            loaded.config.data.num_workers, mix)
    trainer = resumable.fit(module, data, stage="headscale", name=name, max_steps=cfg.steps, callbacks=callbacks,
                            metrics=lambda _: {f"headscale/init_{param.symbol}": init,
                                               "headscale/trainable_parameters": count_parameters(model, True)})
    out, run_id = resumable.out, trainer.logger.run_id
    monitor = f"val/len{cfg.target_len}/loss"
    if monitor not in trainer.callback_metrics:  # resumed at the last step: killed during the final validation
        trainer.validate(module, datamodule=data, verbose=False)
    state = trained_state(trainer)
    if not trainer.is_global_zero:
        return {}
    names = [f"transformer.h.{i}.attn.temperature.{param.attribute}" for i in range(model.cfg.n_layer)]
    table = torch.stack([state[name].float().cpu() for name in names])
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    summary = HeadScaleResult(
        cfg.checkpoint, loaded.fingerprint, loaded.config.train_len, cfg.target_len, param.table.units, param.symbol,
        cfg.init, init, cfg.scale_search, cfg.constraint, module.floor, trainer.global_step, cfg.data_mix,
        mix.fraction if mix else 0.0, metrics[monitor], param.table.key, table.tolist())
    log_outputs(cfg, run_id, loaded, prepared, summary, out / param.table_file, trainer.strategy.root_device)
    return {"run_id": run_id, "out_dir": str(out), "table": str(out / param.table_file),
            "step": trainer.global_step, "world_size": trainer.world_size, f"init_{param.symbol}": init, **metrics}


def log_outputs(cfg: HeadScaleConfig, run_id: str, loaded: LoadedModel, prepared: PreparedData,
                summary: HeadScaleResult, path: Path, device: torch.device) -> None:
    """Save the learned table (``summary.table``) at ``path`` and log it, the Fig 5 plot (entropies of the model
    reloaded with that table file, as ``evaluate`` loads one) and ``headscale.json``."""
    param = PARAMETERIZATIONS[cfg.parameterization]
    table = torch.tensor(summary.table)
    metadata = {"checkpoint": cfg.checkpoint, "target_len": cfg.target_len,
                "model_fingerprint": summary.model_fingerprint, **({"past_only": "true"} if param.past_only else {})}
    save_table(path, table, metadata, param.table)
    tracking.log_artifacts(cfg.tracking, run_id, path.parent, "headscale")
    if cfg.entropy_windows:
        temperature = dataclasses.replace(loaded.config.model.temperature, **{param.table.field: str(path)},
                                          past_only=param.past_only)
        tuned = load_model(str(loaded.folder), cfg.tracking, temperature=temperature).model
        entropy, last = converged_entropy(tuned.to(device).eval(),
                                          validation_windows(prepared, cfg.target_len, cfg.entropy_windows))
        summary = dataclasses.replace(summary, converged_entropy=ConvergedEntropy(
            "nats", entropy.tolist(), f"last 1/{CONVERGED_TAIL} of {cfg.target_len}", last.tolist()))
        figure = plots.learned_vs_entropy(entropy.numpy(), table.numpy(), cfg.target_len, param.axis,
                                          param.floors[0])
        tracking.log_figure(cfg.tracking, run_id, figure, "plots/entropy_vs_lambda.png")
    tracking.log_json(cfg.tracking, run_id, summary.to_dict(), "headscale.json")


# --- declared results: the registry's ``Stage.results`` (what a later step may reference; the dry run) ---


def result_keys(cfg: HeadScaleConfig, train_len: int | None = None) -> dict[str, type]:
    """What ``train`` returns on rank 0: the fit's results at ``target_len``, the table's file, the initial value
    and the learned table's mean, min and max (lambda, or the log slope a)."""
    symbol = PARAMETERIZATIONS[cfg.parameterization].symbol
    return {**fit_result_keys(cfg.target_len), "table": str, f"init_{symbol}": float,
            **{f"headscale/{symbol}_{s}": float for s in ("mean", "min", "max")}}
