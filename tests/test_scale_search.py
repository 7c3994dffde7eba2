"""scale-search: the log fit against numpy, a real SIGKILL mid-trial resumes to the uninterrupted answer (grid and
TPE retries), replayable trials, bad input."""

from __future__ import annotations

import contextlib
import math
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import optuna
import pytest

from nope_lightning import cli
from nope_lightning.analysis.lengthgen.log_law import fit_log_scale
from nope_lightning.config import TrackingConfig
from nope_lightning.model.checkpoint import load_model
from nope_lightning.model.extension import BETA_UNITS, scale_search_for
from nope_lightning.results.search import ScaleSearchResult
from nope_lightning.runtime import tracking as tracking_store
from nope_lightning.runtime.search import open_study
from nope_lightning.stages.registry import run_stage, stage_config


def test_fit_recovers_a_and_r2():
    s = np.array([1.25, 1.5, 2.0, 3.0, 4.0])
    a, r2 = fit_log_scale(list(s), list(1 + 0.4 * np.log(s)))
    assert a == pytest.approx(0.4) and r2 == pytest.approx(1.0)
    noisy = 1 + 0.4 * np.log(s) + np.array([0.02, -0.03, 0.01, 0.04, -0.02])
    a, r2 = fit_log_scale(list(s), list(noisy))
    reference = np.linalg.lstsq(np.log(s)[:, None], noisy - 1, rcond=None)[0][0]  # no-intercept least squares
    residual = noisy - 1 - reference * np.log(s)
    assert a == pytest.approx(reference)
    assert r2 == pytest.approx(1 - (residual**2).sum() / ((noisy - noisy.mean()) ** 2).sum())
    with pytest.raises(ValueError):
        fit_log_scale([1.0, 1.0], [1.0, 1.2])


@pytest.fixture
def search_overrides(tiny_pretrained, tmp_path) -> list[str]:
    return [f"checkpoint={tiny_pretrained['model']}", *tiny_pretrained["tracking"], "target_lengths=[128]",
            "grid=[1.0,1.25,1.5,1.75]", "ppl_tokens=256", "position_buckets=8", "stride=32",
            f"storage=sqlite:///{tmp_path}/optuna.db", "study_name=test-study"]


def running_trial(db: Path) -> int | None:
    """The number of a RUNNING trial past the first, read-only (never creates the file or its schema)."""
    if not db.exists():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            row = con.execute("SELECT number FROM trials WHERE state = 'RUNNING' AND number >= 1").fetchone()
    except sqlite3.OperationalError:  # the schema is still being created
        return None
    return row[0] if row else None


def test_a_search_killed_mid_trial_resumes_to_the_uninterrupted_answer(search_overrides, tiny_pretrained, tmp_path):
    straight = run_stage("scale-search", stage_config("scale-search", None, search_overrides))
    killed_db = tmp_path / "killed.db"
    killed = [*search_overrides[:-2], f"storage=sqlite:///{killed_db}", "study_name=killed"]
    proc = subprocess.Popen([sys.executable, "-m", "nope_lightning.cli", "run", "scale-search", *killed],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while proc.poll() is None and running_trial(killed_db) is None and time.time() < deadline:
        time.sleep(0.05)
    proc.kill()  # SIGKILL: no handler, no finally, the trial and its MLflow run stay RUNNING
    assert proc.wait(timeout=60) == -signal.SIGKILL, proc.stderr.read()[-3000:]
    storage = f"sqlite:///{killed_db}"
    stale = [t for t in optuna.load_study(study_name="killed", storage=storage).trials
             if t.state == optuna.trial.TrialState.RUNNING]
    assert len(stale) == 1  # killed mid-trial, after at least one trial finished

    resumed = run_stage("scale-search", stage_config("scale-search", None, killed))
    trials = optuna.load_study(study_name="killed", storage=storage).trials
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert Counter(t.params["lambda"] for t in complete) == {1.0: 1, 1.25: 1, 1.5: 1, 1.75: 1}
    assert trials[stale[0].number].state == optuna.trial.TrialState.FAIL
    assert resumed["scale_search/len128/best_lambda"] == straight["scale_search/len128/best_lambda"]
    assert resumed["scale_search/len128/best_logppl"] == straight["scale_search/len128/best_logppl"]
    if math.isfinite(straight["scale_search/fit_a"]):
        assert resumed["scale_search/fit_a"] == straight["scale_search/fit_a"]
    reference = {t.params["lambda"]: t.user_attrs["logppl"] for t in
                 optuna.load_study(study_name="test-study", storage=search_overrides[-2].split("=", 1)[1]).trials}
    assert {t.params["lambda"]: t.user_attrs["logppl"] for t in complete} == reference

    # Whatever the kill left RUNNING in MLflow was closed when the rerun started.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(search_overrides[1].split("=", 1)[1])
    runs = client.search_runs([client.get_run(resumed["run_id"]).info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{resumed['run_id']}'")
    statuses = [r.info.status for r in runs]
    assert statuses.count("FINISHED") == 4 and set(statuses) <= {"FINISHED", "KILLED"}
    assert client.get_run(resumed["run_id"]).info.status == "FINISHED"


def test_a_stale_tpe_trial_is_retried_with_its_parameters(tmp_path):
    storage = f"sqlite:///{tmp_path}/tpe.db"
    study = open_study("tpe", storage, optuna.samplers.TPESampler(seed=0))
    study.optimize(lambda t: t.suggest_float("x", 0, 1) ** 2, n_trials=2)
    dead = study.ask()  # the trial a kill left RUNNING, its parameter drawn
    x = dead.suggest_float("x", 0, 1)
    resumed = open_study("tpe", storage, optuna.samplers.TPESampler(seed=0))
    assert open_study("tpe", storage, optuna.samplers.TPESampler(seed=0)).trials[-1].state.name == "WAITING"
    seen = []
    resumed.optimize(lambda t: seen.append(t.suggest_float("x", 0, 1)) or 0.0, n_trials=2)
    assert seen[0] == x and seen[1] != x  # the retry first, then the sampler goes on
    states = [t.state.name for t in resumed.trials]
    assert states == ["COMPLETE", "COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]  # one retry, however many reopens


def test_a_trial_replays_as_an_evaluate_command(search_overrides, tiny_pretrained, capsys):
    run_stage("scale-search", stage_config("scale-search", None, [*search_overrides, "num_trials=1"]))
    storage = search_overrides[-2].split("=", 1)[1]
    trial = optuna.load_study(study_name="test-study", storage=storage).trials[0]
    command = shlex.split(trial.user_attrs["command"])
    assert command[:3] == ["nope-lightning", "run", "evaluate"]
    capsys.readouterr()
    assert cli.main([*command[1:], *tiny_pretrained["tracking"], "trainer.progress_bar=false"]) == 0
    import json

    out = capsys.readouterr().out
    replayed = json.loads(out[out.index("{"):])
    assert replayed["val/len128/loss"] == pytest.approx(trial.user_attrs["logppl"]["128"], rel=1e-9)


def test_a_beta_search_tunes_irope_temperature_and_no_lambda_reader_takes_it(search_overrides, tiny_pretrained,
                                                                            tmp_path):
    """parameter=irope_beta: trials at iRoPE's beta (the tiny model is NoPE: every layer takes it), best_beta per
    target, no log fit, and a result HeadScale / log_slope_fit refuse as a lambda."""
    overrides = [*search_overrides[:-2], f"storage=sqlite:///{tmp_path}/beta.db", "study_name=beta",
                 "parameter=irope_beta", "grid=[0.0,0.5]", "irope_floor=0.5"]
    result = run_stage("scale-search", stage_config("scale-search", None, overrides))
    assert result["trials"] == 2 and result["scale_search/len128/best_beta"] in (0.0, 0.5)
    assert "scale_search/len128/best_lambda" not in result and math.isnan(result["scale_search/fit_a"])
    trials = optuna.load_study(study_name="beta", storage=f"sqlite:///{tmp_path}/beta.db").trials
    assert sorted(t.params["beta"] for t in trials) == [0.0, 0.5]
    assert "extension.temperature.irope_beta=0.5" in trials[-1].user_attrs["command"] + trials[0].user_attrs["command"]
    tracking = TrackingConfig(*(o.split("=", 1)[1] for o in tiny_pretrained["tracking"]))
    saved = tracking_store.download(tracking, result["run_id"], "scale_search.json")
    assert ScaleSearchResult.load(saved).units == BETA_UNITS
    with pytest.raises(ValueError, match="searched iRoPE's beta, not lambda"):
        scale_search_for(str(saved), tracking, load_model(tiny_pretrained["model"], tracking).fingerprint, "init")


@pytest.mark.parametrize("extra,message", [
    (["target_lengths=[64]"], "must exceed the model's train_len=64"),
    (["grid=[0.0,1.0]"], "must be positive"),
    (["target_lengths=[]"], "target_lengths= is required"),
    (["parameter=irope_beta", "grid=[]"], "parameter=irope_beta needs grid=[0,...]"),
    (["parameter=irope_beta", "grid=[0.1,0.2]"], "must be >= 0 and contain 0"),
])
def test_scale_search_bad_input(search_overrides, extra, message, capsys):
    assert cli.main(["run", "scale-search", *search_overrides, *extra]) == 2
    assert message in capsys.readouterr().err
