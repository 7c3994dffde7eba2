"""``scale-search``: which uniform temperature lambda (units of 1/sqrt(d)) a model reads best at each target
length (paper 001 §3.1, Fig 2 and Fig 7).

An Optuna study (GridSampler over the lambda grid by default) whose trial at lambda is exactly
``nope-lightning run evaluate checkpoint=… extension.temperature.uniform=lambda eval_lengths=[targets] …`` — run
through ``run_stage`` as a nested MLflow run, its command line stored on the trial so it can be replayed.
Trials score the **validation** split (``evaluate split=val``): the lambda chosen here is reported on test
data by later ``evaluate`` runs, never chosen on it. The objective is the mean validation log-PPL over the
target lengths; each length's log-PPL is a trial
attribute, so the best lambda per length comes from the same trials. Per-position log-PPL at the
longest target gives the best lambda per position bucket and the fit ``lambda = 1 + a ln(i / L)``.

Output (parent MLflow run): ``scale_search.json`` (the input of HeadScale's ``init=search``), the Fig 7
plot, and metrics ``scale_search/len{L}/best_lambda``, ``…/best_logppl``, ``scale_search/fit_a``,
``scale_search/fit_r2``.

``parameter=irope_beta`` runs the same search over iRoPE's beta (``extension.temperature.irope_beta``, on the
NoPE layers of a hybrid or NoPE model): trials, selection and intervals are the same; the result's units
say beta (``extension.BETA_UNITS``, so no lambda reader takes it), its metric is ``…/best_beta`` and it has
no log fit (``lambda = 1 + a ln s`` is a law about lambda).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import optuna

from nope_lightning.analysis.lengthgen import plots
from nope_lightning.analysis.lengthgen.log_law import best_on_grid, fit_log_scale, position_fit_units
from nope_lightning.config.core import flatten, to_dict
from nope_lightning.config.parts import AttentionTemperature
from nope_lightning.config.stages import EvaluateConfig, ExtensionConfig, ScaleSearchConfig
from nope_lightning.model.checkpoint import load_model
from nope_lightning.model.extension import BETA_UNITS
from nope_lightning.numerics.stats import block_size, blocks, bootstrap
from nope_lightning.results.evaluation import EvaluationResult
from nope_lightning.results.search import (
    LogFit,
    PositionBest,
    ScaleSearchResult,
    SearchSamples,
    SearchTrial,
    SelectionIntervals,
)
from nope_lightning.runtime import tracking
from nope_lightning.runtime.search import model_label, open_study, study_name
from nope_lightning.stages.registry import run_stage
from nope_lightning.training.budget import check_target_len


def symbol(cfg: ScaleSearchConfig) -> str:
    """The searched value's name: its Optuna parameter (lambda's name predates beta: stored studies resume by
    it) and metric suffix."""
    return "lambda" if cfg.parameter == "lambda" else "beta"


def trial_temperature(cfg: ScaleSearchConfig, value: float) -> AttentionTemperature:
    """The temperature of the trial at ``value``: a uniform lambda, or iRoPE's beta at ``cfg.irope_floor``."""
    if cfg.parameter == "lambda":
        return AttentionTemperature(uniform=value)
    return AttentionTemperature(irope_beta=value, irope_floor=cfg.irope_floor)


def trial_config(cfg: ScaleSearchConfig, temperature: float, parent_run_id: str, number: int) -> EvaluateConfig:
    """The ``evaluate`` config of the trial at ``temperature`` (lambda or beta): perplexity and per-position
    curves only."""
    short = "lam" if cfg.parameter == "lambda" else "beta"
    return EvaluateConfig(
        checkpoint=cfg.checkpoint, extension=ExtensionConfig(temperature=trial_temperature(cfg, temperature)),
        tracking=dataclasses.replace(cfg.tracking, parent_run_id=parent_run_id, run_name=""),
        trainer=cfg.trainer, split="val", eval_lengths=list(cfg.target_lengths), stride=cfg.stride,
        ppl_tokens=cfg.ppl_tokens,
        batch_size=cfg.batch_size, position_windows=cfg.position_windows, position_buckets=cfg.position_buckets,
        entropy=False, bootstrap=cfg.bootstrap, passkey_keys=0, longctx_samples=0, seed=cfg.seed, plots=False,
        name=f"scale-search-trial{number}-{short}{temperature:g}")


def replay_command(cfg: EvaluateConfig) -> str:
    """The shell command that reruns a trial (the overrides that differ from evaluate's defaults)."""
    defaults = flatten(to_dict(EvaluateConfig(checkpoint=cfg.checkpoint)))
    changed = {k: v for k, v in flatten(to_dict(cfg)).items()
               if defaults.get(k) != v and not k.startswith("tracking.parent") and k != "name"}
    args = " ".join(f"{k}={str(v).replace(' ', '')}" for k, v in changed.items())
    return f"nope-lightning run evaluate checkpoint={cfg.checkpoint} {args}".strip()


def run(cfg: ScaleSearchConfig) -> dict[str, Any]:
    grid, param = cfg.lambdas, symbol(cfg)
    # Loaded under the grid's largest temperature: a beta on a model without NoPE layers fails here, in one line.
    loaded = load_model(cfg.checkpoint, cfg.tracking, temperature=trial_temperature(cfg, max(grid)))
    train_len, fingerprint = loaded.config.train_len, loaded.fingerprint
    for length in cfg.target_lengths:
        check_target_len(loaded.config, length)
    settings = {"model": fingerprint, "split": "val", "targets": sorted(cfg.target_lengths), "grid": grid,
                "sampler": cfg.sampler, **({} if param == "lambda" else {"irope_floor": cfg.irope_floor}),
                "stride": cfg.stride, "ppl_tokens": cfg.ppl_tokens, "buckets": cfg.position_buckets}
    targets = ",".join(map(str, sorted(cfg.target_lengths)))
    name = cfg.study_name or study_name(
        model_label(loaded), f"scale-search L{train_len}->{targets} {cfg.sampler} {param} {min(grid):g}-"
        f"{max(grid):g}", settings)
    sampler = (optuna.samplers.GridSampler({param: grid}, seed=cfg.seed) if cfg.sampler == "grid"
               else optuna.samplers.TPESampler(seed=cfg.seed))
    study = open_study(name, cfg.storage, sampler)
    study.set_metric_names(["val log-PPL (mean over target lengths)"])
    parent = study.user_attrs.get("mlflow_run_id")
    if parent is None:  # first start of this study: its MLflow parent run, reused on resume
        parent = tracking.create_run(cfg.tracking, "scale-search", cfg.name or name, cfg)
        study.set_user_attr("mlflow_run_id", parent)

    def objective(trial: optuna.Trial) -> float:
        temperature = round(trial.suggest_float(param, min(grid), max(grid),
                                                step=None if cfg.sampler == "grid" else cfg.grid_step), 6)
        eval_cfg = trial_config(cfg, temperature, parent, trial.number)
        trial.set_user_attr("command", replay_command(eval_cfg))
        result = run_stage("evaluate", eval_cfg)
        trial.set_user_attr("evaluate_run_id", result["run_id"])
        logppl = {n: result[f"val/len{n}/loss"] for n in cfg.target_lengths}
        trial.set_user_attr("logppl", {str(n): v for n, v in logppl.items()})
        return sum(logppl.values()) / len(logppl)

    # num_trials caps the study's total (0: the whole grid), so a resumed search runs only what is left.
    done = {round(t.params[param], 6) for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))}
    total = min(len(grid), cfg.num_trials or len(grid)) if cfg.sampler == "grid" else cfg.num_trials or len(grid)
    if total > len(done):
        study.optimize(objective, n_trials=total - len(done), show_progress_bar=cfg.trainer.progress_bar)
    return summarize(cfg, study, parent, train_len, fingerprint)


def trial_samples(cfg: ScaleSearchConfig, trials: list) -> SearchSamples:
    """The per-window data of every trial (its ``evaluate`` result, all on the same validation windows)."""
    results = [EvaluationResult.load(tracking.download(cfg.tracking, t.user_attrs["evaluate_run_id"], "results.json"))
               for t in trials]
    corpus = results[0].corpora[0]
    windows = results[0].windows[corpus]
    return SearchSamples(windows.doc, results[0].position.edges,
                         {n: [r.windows[corpus].rows[n] for r in results] for n in cfg.target_lengths},
                         [r.position.logppl[corpus].windows for r in results])


def selection_intervals(samples: SearchSamples, grid: list[float], train_len: int, resamples: int,
                        seed: int, with_fit: bool = True) -> SelectionIntervals:
    """95 % bootstrap intervals of the selection: the best temperature per target (resampling blocks of
    validation windows, every trial on the same resample: paired) and, ``with_fit``, the fit a / R^2
    (resampling position windows). ``grid``: the trials' temperatures, in trial order."""
    temperatures = np.asarray(grid)
    doc = np.asarray(samples.doc)
    best = {}
    for n, rows in samples.windows.items():
        table = np.concatenate([np.asarray(r) for r in rows], axis=1)  # (windows, trials * 2)
        units = blocks(table, doc, block_size(len(table)))
        interval = bootstrap([units], lambda s: best_on_grid(s[:, 0, 0::2] / s[:, 0, 1::2], temperatures), resamples,
                             seed)
        best[n] = (interval.low, interval.high)
    if not with_fit:
        return SelectionIntervals(best)
    try:
        units, fit = position_fit_units(samples.edges, samples.position, temperatures, train_len)
    except ValueError:
        return SelectionIntervals(best)
    a, r2 = (bootstrap([units], lambda s, i=i: fit(s)[i], resamples, seed) for i in (0, 1))
    return SelectionIntervals(best, (a.low, a.high), (r2.low, r2.high))


def summarize(cfg: ScaleSearchConfig, study, parent: str, train_len: int, fingerprint: str) -> dict[str, Any]:
    """Best lambda (beta) per target and per position bucket with their bootstrap intervals, the log fit
    (lambda only), the JSON artifact and the Fig 7 plot."""
    param = symbol(cfg)
    trials = {}
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        trials[round(t.params[param], 6)] = t  # duplicates (concurrent workers) keep the last
    if not trials:
        raise ValueError(f"study {study.study_name} has no completed trial yet")
    ordered = [trials[temperature] for temperature in sorted(trials)]
    # The trials' validation log-PPL per target, as each trial stored it (an Optuna attribute: string keys).
    runs = [SearchTrial(t.params[param], {int(n): v for n, v in t.user_attrs["logppl"].items()},
                        t.user_attrs.get("evaluate_run_id"), t.user_attrs.get("command")) for t in ordered]
    best = {n: min(runs, key=lambda t: t.logppl[n]).temperature for n in cfg.target_lengths}
    samples = trial_samples(cfg, ordered)
    temperatures = [t.temperature for t in runs]
    edges = samples.edges
    centers = [(a + b - 1) / 2 for a, b in zip(edges[:-1], edges[1:], strict=True)]
    curves = np.asarray(samples.position).sum(1) / (len(samples.position[0]) * np.diff(edges))
    per_bucket = [PositionBest(c, c / train_len, temperatures[int(np.argmin(curves[:, b]))])
                  for b, c in enumerate(centers) if c > train_len]
    fit = LogFit()
    if len(per_bucket) >= 2 and param == "lambda":
        fit = LogFit(*fit_log_scale([p.s for p in per_bucket], [p.temperature for p in per_bucket]))
    # An optimum on the grid's edge may lie beyond it: the report flags it rather than trusting the value.
    grid = (min(cfg.lambdas), max(cfg.lambdas))
    on_edge = {n: temperature in grid for n, temperature in best.items()}
    summary = ScaleSearchResult(
        train_len, best, study.study_name, fingerprint, "val", cfg.checkpoint,
        "1/sqrt(head_size)" if param == "lambda" else BETA_UNITS, grid, on_edge,
        {n: min(t.logppl[n] for t in runs) for n in cfg.target_lengths}, per_bucket, fit,
        selection_intervals(samples, temperatures, train_len, cfg.bootstrap, cfg.seed, param == "lambda"), samples,
        runs)
    metrics = {f"scale_search/len{n}/best_{param}": best[n] for n in cfg.target_lengths}
    metrics.update({f"scale_search/len{n}/best_logppl": summary.best_logppl[n] for n in cfg.target_lengths})
    metrics.update({f"scale_search/len{n}/on_grid_edge": float(on_edge[n]) for n in cfg.target_lengths})
    metrics.update({"scale_search/fit_a": fit.a, "scale_search/fit_r2": fit.r2})
    tracking.log_metrics(cfg.tracking, parent, {k: v for k, v in metrics.items() if not math.isnan(v)})
    tracking.log_json(cfg.tracking, parent, summary.to_dict(), "scale_search.json")
    tracking.log_figure(cfg.tracking, parent, plots.lambda_fit(summary), "plots/lambda_fit.png")
    tracking.end_run(cfg.tracking, parent)
    return {"run_id": parent, "study": study.study_name, "trials": len(ordered), **metrics}


# --- declared results: the registry's ``Stage.results`` (what a later step may reference; the dry run) ---


def result_keys(cfg: ScaleSearchConfig, train_len: int | None = None) -> dict[str, type]:
    """What ``run`` returns: the study's run, name and trial count, the fit of lambda = 1 + a ln s (NaN for
    beta), and per target length the best lambda (``best_beta``), its log-PPL and whether it sits on the grid's
    edge (1.0 / 0.0)."""
    keys = {"run_id": str, "study": str, "trials": int, "scale_search/fit_a": float, "scale_search/fit_r2": float}
    keys.update({f"scale_search/len{n}/{m}": float for n in cfg.target_lengths
                 for m in (f"best_{symbol(cfg)}", "best_logppl", "on_grid_edge")})
    return keys
