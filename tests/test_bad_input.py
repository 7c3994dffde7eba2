"""A newcomer's mistakes, each answered in one line: two training budgets, a corrupt YAML file, a missing
checkpoint folder (before torch loads), a store in a folder that does not exist; and what helps them along:
progress at least once a minute in a log, optuna-dashboard on the suite's study store, CI naming slow
tests."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from types import SimpleNamespace
from wsgiref.util import setup_testing_defaults

import optuna
import optuna_dashboard
import pytest

from nope_lightning import cli
from nope_lightning.config import (
    FinetuneConfig,
    HeadScaleConfig,
    PretrainConfig,
    TrackingConfig,
    core,
    load_config,
)
from nope_lightning.config.core import to_yaml
from nope_lightning.runtime import progress
from nope_lightning.runtime.search import open_study
from nope_lightning.runtime.tracking import check_store
from nope_lightning.stages.registry import stage_config
from nope_lightning.training.budget import with_budget
from tests.conftest import REPO

HEADSCALE = ["checkpoint=x", "target_len=512", "init=default"]
MAX_STEPS_WON = "config: trainer.max_steps={} given: it replaces tokens_per_parameter=20's budget\n"


@pytest.fixture(autouse=True)
def _fresh_lines(monkeypatch):
    monkeypatch.setattr(core, "_SAID", set())  # load_config says each line once per process


@pytest.fixture
def tpp_yaml(tmp_path):
    path = tmp_path / "tpp.yaml"
    path.write_text("tokens_per_parameter: 20\n")
    return path


# --- two budgets --------------------------------------------------------------------------------------------


def test_a_command_line_max_steps_replaces_a_yamls_tokens_per_parameter_with_one_line(tpp_yaml, capsys):
    cfg = load_config(PretrainConfig, tpp_yaml, ["trainer.max_steps=2"])
    assert (cfg.tokens_per_parameter, cfg.trainer.max_steps) == (None, 2)
    assert with_budget(cfg).trainer.max_steps == 2  # what the stage trains
    assert capsys.readouterr().err == MAX_STEPS_WON.format(2)


def test_a_command_line_tokens_per_parameter_replaces_a_yamls_max_steps_with_one_line(capsys):
    cfg = load_config(PretrainConfig, REPO / "conf/pretrain/small.yaml", ["tokens_per_parameter=20"])
    assert (cfg.tokens_per_parameter, cfg.trainer.max_steps) == (20, 2750)  # with_budget sets the steps
    assert capsys.readouterr().err == ("config: tokens_per_parameter=20 given: it replaces "
                                       "trainer.max_steps=2750's budget\n")


def test_both_budgets_on_one_command_line_are_refused():
    with pytest.raises(ValueError, match=r"^tokens_per_parameter=20 and trainer\.max_steps=2 both set the "
                                         r"training budget: give one of them$"):
        load_config(PretrainConfig, None, ["tokens_per_parameter=20", "trainer.max_steps=2"])


def test_a_resolved_config_holding_both_budgets_reads_back_silently(tpp_yaml, tmp_path, capsys):
    cfg = load_config(PretrainConfig, tpp_yaml)
    (tmp_path / "resolved.yaml").write_text(to_yaml(cfg))
    assert load_config(PretrainConfig, tmp_path / "resolved.yaml") == cfg
    replaced = load_config(PretrainConfig, tmp_path / "resolved.yaml", ["trainer.max_steps=3"])
    assert (replaced.tokens_per_parameter, replaced.trainer.max_steps) == (None, 3)
    assert capsys.readouterr().err == MAX_STEPS_WON.format(3)


def test_an_only_budget_is_taken_without_a_line(capsys):
    assert load_config(PretrainConfig, None, ["trainer.max_steps=5"]).trainer.max_steps == 5
    assert load_config(PretrainConfig, None, ["tokens_per_parameter=4"]).tokens_per_parameter == 4
    assert capsys.readouterr().err == ""


def test_headscale_and_finetune_read_max_steps_as_their_steps(capsys):
    assert load_config(HeadScaleConfig, None, [*HEADSCALE, "trainer.max_steps=3"]).steps == 3
    finetune = ["checkpoint=x", "target_len=512", "trainer.max_steps=4"]
    assert load_config(FinetuneConfig, None, finetune).steps == 4
    search = stage_config("headscale-search", None,
                          [*(f"base.{o}" for o in HEADSCALE), "base.trainer.max_steps=5"])
    assert search.base.steps == 5
    assert capsys.readouterr().err.splitlines() == [
        "config: trainer.max_steps=3 given: it replaces steps=200's budget",
        "config: trainer.max_steps=4 given: it replaces steps=200's budget",
        "config: base.trainer.max_steps=5 given: it replaces base.steps=200's budget"]
    assert load_config(HeadScaleConfig, None, HEADSCALE).steps == 200  # the defaults hold both: steps


def test_config_shows_the_budget_that_won(tpp_yaml, capsys):
    assert cli.main(["config", "pretrain", str(tpp_yaml), "trainer.max_steps=2"]) == 0
    out, err = capsys.readouterr()
    assert "tokens_per_parameter: null" in out and "  max_steps: 2\n" in out
    assert err == MAX_STEPS_WON.format(2)


# --- corrupt YAML -------------------------------------------------------------------------------------------

FLOW = r"4:1: not valid YAML: did not find expected ',' or '\]' \(while parsing a flow sequence at 3:11\)"


def _one_error_line(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nope-lightning: error: ")
    return err.removeprefix("nope-lightning: error: ").rstrip("\n")


@pytest.mark.parametrize("stage", ["pretrain", "pipeline"])
def test_a_corrupt_yaml_names_file_line_and_column(stage, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  n_layer: 3\n  n_head: [4\n")
    assert re.fullmatch(re.escape(str(bad)) + ":" + FLOW, _one_error_line(capsys, ["run", stage, str(bad)]))


def test_a_corrupt_extended_file_names_itself_and_the_file_extending_it(tmp_path, capsys):
    (tmp_path / "base.yaml").write_text("name: base\nseeds: [1,\n  2\nsteps: []\n")
    (tmp_path / "more.yaml").write_text("extends: base.yaml\nname: more\n")
    line = _one_error_line(capsys, ["run", "pipeline", str(tmp_path / "more.yaml")])
    assert re.fullmatch(re.escape(str(tmp_path / "base.yaml")) + r":4:6: not valid YAML: did not find "
                        r"expected ',' or '\]' \(while parsing a flow sequence at 2:8\) "
                        r"\(extended by .*more\.yaml\)", line)


def test_a_key_given_twice_is_one_line(tmp_path, capsys):
    (tmp_path / "twice.yaml").write_text("train_len: 64\ntrain_len: 128\n")
    line = _one_error_line(capsys, ["run", "pretrain", str(tmp_path / "twice.yaml")])
    assert line.endswith("twice.yaml:2:1: not valid YAML: found duplicate key train_len (while constructing "
                         "a mapping at 1:1)")


# --- a missing checkpoint folder, before torch --------------------------------------------------------------


@pytest.mark.parametrize("args,key,path", [
    (["evaluate", "checkpoint=/no/such/folder"], "checkpoint=/no/such/folder", "/no/such/folder"),
    (["finetune", "checkpoint=rope:/no/such", "target_len=512"], "checkpoint=rope:/no/such", "/no/such"),
    (["headscale-search", "base.checkpoint=nope:/no/such", "base.target_len=512", "base.init=default"],
     "base.checkpoint=nope:/no/such", "/no/such"),
])
def test_a_missing_checkpoint_folder_is_one_line(args, key, path, capsys):
    line = _one_error_line(capsys, ["run", *args])
    assert line == (f"{key}: {path} does not exist; give an export folder, runs:/<run_id>/model, "
                    f"mlflow:<run_id> or a Hugging Face Llama folder as nope:<folder> / rope:<folder>")


def test_store_references_and_existing_folders_are_left_to_the_stage(tmp_path):
    for ref in ("runs:/0123/model", "mlflow:0123", str(tmp_path), f"nope:{tmp_path}"):
        cli.check_checkpoint(stage_config("evaluate", None, [f"checkpoint={ref}"]))


def test_a_missing_checkpoint_is_refused_before_torch_and_lightning_load():
    code = ("import sys\nfrom nope_lightning import cli\n"
            "assert cli.main(['run', 'evaluate', 'checkpoint=/no/such/folder']) == 2\n"
            "print(sorted(m for m in ('torch', 'lightning', 'mlflow') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"
    assert "checkpoint=/no/such/folder: /no/such/folder does not exist" in proc.stderr


# --- a store in a folder that does not exist ----------------------------------------------------------------


def test_a_new_store_folder_is_created_with_one_line(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/mlruns2/mlflow.db"
    store = TrackingConfig(uri=uri, artifact_root=str(tmp_path / "artifacts"))
    check_store(store)
    assert (tmp_path / "mlruns2/mlflow.db").is_file()
    assert capsys.readouterr().err == f"tracking: created {tmp_path}/mlruns2/ for the store {uri}\n"
    check_store(store)
    assert capsys.readouterr().err == ""  # said once: the folder is there now


def test_a_store_two_missing_folders_deep_is_refused(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlrnus/deep/mlflow.db"
    deep, typo = tmp_path / "mlrnus/deep", tmp_path / "mlrnus"
    with pytest.raises(ValueError, match=rf"^tracking\.uri={re.escape(uri)}: neither {deep} nor {typo} "
                                         rf"exists; fix the path or create it \(mkdir -p {deep}\)$"):
        check_store(TrackingConfig(uri=uri, artifact_root=str(tmp_path / "artifacts")))
    assert not (tmp_path / "mlrnus").exists()


# --- progress in a log --------------------------------------------------------------------------------------


def _lines_of_a_run(capsys, total: int, seconds_per_step: float, steps: int) -> list[str]:
    now = [0.0]
    bar = progress.StepProgressBar(clock=lambda: now[0], load=lambda: (0.5, 0.5, 0.5))  # a quiet machine
    bar._lines = True  # stderr is a log file
    bar.get_metrics = lambda *_: {}
    bar._start, bar._written = (0.0, 0), (-1, 0.0)
    for step in range(1, steps + 1):
        now[0] = step * seconds_per_step
        bar.on_train_batch_end(SimpleNamespace(global_step=step, max_steps=total), None, None, None, step)
    return capsys.readouterr().err.splitlines()


def test_a_slow_run_prints_a_line_at_least_every_minute(capsys):
    lines = _lines_of_a_run(capsys, total=1000, seconds_per_step=7.0, steps=30)
    assert lines == ["train 9/1000 (0%) 01:03 elapsed, ETA 1:55:37",
                     "train 18/1000 (1%) 02:06 elapsed, ETA 1:54:34",
                     "train 27/1000 (2%) 03:09 elapsed, ETA 1:53:31"]


def test_a_fast_run_prints_one_line_per_tenth(capsys):
    lines = _lines_of_a_run(capsys, total=20, seconds_per_step=0.5, steps=20)
    assert [line.split()[1] for line in lines] == [f"{step}/20" for step in range(2, 21, 2)]


# --- helpers a newcomer is sent to --------------------------------------------------------------------------


def test_optuna_dashboard_opens_a_study_store_the_suite_writes(tmp_path):
    storage = f"sqlite:///{tmp_path}/optuna.db"
    name = "m scale-search (abc123)"  # a name as the suite derives one (runtime.search.study_name)
    study = open_study(name, storage, optuna.samplers.GridSampler({"lambda": [1.0, 1.5]}))
    study.optimize(lambda trial: trial.suggest_float("lambda", 0.8, 2.5), n_trials=2)
    app = optuna_dashboard.wsgi(storage)

    def get(path: str) -> dict:
        status, environ = [], {"PATH_INFO": path}
        setup_testing_defaults(environ)  # a GET with an empty body, as a browser sends it
        body = b"".join(app(environ, lambda code, headers, exc_info=None: status.append(code)))
        assert status == ["200 OK"], body[:500]
        return json.loads(body)

    studies = get("/api/studies")["study_summaries"]
    assert [(s["study_name"], s["directions"]) for s in studies] == [(name, ["minimize"])]
    trials = get(f"/api/studies/{studies[0]['study_id']}")["trials"]
    assert sorted(t["params"][0]["param_internal_value"] for t in trials) == [1.0, 1.5]


def test_ci_lists_the_slowest_tests_beside_the_readmes_test_command():
    lines = [line for line in (REPO / ".ci/run").read_text().splitlines()
             if line.startswith("python -m pytest")]
    assert len(lines) == 1 and lines[0].startswith("python -m pytest -q -n 2 --durations=15")
