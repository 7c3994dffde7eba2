"""``scale-search``: which uniform temperature lambda (units of 1/sqrt(d)) a model reads best at each target
length (paper 001 §3.1, Fig 2 and Fig 7).

An Optuna study (GridSampler over the lambda grid by default) whose trial at lambda is exactly
``nope-lightning run evaluate checkpoint=… extension.temperature=lambda eval_lengths=[targets] …`` — run
through ``run_stage`` as a nested MLflow run, its command line stored on the trial so it can be replayed.
Trials score the **validation** split (``evaluate split=val``): the lambda chosen here is reported on test
data by later ``evaluate`` runs, never chosen on it. The objective is the mean validation log-PPL over the
target lengths; each length's log-PPL is a trial
attribute, so the best lambda per length comes from the same trials. Per-position log-PPL at the
longest target gives the best lambda per position bucket and the fit ``lambda = 1 + a ln(i / L)``.

Output (parent MLflow run): ``scale_search.json`` (the input of HeadScale's ``init=search``), the Fig 7
plot, and metrics ``scale_search/len{L}/best_lambda``, ``…/best_logppl``, ``scale_search/fit_a``,
``scale_search/fit_r2``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import optuna

from nope_lightning import tracking
from nope_lightning.checkpoint import load_model
from nope_lightning.config import (
    AttentionTemperature,
    EvaluateConfig,
    ExtensionConfig,
    ScaleSearchConfig,
    flatten,
    to_dict,
)
from nope_lightning.eval import plots
from nope_lightning.eval.summary import block_size
from nope_lightning.run import run_stage
from nope_lightning.search import (
    best_on_grid,
    fit_log_scale,
    model_label,
    open_study,
    position_fit_units,
    study_name,
)
from nope_lightning.stats import blocks, bootstrap
from nope_lightning.training.module import check_target_len


def trial_config(cfg: ScaleSearchConfig, temperature: float, parent_run_id: str, number: int) -> EvaluateConfig:
    """The ``evaluate`` config of the trial at uniform ``temperature``: perplexity and per-position curves only."""
    return EvaluateConfig(
        checkpoint=cfg.checkpoint, extension=ExtensionConfig(temperature=AttentionTemperature(uniform=temperature)),
        tracking=dataclasses.replace(cfg.tracking, parent_run_id=parent_run_id, run_name=""),
        trainer=cfg.trainer, split="val", eval_lengths=list(cfg.target_lengths), stride=cfg.stride,
        ppl_tokens=cfg.ppl_tokens,
        batch_size=cfg.batch_size, position_windows=cfg.position_windows, position_buckets=cfg.position_buckets,
        entropy=False, bootstrap=cfg.bootstrap, passkey_keys=0, longctx_samples=0, seed=cfg.seed, plots=False,
        name=f"scale-search-trial{number}-lam{temperature:g}")


def replay_command(cfg: EvaluateConfig) -> str:
    """The shell command that reruns a trial (the overrides that differ from evaluate's defaults)."""
    defaults = flatten(to_dict(EvaluateConfig(checkpoint=cfg.checkpoint)))
    changed = {k: v for k, v in flatten(to_dict(cfg)).items()
               if defaults.get(k) != v and not k.startswith("tracking.parent") and k != "name"}
    args = " ".join(f"{k}={str(v).replace(' ', '')}" for k, v in changed.items())
    return f"nope-lightning run evaluate checkpoint={cfg.checkpoint} {args}".strip()


def run(cfg: ScaleSearchConfig) -> dict[str, Any]:
    loaded = load_model(cfg.checkpoint, cfg.tracking)
    train_len, fingerprint = loaded.config.train_len, loaded.fingerprint
    for length in cfg.target_lengths:
        check_target_len(loaded.config, length)
    grid = cfg.lambdas
    settings = {"model": fingerprint, "split": "val", "targets": sorted(cfg.target_lengths), "grid": grid,
                "sampler": cfg.sampler,
                "stride": cfg.stride, "ppl_tokens": cfg.ppl_tokens, "buckets": cfg.position_buckets}
    targets = ",".join(map(str, sorted(cfg.target_lengths)))
    name = cfg.study_name or study_name(
        model_label(loaded), f"scale-search L{train_len}->{targets} {cfg.sampler} lambda {min(grid):g}-"
        f"{max(grid):g}", settings)
    sampler = (optuna.samplers.GridSampler({"lambda": grid}, seed=cfg.seed) if cfg.sampler == "grid"
               else optuna.samplers.TPESampler(seed=cfg.seed))
    study = open_study(name, cfg.storage, sampler)
    study.set_metric_names(["val log-PPL (mean over target lengths)"])
    parent = study.user_attrs.get("mlflow_run_id")
    if parent is None:  # first start of this study: its MLflow parent run, reused on resume
        parent = tracking.create_run(cfg.tracking, "scale-search", cfg.name or name, cfg)
        study.set_user_attr("mlflow_run_id", parent)

    def objective(trial: optuna.Trial) -> float:
        # The Optuna parameter keeps its name "lambda": studies already stored resume by it.
        temperature = round(trial.suggest_float("lambda", min(grid), max(grid),
                                                step=None if cfg.sampler == "grid" else cfg.grid_step), 6)
        eval_cfg = trial_config(cfg, temperature, parent, trial.number)
        trial.set_user_attr("command", replay_command(eval_cfg))
        result = run_stage("evaluate", eval_cfg)
        trial.set_user_attr("evaluate_run_id", result["run_id"])
        logppl = {n: result[f"val/len{n}/loss"] for n in cfg.target_lengths}
        trial.set_user_attr("logppl", {str(n): v for n, v in logppl.items()})
        return sum(logppl.values()) / len(logppl)

    # num_trials caps the study's total (0: the whole grid), so a resumed search runs only what is left.
    done = {round(t.params["lambda"], 6) for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))}
    total = min(len(grid), cfg.num_trials or len(grid)) if cfg.sampler == "grid" else cfg.num_trials or len(grid)
    if total > len(done):
        study.optimize(objective, n_trials=total - len(done), show_progress_bar=cfg.trainer.progress_bar)
    return summarize(cfg, study, parent, train_len, fingerprint)


def trial_samples(cfg: ScaleSearchConfig, trials: list) -> dict[str, Any]:
    """The per-window data of every trial (``evaluate``'s ``results.json``, all on the same validation windows):
    ``windows[n]``: (trials, windows, 2) NLL sum and count at target n; ``position``: (trials, windows, buckets)
    NLL sums of the position windows, ``widths`` (buckets,) their token counts; ``doc``: the scoring windows'
    documents (blocks never span two)."""
    results = [json.loads(tracking.download(cfg.tracking, t.user_attrs["evaluate_run_id"], "results.json")
                          .read_text()) for t in trials]
    corpus = results[0]["corpora"][0]
    position = results[0]["position"]
    return {"doc": results[0]["windows"][corpus]["doc"], "edges": position["edges"],
            "windows": {str(n): [r["windows"][corpus][str(n)] for r in results] for n in cfg.target_lengths},
            "position": [r["position"]["logppl"][corpus]["windows"] for r in results]}


def selection_intervals(samples: dict, grid: list[float], train_len: int, resamples: int, seed: int) -> dict:
    """95 % bootstrap intervals of the selection: the best temperature per target (resampling blocks of
    validation windows, every trial on the same resample: paired) and the fit a / R^2 (resampling position
    windows). ``grid``: the trials' temperatures, in trial order."""
    temperatures = np.asarray(grid)
    doc = np.asarray(samples["doc"])
    out: dict[str, Any] = {"best": {}}
    for n, rows in samples["windows"].items():
        table = np.concatenate([np.asarray(r) for r in rows], axis=1)  # (windows, trials * 2)
        units = blocks(table, doc, block_size(len(table)))
        interval = bootstrap([units], lambda s: best_on_grid(s[:, 0, 0::2] / s[:, 0, 1::2], temperatures), resamples,
                             seed)
        out["best"][n] = [interval.low, interval.high]
    try:
        units, fit = position_fit_units(samples, temperatures, train_len)
    except ValueError:
        return out
    a, r2 = (bootstrap([units], lambda s, i=i: fit(s)[i], resamples, seed) for i in (0, 1))
    out["fit"] = {"a": [a.low, a.high], "r2": [r2.low, r2.high]}
    return out


def summarize(cfg: ScaleSearchConfig, study, parent: str, train_len: int, fingerprint: str) -> dict[str, Any]:
    """Best lambda per target and per position bucket with their bootstrap intervals, the log fit, the JSON
    artifact and the Fig 7 plot."""
    trials = {}
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        trials[round(t.params["lambda"], 6)] = t  # duplicates (concurrent workers) keep the last
    if not trials:
        raise ValueError(f"study {study.study_name} has no completed trial yet")
    ordered = [trials[temperature] for temperature in sorted(trials)]
    best = {str(n): min(ordered, key=lambda t: t.user_attrs["logppl"][str(n)]).params["lambda"]
            for n in cfg.target_lengths}
    samples = trial_samples(cfg, ordered)
    temperatures = [t.params["lambda"] for t in ordered]
    edges = samples["edges"]
    centers = [(a + b - 1) / 2 for a, b in zip(edges[:-1], edges[1:], strict=True)]
    curves = np.asarray(samples["position"]).sum(1) / (len(samples["position"][0]) * np.diff(edges))
    per_bucket = [{"position": c, "s": c / train_len, "lambda": temperatures[int(np.argmin(curves[:, b]))]}
                  for b, c in enumerate(centers) if c > train_len]
    fit = {"a": float("nan"), "r2": float("nan")}
    if len(per_bucket) >= 2:
        a, r2 = fit_log_scale([p["s"] for p in per_bucket], [p["lambda"] for p in per_bucket])
        fit = {"a": a, "r2": r2}
    # An optimum on the grid's edge may lie beyond it: the report flags it rather than trusting the value.
    grid = (min(cfg.lambdas), max(cfg.lambdas))
    on_edge = {n: temperature in grid for n, temperature in best.items()}
    summary = {
        "study": study.study_name, "model_fingerprint": fingerprint, "train_len": train_len, "split": "val",
        "checkpoint": cfg.checkpoint, "units": "1/sqrt(head_size)", "grid": list(grid), "best": best,
        "best_on_grid_edge": on_edge,
        "best_logppl": {str(n): min(t.user_attrs["logppl"][str(n)] for t in ordered) for n in cfg.target_lengths},
        "per_position_best": per_bucket, "fit": fit,
        "intervals": selection_intervals(samples, temperatures, train_len, cfg.bootstrap, cfg.seed), "samples": samples,
        "trials": [{"lambda": t.params["lambda"], "logppl": t.user_attrs["logppl"],
                    "evaluate_run_id": t.user_attrs.get("evaluate_run_id"), "command": t.user_attrs.get("command")}
                   for t in ordered],
    }
    metrics = {f"scale_search/len{n}/best_lambda": best[str(n)] for n in cfg.target_lengths}
    metrics.update({f"scale_search/len{n}/best_logppl": summary["best_logppl"][str(n)] for n in cfg.target_lengths})
    metrics.update({f"scale_search/len{n}/on_grid_edge": float(on_edge[str(n)]) for n in cfg.target_lengths})
    metrics.update({"scale_search/fit_a": fit["a"], "scale_search/fit_r2": fit["r2"]})
    tracking.log_metrics(cfg.tracking, parent, {k: v for k, v in metrics.items() if not math.isnan(v)})
    tracking.log_json(cfg.tracking, parent, summary, "scale_search.json")
    tracking.log_figure(cfg.tracking, parent, plots.lambda_fit(summary), "plots/lambda_fit.png")
    tracking.end_run(cfg.tracking, parent)
    return {"run_id": parent, "study": study.study_name, "trials": len(ordered), **metrics}
