"""``headscale-search``: an Optuna study over HeadScale's initial lambda and learning rate (paper 001 §3.2:
"the initial value of head-based scales has a significant impact"; App. A: lr 0.05 or 0.1).

TPE samples ``init`` uniformly in [init_min, init_max] (units of 1/sqrt(d)) and ``lr`` log-uniformly in
[lr_min, lr_max]; each trial is exactly ``nope-lightning run headscale <base> init=<init> optim.lr=<lr>``
(a nested MLflow run under the study's run, its command line stored on the trial), validated every
``val_every_n_steps`` steps so a ``MedianPruner`` can stop it early. The objective is the held-out log-PPL
(validation loss, nats/token) at ``target_len`` after the last step. The study lives in ``storage``
(default ``sqlite:///mlruns/optuna.db``) under a name derived from the model and the settings, so a killed
search resumes by name: ``num_trials`` caps finished (complete + pruned) trials, so only the rest run.
One trial is one process (``base.trainer.devices=1``); run several workers on the same storage in parallel.

Output (the study's MLflow run, tag ``stage=headscale-search``): ``headscale_search.json`` (every trial's
init, lr, state, value and run id) and metrics ``headscale_search/best_logppl``, ``…/best_init``,
``…/best_lr``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
from optuna_integration import PyTorchLightningPruningCallback

from nope_lightning.config.core import flatten, to_dict
from nope_lightning.config.search import HeadScaleSearchConfig
from nope_lightning.config.stages import HeadScaleConfig
from nope_lightning.model.checkpoint import load_model
from nope_lightning.runtime import tracking
from nope_lightning.runtime.search import model_label, open_study, study_name
from nope_lightning.stages.registry import run_stage


def trial_config(cfg: HeadScaleSearchConfig, init: float, lr: float, parent_run_id: str,
                 number: int) -> HeadScaleConfig:
    """The HeadScale config of one trial: ``base`` with the sampled init and lr, validating periodically."""
    base = cfg.base
    return dataclasses.replace(
        base, init=f"{init:.6g}", optim=dataclasses.replace(base.optim, lr=lr),
        trainer=dataclasses.replace(base.trainer, val_every_n_steps=cfg.val_every_n_steps),
        tracking=dataclasses.replace(base.tracking, parent_run_id=parent_run_id),
        name=f"{cfg.name or 'headscale-search'}-trial{number}",
        out_dir=f"{base.out_dir}/trial{number}" if base.out_dir else "")


def replay_command(trial_cfg: HeadScaleConfig) -> str:
    """The shell command that reruns a trial: its overrides of HeadScale's defaults."""
    defaults = flatten(to_dict(HeadScaleConfig(checkpoint=trial_cfg.checkpoint, target_len=trial_cfg.target_len,
                                               init="default")))
    args = [f"{k}={str(v).replace(' ', '')}" for k, v in flatten(to_dict(trial_cfg)).items()
            if defaults.get(k) != v and k != "tracking.parent_run_id"]
    return " ".join(["nope-lightning run headscale", f"checkpoint={trial_cfg.checkpoint}",
                     f"target_len={trial_cfg.target_len}", *args])


def step_pruning_callback(trial, monitor: str):
    """optuna-integration's Lightning pruning callback, reporting at the optimizer step.

    The stock callback reports at ``current_epoch``, but our runs are one step-based epoch, so every
    validation would land on step 0 and Optuna keeps only the first report of a step (the later ones are
    ignored with a warning). The trial records its MLflow run id (user attr ``headscale_run_id``); the run
    of a pruned trial is tagged ``optuna.pruned``.
    """
    class StepPruning(PyTorchLightningPruningCallback):
        def on_fit_start(self, trainer, pl_module) -> None:
            super().on_fit_start(trainer, pl_module)
            self._trial.set_user_attr("headscale_run_id", trainer.logger.run_id)

        def on_validation_end(self, trainer, pl_module) -> None:
            score = trainer.callback_metrics.get(self.monitor)
            if trainer.sanity_checking or score is None:
                return
            self._trial.report(score.item(), step=trainer.global_step)
            if self._trial.should_prune():
                trainer.logger.experiment.set_tag(trainer.logger.run_id, "optuna.pruned", "true")
                raise optuna.TrialPruned(f"pruned at step {trainer.global_step}: {self.monitor}={score.item():.4f}")

    return StepPruning(trial, monitor)


def run(cfg: HeadScaleSearchConfig) -> dict[str, Any]:
    base = cfg.base
    loaded = load_model(base.checkpoint, base.tracking)
    fingerprint = loaded.fingerprint
    settings = {"model": fingerprint, "target_len": base.target_len, "init": [cfg.init_min, cfg.init_max],
                "lr": [cfg.lr_min, cfg.lr_max], "constraint": base.constraint, "steps": base.steps,
                "batch_size": base.batch_size, "seed": base.seed, "val_every": cfg.val_every_n_steps}
    name = cfg.study_name or study_name(
        model_label(loaded), f"headscale-search L{loaded.config.train_len}->{base.target_len}"
        f"{'' if base.constraint else ' no-constraint'}", settings)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=cfg.pruner_startup_trials,
                                         n_warmup_steps=cfg.pruner_warmup_steps)
    study = open_study(name, cfg.storage, None, pruner=pruner)
    # Seeded by the trials already run: a resumed study re-seeded with ``seed`` alone would replay the same
    # random start-up points as the killed run.
    study.sampler = optuna.samplers.TPESampler(seed=cfg.seed + len(study.trials))
    parent = study.user_attrs.get("mlflow_run_id")
    if parent is None:  # first start of this study: its MLflow parent run, reused on resume
        parent = tracking.create_run(base.tracking, "headscale-search", cfg.name or name, cfg)
        study.set_user_attr("mlflow_run_id", parent)
    monitor = f"val/len{base.target_len}/loss"
    study.set_metric_names([monitor])

    def objective(trial: optuna.Trial) -> float:
        init = trial.suggest_float("init", cfg.init_min, cfg.init_max)
        lr = trial.suggest_float("lr", cfg.lr_min, cfg.lr_max, log=True)
        trial_cfg = trial_config(cfg, init, lr, parent, trial.number)
        trial.set_user_attr("command", replay_command(trial_cfg))
        pruning = step_pruning_callback(trial, monitor)
        try:
            result = run_stage("headscale", trial_cfg, callbacks=[pruning])
        except optuna.TrialPruned:
            # Lightning marked the interrupted run FAILED; a pruned trial is a deliberate stop.
            tracking.end_run(base.tracking, trial.user_attrs["headscale_run_id"], "KILLED")
            raise
        return result[monitor]

    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    remaining = cfg.num_trials - len(study.get_trials(deepcopy=False, states=finished))
    if remaining > 0:
        study.optimize(objective, n_trials=remaining, show_progress_bar=base.trainer.progress_bar)
    return summarize(cfg, study, parent)


def summarize(cfg: HeadScaleSearchConfig, study, parent: str) -> dict[str, Any]:
    """Log every trial and the best one on the study's run; returns the summary metrics."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not complete:
        raise ValueError(f"study {study.study_name} has no completed trial (all were pruned or failed)")
    best = min(complete, key=lambda t: t.value)
    trials = [{"number": t.number, "state": t.state.name, "init": t.params.get("init"), "lr": t.params.get("lr"),
               "logppl": t.value, "headscale_run_id": t.user_attrs.get("headscale_run_id"),
               "command": t.user_attrs.get("command"),
               "intermediate": {str(k): v for k, v in t.intermediate_values.items()}}
              for t in study.get_trials(deepcopy=False)]
    metrics = {"headscale_search/best_logppl": best.value, "headscale_search/best_init": best.params["init"],
               "headscale_search/best_lr": best.params["lr"],
               "headscale_search/pruned": sum(t["state"] == "PRUNED" for t in trials)}
    base = cfg.base
    tracking.log_metrics(base.tracking, parent, metrics)
    tracking.log_json(base.tracking, parent, {"study": study.study_name, "target_len": base.target_len,
                                              "best_trial": best.number, "trials": trials},
                      "headscale_search.json")
    tracking.end_run(base.tracking, parent)
    return {"run_id": parent, "study": study.study_name, "best_trial": best.number,
            "best_run_id": best.user_attrs.get("headscale_run_id"), "trials": len(trials), **metrics}


# --- declared results: the registry's ``Stage.results`` (what a later step may reference; the dry run) ---


def result_keys(cfg: HeadScaleSearchConfig, train_len: int | None = None) -> dict[str, type]:
    """What ``run`` returns: the study's run and name, its best trial (number, run, log-PPL, init, lr), the
    trial count and how many were pruned."""
    return {"run_id": str, "study": str, "best_trial": int, "best_run_id": str, "trials": int,
            "headscale_search/pruned": int,
            **{f"headscale_search/{k}": float for k in ("best_logppl", "best_init", "best_lr")}}
