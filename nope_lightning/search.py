"""Optuna studies: SQLite storage under ``mlruns/`` by default, names derived from what is searched (so a
killed study resumes by name), stale trials of a killed run re-queued, and the least-squares fit of the
paper's position-dependent temperature.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

DEFAULT_STORAGE = "sqlite:///mlruns/optuna.db"


def storage_url(storage: str) -> str:
    """``storage`` or the default, with the SQLite file's folder created."""
    url = storage or DEFAULT_STORAGE
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return url


def study_name(prefix: str, settings: dict[str, Any]) -> str:
    """``prefix-<hash of settings>``: the same search over the same model gets the same study."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{prefix}-{digest}"


def open_study(name: str, storage: str, sampler, direction: str = "minimize", pruner=None):
    """Create or load the study ``name``; trials left RUNNING by a killed process are marked FAIL so their
    parameters are tried again (we run one worker per study, so a RUNNING trial here is a dead one)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=storage_url(storage), sampler=sampler,
                                direction=direction, pruner=pruner, load_if_exists=True)
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
    return study


def fit_log_scale(ratios: list[float], lambdas: list[float]) -> tuple[float, float]:
    """Least-squares ``a`` of ``lambda = 1 + a ln s`` (lambda in units of 1/sqrt(d), s = i / L > 0) and R^2.

    The intercept is fixed at 1 as in the paper (at s = 1 the default scale is right), so
    ``a = sum(ln s (lambda - 1)) / sum(ln s ^ 2)`` and ``R^2 = 1 - SS_res / SS_tot`` about the mean lambda.
    """
    if len(ratios) != len(lambdas) or len(ratios) < 2:
        raise ValueError("need at least two (s, lambda) points of equal count to fit lambda = 1 + a ln s")
    logs = [math.log(s) for s in ratios]
    denominator = sum(x * x for x in logs)
    if denominator == 0:
        raise ValueError("all points are at s = 1: nothing to fit")
    a = sum(x * (y - 1) for x, y in zip(logs, lambdas, strict=True)) / denominator
    mean = sum(lambdas) / len(lambdas)
    ss_res = sum((y - 1 - a * x) ** 2 for x, y in zip(logs, lambdas, strict=True))
    ss_tot = sum((y - mean) ** 2 for y in lambdas)
    return a, (1 - ss_res / ss_tot) if ss_tot > 0 else float("nan")
