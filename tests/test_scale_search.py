"""scale-search: the log fit against numpy, resume after a kill, replayable trials, bad input."""

from __future__ import annotations

import math
import shlex

import numpy as np
import optuna
import pytest

from nope_lightning import cli
from nope_lightning.run import run_stage, stage_config
from nope_lightning.search import fit_log_scale


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


def test_a_killed_search_resumes_without_rerunning_finished_trials(search_overrides, tmp_path):
    first = run_stage("scale-search", stage_config("scale-search", None, [*search_overrides, "num_trials=2"]))
    assert first["trials"] == 2
    study = optuna.load_study(study_name="test-study", storage=f"sqlite:///{tmp_path}/optuna.db")
    study.ask({"lambda": optuna.distributions.FloatDistribution(1.0, 1.75)})  # a trial a kill left RUNNING
    final = run_stage("scale-search", stage_config("scale-search", None, search_overrides))
    assert final["trials"] == 4 and final["run_id"] == first["run_id"]  # same parent run, resumed
    trials = optuna.load_study(study_name="test-study", storage=f"sqlite:///{tmp_path}/optuna.db").trials
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(t.params["lambda"] for t in complete) == [1.0, 1.25, 1.5, 1.75]  # each grid point once
    assert [t.number for t in complete] == [0, 1, 3, 4]  # the stale trial 2 was failed, then k+1 onwards
    assert trials[2].state == optuna.trial.TrialState.FAIL
    from mlflow.tracking import MlflowClient

    uri = search_overrides[1].split("=", 1)[1]
    children = MlflowClient(uri).search_runs(
        [MlflowClient(uri).get_run(final["run_id"]).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{final['run_id']}'")
    assert len(children) == 4
    best = final["scale_search/len128/best_lambda"]
    logppl = {t.params["lambda"]: t.user_attrs["logppl"]["128"] for t in complete}
    assert best == min(logppl, key=logppl.get)
    assert math.isfinite(final["scale_search/fit_a"])


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


@pytest.mark.parametrize("extra,message", [
    (["target_lengths=[64]"], "must exceed the model's train_len=64"),
    (["grid=[0.0,1.0]"], "must be positive"),
    (["target_lengths=[]"], "target_lengths= is required"),
])
def test_scale_search_bad_input(search_overrides, extra, message, capsys):
    assert cli.main(["run", "scale-search", *search_overrides, *extra]) == 2
    assert message in capsys.readouterr().err
