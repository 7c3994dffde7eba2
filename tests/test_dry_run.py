"""``pipeline dry_run=true``: every experiment file plans cleanly without compute; broken copies fail with one
line naming the step; the plan's numbers are the recipes' (lengths, training tokens)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from nope_lightning.pipeline.steps import expand
from nope_lightning.stages.registry import run_stage, stage_config
from tests.conftest import REPO

EXPERIMENTS = sorted((REPO / "experiments").glob("*/*.yaml"))
#: The environment the paper and small_temperature files read their corpora and checkpoints from.
ENVIRONMENT = {"CORPUS": "/data/slimpajama", "PG19": "/data/pg19", "PROOFPILE": "/data/proofpile",
               "NOPE_CHECKPOINT": "runs:/0123456789abcdef/model", "NOPE_SCALE_SEARCH": "0123456789abcdef"}


@pytest.fixture(scope="session")
def released_standins(tmp_path_factory) -> dict[str, str]:
    """The released-checkpoint study's model folders: tiny Llama folders built by transformers, trained at L = 2K
    as the released models are (the dry run reads their config.json only)."""
    from tests.helpers import tiny_llama_folder

    root = tmp_path_factory.mktemp("released")
    for key in ("NOPE_1B", "HEADSCALE_8K", "ROPE_1B"):
        tiny_llama_folder(root / key, max_positions=2048)
    return {key: str(root / key) for key in ("NOPE_1B", "HEADSCALE_8K", "ROPE_1B")}


@pytest.fixture
def dry_run(tmp_path, tracking_overrides, monkeypatch, released_standins):
    """``path -> plan``: the dry run of an experiment file, tracked in a temporary store, with an empty data
    cache and the files' environment variables set."""
    monkeypatch.setenv("NOPE_LIGHTNING_CACHE", str(tmp_path / "cache"))
    for key, value in {**ENVIRONMENT, **released_standins}.items():
        monkeypatch.setenv(key, value)

    def run(path: Path) -> dict:
        cfg = stage_config("pipeline", str(path), [*tracking_overrides, "dry_run=true"])
        return run_stage("pipeline", cfg)

    return run


def mlflow_runs(tmp_path: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_every_experiment_file_plans_without_compute(path, dry_run, tmp_path):
    start = time.process_time()
    plan = dry_run(path)
    assert time.process_time() - start < 60  # CPU seconds: config resolution only (the machine may be busy)
    assert plan["dry_run"] and plan["problems"] == []
    # one entry per step, seed and matrix point, in run order
    assert [s["id"] for s in plan["steps"]] == [i.id for i in expand(stage_config("pipeline", str(path)))]
    assert mlflow_runs(tmp_path) == []
    assert not (tmp_path / "cache").exists()  # no data prepared


def test_small_plan_numbers(dry_run):
    plan = dry_run(REPO / "experiments/small/small.yaml")
    assert plan["seeds"] == [1234, 2345, 3456] and len(plan["steps"]) == 3 * 14
    steps = {s["id"].removesuffix("[seed=1234]"): s for s in plan["steps"] if s["id"].endswith("[seed=1234]")}
    pretrain = steps["pretrain_nope"]
    assert pretrain["model"] == {"from": "pretrain_nope[seed=1234]", "pos_encoding": "nope",
                                 "size": "4 layers x 128, 4 heads", "train_len": 128, "max_positions": 8192}
    assert pretrain["training_tokens"] == 2750 * 8 * 2 * 128  # steps x batch x DDP processes x train_len: 5.6 M
    assert pretrain["data"] == {"corpus": "kjv", "train_tokens": "unchecked: known once the corpus is prepared"}
    assert steps["pretrain_rope"]["model"]["pos_encoding"] == "rope"
    assert steps["eval_nope"]["lengths"] == {"eval": [128, 256, 512, 1024], "passkey": [128, 256, 512],
                                             "max_new_tokens": 8, "longctx_new_tokens": 0}
    assert steps["search_nope"]["lengths"] == {"targets": [256, 512, 1024]}
    assert steps["headscale_4x"]["training_tokens"] == 200 * 8 * 512
    # every replicate's steps use that replicate's models
    assert {s["model"]["from"] for s in plan["steps"] if s["id"].startswith("eval_headscale_4x[")} == {
        f"pretrain_nope[seed={seed}]" for seed in (1234, 2345, 3456)}
    baselines = {s["id"].removesuffix("[seed=2345]"): s for s in dry_run(REPO / "experiments/small_baselines/small_baselines.yaml")[
        "steps"] if s["id"].endswith("[seed=2345]")}
    assert baselines["finetune_pi_2x"]["model"]["from"] == "pretrain_rope[seed=2345]"
    assert baselines["eval_pi_2x"]["model"]["from"] == "finetune_pi_2x[seed=2345]"  # the fine-tune's own export


def test_paper_plan_numbers(dry_run):
    plan = dry_run(REPO / "experiments/paper/paper.yaml")
    steps = {s["id"]: s for s in plan["steps"]}
    pretrain = steps["pretrain_nope"]
    assert pretrain["model"]["size"] == "22 layers x 2048, 32 heads" and pretrain["model"]["max_positions"] == 20480
    # 50K steps x 8 sequences x 8 GPUs x 16 accumulated x L = 2048: the paper's ~100B tokens
    assert pretrain["training_tokens"] == 50_000 * 8 * 8 * 16 * 2048
    assert steps["eval_nope"]["lengths"]["eval"] == [2048, 4096, 8192, 16384]
    assert steps["search_nope"]["lengths"]["targets"] == [4096, 8192, 16384, 18432]
    assert steps["headscale_18k"]["lengths"] == {"target_len": 18432}
    assert steps["headscale_18k"]["training_tokens"] == 200 * 8 * 18432  # 29.5M (the paper's 30M)
    assert steps["finetune_pi_4k_raw"]["training_tokens"] == 5 * steps["finetune_pi_4k_fair"]["training_tokens"]


def test_external_checkpoint_is_noted_not_checked(dry_run, tmp_path):
    path = tmp_path / "external.yaml"
    path.write_text(yaml.safe_dump({"name": "external", "steps": [
        {"id": "eval_nope", "stage": "evaluate", "overrides": ["checkpoint=${oc.env:NOPE_CHECKPOINT}"]}]}))
    steps = {s["id"]: s for s in dry_run(path)["steps"]}
    assert steps["eval_nope"]["model"] == {"from": ENVIRONMENT["NOPE_CHECKPOINT"]}
    assert any("unchecked" in note for note in steps["eval_nope"]["notes"])


# --- broken copies --------------------------------------------------------------------------------------

STEPS = [
    {"id": "pretrain_nope", "stage": "pretrain", "config": "conf/pretrain/tiny.yaml"},
    {"id": "search_nope", "stage": "scale-search",
     "overrides": ["checkpoint=runs:/@{pretrain_nope.run_id}/model", "target_lengths=[128,256]", "grid=[1.0,1.5]"]},
    {"id": "eval_nope", "stage": "evaluate",
     "overrides": ["checkpoint=runs:/@{pretrain_nope.run_id}/model",
                   "extension.temperature.uniform_search=@{search_nope.run_id}",
                   "extension.temperature.uniform_search_len=256"]},
]


def broken(tmp_path: Path, step: int, **changes) -> Path:
    """A copy of the three-step pipeline above with step ``step``'s fields changed."""
    steps = [dict(s) for s in STEPS]
    steps[step].update(changes)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump({"name": "broken", "steps": steps}))
    return path


def problems(dry_run, path: Path) -> list[str]:
    with pytest.raises(ValueError, match="problem") as err:
        dry_run(path)
    return str(err.value).splitlines()[1:]


def test_the_unbroken_copy_plans(dry_run, tmp_path):
    plan = dry_run(broken(tmp_path, 0))
    steps = {s["id"]: s for s in plan["steps"]}
    assert steps["pretrain_nope"]["training_tokens"] == 20 * 8 * 64  # conf/pretrain/tiny.yaml
    assert steps["eval_nope"]["lengths"]["eval"] == [64, 128, 256, 512]  # 1x-8x of train_len 64
    assert plan["training_tokens"] == 20 * 8 * 64


@pytest.mark.parametrize("step, changes, expected", [
    (2, {"overrides": ["checkpoint=runs:/@{pretrain_nop.run_id}/model"]},
     "step eval_nope: @{pretrain_nop.run_id}: no step 'pretrain_nop' in this file; did you mean 'pretrain_nope'?"),
    (1, {"overrides": ["checkpoint=runs:/@{eval_nope.run_id}/model", "target_lengths=[128]"]},
     "step search_nope: @{eval_nope.run_id} refers to step 'eval_nope', which runs later"),
    (2, {"overrides": ["checkpoint=runs:/@{eval_nope.run_id}/model"]},
     "step eval_nope: @{eval_nope.run_id} refers to this step itself"),
    (2, {"overrides": ["checkpoint=runs:/@{pretrain_nope.run_id}/model",
                       "extension.temperature.uniform=@{search_nope.scale_search/len512/best_lambda}"]},
     "step eval_nope: extension.temperature.uniform=@{search_nope.scale_search/len512/best_lambda}: a searched "
     "lambda as text is not checked against the evaluated model; give the step temperature: {search: "
     "search_nope, at: 512}"),
    (2, {"overrides": ["checkpoint=runs:/@{pretrain_nope.run_id}/model",
                       "extension.temperature.uniform_search=@{search_nope.run_id}",
                       "extension.temperature.uniform_search_len=512"]},
     "step eval_nope: extension.temperature.uniform_search_len=512: step 'search_nope' searches target_lengths "
     "[128, 256]; name one of them"),
    (2, {"overrides": ["checkpoint=runs:/@{pretrain_nope.run_id}/model",
                       "extension.temperature.uniform_search=@{search_nope.run_id}"]},
     "step eval_nope: extension.temperature.uniform_search and uniform_search_len name a scale-search and the "
     "length whose best lambda is extension.temperature.uniform: give both (and no uniform), or neither"),
    (2, {"overrides": ["checkpoint=runs:/@{pretrain_nope.run_id}/model", "eval_lengths=[64,1024]"]},
     # 1024 + BOS + the 40-token answer of the long-context task variable_tracking (evaluate's default tasks)
     "step eval_nope: evaluation needs 1065 positions (longest length + generated tokens), over "
     "max_positions=1024 of the model step 'pretrain_nope' trains"),
    (1, {"overrides": ["checkpoint=runs:/@{pretrain_nope.run_id}/model", "target_lengths=[256,2048]"]},
     "step search_nope: target_len=2048 exceeds the model's max_positions=1024 (model of step 'pretrain_nope')"),
    (2, {"stage": "evaluat"}, "step eval_nope: unknown stage 'evaluat'; did you mean 'evaluate'?"),
    (2, {"overrides": ["checkpoint=runs:/@{pretrain_nope.run_id}/model", "eval_lenghts=[64]"]},
     "step eval_nope: config key 'eval_lenghts': Key 'eval_lenghts' not in 'EvaluateConfig'"),
])
def test_a_broken_copy_fails_with_one_line_naming_the_step(dry_run, tmp_path, step, changes, expected):
    lines = problems(dry_run, broken(tmp_path, step, **changes))
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert mlflow_runs(tmp_path) == []


def test_a_broken_step_is_not_blamed_on_the_steps_using_it(dry_run, tmp_path):
    assert problems(dry_run, broken(tmp_path, 0, overrides=["model.max_positions=32"])) == [
        "step pretrain_nope: train_len=64 exceeds model.max_positions=32; raise model.max_positions"]


def test_cli_prints_only_the_plan_on_stdout(tmp_path, tracking_overrides):
    proc = subprocess.run([sys.executable, "-m", "nope_lightning.cli", "run", "pipeline",
                           str(REPO / "experiments/tiny/tiny.yaml"), "dry_run=true", *tracking_overrides],
                          capture_output=True, text=True, cwd=tmp_path, check=True)
    plan = json.loads(proc.stdout)
    assert [s["stage"] for s in plan["steps"]][:3] == ["pretrain", "pretrain", "evaluate"]
    assert "pipeline [7/7] evaluate eval_nope_uniform: dry run: ok" in proc.stderr


def write(tmp_path: Path, **fields) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "grid", "steps": STEPS, **fields}))
    return path


def test_seeds_and_a_matrix_expand_every_step_with_its_own_references(dry_run, tmp_path):
    steps = [dict(STEPS[0], overrides=["model.n_layer=@{matrix.n_layer}", "name=nope-@{matrix.n_layer}layers-s@{seed}"]),
             STEPS[1], dict(STEPS[2], only={"n_layer": ["1"]})]
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "grid", "seeds": [3, 4], "matrix": {"n_layer": [1, 2]}, "steps": steps}))
    plan = dry_run(path)
    ids = [s["id"] for s in plan["steps"]]
    assert ids == ["pretrain_nope[n_layer=1,seed=3]", "search_nope[n_layer=1,seed=3]", "eval_nope[n_layer=1,seed=3]",
                   "pretrain_nope[n_layer=2,seed=3]", "search_nope[n_layer=2,seed=3]",
                   "pretrain_nope[n_layer=1,seed=4]", "search_nope[n_layer=1,seed=4]", "eval_nope[n_layer=1,seed=4]",
                   "pretrain_nope[n_layer=2,seed=4]", "search_nope[n_layer=2,seed=4]"]
    entries = {s["id"]: s for s in plan["steps"]}
    assert entries["search_nope[n_layer=2,seed=4]"]["model"]["from"] == "pretrain_nope[n_layer=2,seed=4]"
    assert entries["pretrain_nope[n_layer=2,seed=4]"]["model"]["size"].startswith("2 layers")


@pytest.mark.parametrize("fields, expected", [
    ({"seeds": [1, 1]}, "seeds=[1, 1] repeats a seed"),
    ({"seeds": ["a"]}, "config key 'seeds[0]'"),
    ({"bootstrap": 50}, "bootstrap=50 bootstrap resamples are too few"),
    ({"claims": ["nope_breaks_past_L"]},
     "claim 'nope_breaks_past_L' compares method 'nope', which no step of pipeline 'grid' runs"),
    ({"claims": ["nope_breaks_past"]}, "unknown claim 'nope_breaks_past'; did you mean 'nope_breaks_past_L'?"),
    ({"sweep": {"x": "tokens"}}, "sweep={'x': 'tokens'}: give sweep={x: <matrix key>, lines: <matrix key>, <role>: "),
])
def test_bad_pipeline_settings_fail_in_one_line_before_anything_runs(tmp_path, tracking_overrides, fields, expected):
    with pytest.raises(ValueError) as err:
        stage_config("pipeline", str(write(tmp_path, **fields)), tracking_overrides)
    assert str(err.value).splitlines()[0].startswith(expected) or expected in str(err.value).splitlines()[0]
    assert mlflow_runs(tmp_path) == []


def test_two_instances_training_into_one_out_dir_are_refused(dry_run, tmp_path):
    steps = [dict(STEPS[0], overrides=["model.n_layer=@{matrix.n_layer}"]), STEPS[1]]
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "grid", "matrix": {"n_layer": [1, 2]}, "steps": steps}))
    assert problems(dry_run, path) == [
        "step pretrain_nope[n_layer=2]: trains into mlruns/checkpoints/pretrain/pretrain-nope-tiny-L64-s1234 like "
        "step pretrain_nope[n_layer=1]; give the step a label, or a name= holding @{matrix.<key>} and @{seed}, so "
        "each instance has its own"]


def test_a_token_budget_of_zero_is_refused(dry_run, tmp_path):
    steps = [dict(STEPS[0], overrides=["tokens_per_parameter=@{matrix.tokens}", "name=t@{matrix.tokens}"]), STEPS[1]]
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "grid", "matrix": {"tokens": [0.001, 4]}, "steps": steps}))
    lines = problems(dry_run, path)
    assert len(lines) == 1 and lines[0].startswith("step pretrain_nope[tokens=0.001]: tokens_per_parameter=0.001 x ")
    assert "a token budget of 0" in lines[0]
    plan = dry_run(write(tmp_path, steps=[dict(STEPS[0], overrides=["tokens_per_parameter=40"])]))
    # 40 tokens per non-embedding parameter of the tiny model (2 x 64), in steps of 8 x 64 tokens
    assert plan["steps"][0]["steps"] == round(40 * 100672 / (8 * 64))


def test_a_reference_to_a_step_that_skips_the_point_is_refused(dry_run, tmp_path):
    steps = [dict(STEPS[0], only={"n_layer": ["1"]}), STEPS[1], STEPS[2]]
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "grid", "matrix": {"n_layer": [1, 2]}, "steps": steps}))
    lines = problems(dry_run, path)
    assert lines[0].startswith("step search_nope[n_layer=1]: @{pretrain_nope.run_id}: step 'pretrain_nope' does not "
                               "run at matrix point {'n_layer': '2'}")


def test_an_irope_temperature_on_a_model_without_nope_layers_fails_the_dry_run(dry_run, tmp_path):
    """The evaluation's extension is checked against the model the file trains, so the pipeline stops before
    the pre-training rather than after it."""
    steps = [{"id": "pretrain_rope", "stage": "pretrain", "config": "conf/pretrain/tiny.yaml",
              "overrides": ["model.pos_encoding=rope"]},
             {"id": "eval_irope", "stage": "evaluate", "overrides": [
                 "checkpoint=runs:/@{pretrain_rope.run_id}/model", "eval_lengths=[64,128]",
                 "extension.temperature.irope_beta=0.1"]}]
    path = tmp_path / "irope.yaml"
    path.write_text(yaml.safe_dump({"name": "irope", "steps": steps}))
    assert problems(dry_run, path) == [
        "step eval_irope: temperature.irope_beta=0.1: iRoPE's temperature acts on NoPE layers only and this model has "
        "none (layers: rope, rope) (model of step 'pretrain_rope')"]
    steps[0]["overrides"].append("model.nope_every=2")  # one NoPE layer in two: accepted
    path.write_text(yaml.safe_dump({"name": "irope", "steps": steps}))
    assert dry_run(path)["problems"] == []


def test_dry_run_marks_the_steps_a_store_finished_and_writes_nothing(tmp_path, data_cache, monkeypatch, capfd):
    """A two-step pipeline runs into a tmp store; its dry run then marks both steps done (the evaluation's hash is
    the real one only because the pretraining's recorded result resolves its checkpoint), a file with one more step
    marks the two as reusable and the new one not, and neither dry run adds a run; a store that does not exist
    stays uncreated."""
    from mlflow.tracking import MlflowClient

    from nope_lightning.runtime.progress import duration

    monkeypatch.chdir(tmp_path)  # checkpoints go under ./mlruns
    evaluate = ('{id: eval_nope, stage: evaluate, model: pretrain_nope, overrides: ["eval_lengths=[64]", '
                'ppl_tokens=64, passkey_keys=0, longctx_samples=0, position_windows=0, plots=false, bootstrap=100]}')
    text = (f"name: eta_store\nreport: false\nsteps:\n  - {{id: pretrain_nope, stage: pretrain, config: {REPO}/conf/pretrain/tiny.yaml,"
            f" overrides: [trainer.max_steps=4, trainer.val_every_n_steps=0]}}\n  - {evaluate}\n")
    (tmp_path / "two.yaml").write_text(text)
    (tmp_path / "three.yaml").write_text(text + "  - " + evaluate.replace("id: eval_nope", "id: eval_again")
                                         .replace("ppl_tokens=64", "ppl_tokens=128") + "\n")
    store = [f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"tracking.artifact_root={tmp_path}/artifacts",
             f"common=[trainer.progress_bar=false,data.cache_dir={data_cache}]"]
    ran = run_stage("pipeline", stage_config("pipeline", str(tmp_path / "two.yaml"), store))
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = len(client.search_runs([e.experiment_id for e in client.search_experiments()]))
    capfd.readouterr()

    plan = run_stage("pipeline", stage_config("pipeline", str(tmp_path / "two.yaml"), [*store, "dry_run=true"]))
    done = f"done under this file's pipeline run {ran['run_id']}"
    assert [s["finished"] for s in plan["steps"]] == [done, done]
    assert plan["finished_steps"] == 2 and plan["remaining_s"] == 0.0 and plan["estimate_s"] > 0
    shown = duration(plan["steps"][1]["estimate_s"])
    assert f"pipeline [2/2] evaluate eval_nope: dry run: ok; estimate {shown}; {done}\n" in capfd.readouterr().err

    plan = run_stage("pipeline", stage_config("pipeline", str(tmp_path / "three.yaml"), [*store, "dry_run=true"]))
    reused = f"finished under pipeline run {ran['run_id']}, would be reused"
    assert [s["finished"] for s in plan["steps"]] == [reused, reused, ""]
    assert plan["remaining_s"] == pytest.approx(plan["steps"][2]["estimate_s"], abs=0.1)
    assert len(client.search_runs([e.experiment_id for e in client.search_experiments()])) == runs

    (tmp_path / "empty").mkdir()
    missing = [f"tracking.uri=sqlite:///{tmp_path}/empty/mlflow.db", "dry_run=true"]
    plan = run_stage("pipeline", stage_config("pipeline", str(tmp_path / "two.yaml"), missing))
    assert [s["finished"] for s in plan["steps"]] == ["", ""] and list((tmp_path / "empty").iterdir()) == []
