"""Optuna studies: SQLite storage under ``mlruns/`` by default, names derived from what is searched (so a
killed study resumes by name), and stale trials of a killed run re-queued (the
fit of the position-dependent temperature is ``analysis/lengthgen/log_law.py``).

Resuming a killed study must give the uninterrupted study's answer. Optuna's ``GridSampler`` counts a
FAIL trial as a visited grid point, so failing the trial a kill left RUNNING would skip its point (and,
the grid looking exhausted, a later rerun picks a random point twice). ``open_study`` therefore fails the
stale trial and queues a retry of the same point (its params, and for a grid its ``grid_id``), as Optuna's
``RetryFailedTrialCallback`` does; queued trials run before any new one, so the study then goes on exactly
as if the kill had not happened.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from nope_lightning.runtime.locks import file_lock

DEFAULT_STORAGE = "sqlite:///mlruns/optuna.db"
#: System attribute of a trial that ``open_study`` found left RUNNING by a dead process.
STALE = "nope_lightning.stale"


def storage_url(storage: str) -> str:
    """``storage`` or the default, with the SQLite file's folder created."""
    url = storage or DEFAULT_STORAGE
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return url


def study_name(label: str, setting: str, settings: dict[str, Any]) -> str:
    """``<model label> <setting> (<hash of settings>)``, e.g. ``pretrain-nope-kjv-L128 scale-search L128->256,512
    grid lambda 0.8-2 (3fa2c1)``: readable in optuna-dashboard and MLflow, and the same search over the same
    model (every setting in ``settings``, the model's fingerprint included) gets the same study, so a killed
    search resumes by name."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:6]
    return f"{label} {setting} ({digest})"


def model_label(loaded) -> str:
    """A loaded model's name for studies and runs: its pre-training run name, else its export folder's parent."""
    return loaded.config.name or Path(loaded.folder).parent.name


def open_study(name: str, storage: str, sampler, direction: str = "minimize", pruner=None):
    """Create or load the study ``name`` (a new SQLite file is created under a lock: processes started together
    would race its schema). Trials left RUNNING by a killed process (we run one worker per study, so a
    RUNNING trial here is a dead one) are marked FAIL and retried: see the module docstring."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage_url(storage)
    path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
    with file_lock(f"{path}.lock") if path else contextlib.nullcontext():
        study = optuna.create_study(study_name=name, storage=url, sampler=sampler, direction=direction,
                                    pruner=pruner, load_if_exists=True)
    requeue_stale_trials(study)
    return study


def _retry_key(trial) -> tuple | None:
    """What a trial evaluates: its grid point, else its params (None: killed before it drew any)."""
    if "grid_id" in trial.system_attrs:
        return ("grid", trial.system_attrs["grid_id"])
    return tuple(sorted(trial.params.items())) or None


def requeue_stale_trials(study) -> list[int]:
    """Fail the RUNNING trials and queue one retry for each point that a stale trial left without a
    finished, pruned or queued trial; returns the failed trials' numbers. Idempotent: a kill at any point
    of it leaves a study that the next call repairs the same way."""
    from optuna.trial import TrialState, create_trial

    storage = study._storage
    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in stale:
        storage.set_trial_system_attr(trial._trial_id, STALE, True)
        storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    trials = study.get_trials(deepcopy=False)
    covered = {_retry_key(t) for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED,
                                                            TrialState.WAITING)}
    for trial in trials:
        key = _retry_key(trial)
        if trial.state == TrialState.FAIL and trial.system_attrs.get(STALE) and key and key not in covered:
            attrs = {k: v for k, v in trial.system_attrs.items() if k != STALE}
            study.add_trial(create_trial(state=TrialState.WAITING, params=trial.params,
                                         distributions=trial.distributions,
                                         system_attrs={**attrs, "failed_trial": trial.number}))
            covered.add(key)
    return [t.number for t in stale]
