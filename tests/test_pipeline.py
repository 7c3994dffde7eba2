"""The tiny pipeline end to end (every metric and artifact tracked); a SIGKILL mid-way leaves no process behind
and resumes to the same results; a stopped pipeline takes its step's process group with it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nope_lightning.analysis.markdown import escape
from nope_lightning.config import PipelineConfig, PipelineStep, load_config, to_yaml
from nope_lightning.config.pipeline import ReportSource
from nope_lightning.pipeline.steps import (
    Instance,
    expand,
    pipeline_hash,
    recorded_hash,
    step_config,
    step_hash,
    substitute,
)
from nope_lightning.results.runkey import RunKey
from nope_lightning.runtime.owners import machine
from nope_lightning.stages.registry import get_stage, run_stage, stage_config
from tests.conftest import REPO

PIPELINE = str(REPO / "experiments/tiny/tiny.yaml")
EVAL_STEPS = ("eval_nope", "eval_rope", "eval_rope_ntk", "eval_nope_uniform")


def store(root: Path, data_cache: str) -> list[str]:
    return [f"tracking.uri=sqlite:///{root}/mlflow.db", f"tracking.artifact_root={root}/artifacts",
            f"common=[trainer.progress_bar=false,data.cache_dir={data_cache}]"]


def step_metrics(root: Path, run_id: str) -> dict[str, dict[str, float]]:
    """``step id -> metrics`` of the pipeline's child runs."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    exp = client.get_run(run_id).info.experiment_id
    runs = client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{run_id}'")
    return {r.data.tags["pipeline_step"]: r.data.metrics for r in runs if "pipeline_step" in r.data.tags}


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, data_cache) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("pipeline_full")
    os.chdir(root)  # checkpoints and reports go under ./mlruns, as from a user's checkout
    try:
        result = run_stage("pipeline", stage_config("pipeline", PIPELINE, store(root, data_cache)))
    finally:
        os.chdir(REPO)
    return root, result


def test_tiny_pipeline_tracks_every_metric_and_artifact(full_run):
    root, result = full_run
    metrics = step_metrics(root, result["run_id"])
    assert set(metrics) == {"pretrain_nope", "pretrain_rope", *EVAL_STEPS, "search_nope"}
    assert "val/len64/ppl" in metrics["pretrain_nope"]
    for step in EVAL_STEPS:
        assert {"test/len64/ppl", "test/len128/ppl", "test/len256/ppl", "test/len256/entropy"} <= set(metrics[step])
    assert "passkey/len256/acc" in metrics["eval_nope"] and "longctx/multikey_retrieval/len256/score" in metrics["eval_rope"]
    assert {"scale_search/len256/best_lambda", "scale_search/fit_a"} <= set(metrics["search_nope"])
    report = Path(result["report"])
    text = report.read_text()
    for needle in ("perplexity on `tiny`", "Passkey retrieval", "Uniform-scale search", "| rope+ntk |"):
        assert needle in text
    assert {p.name for p in report.parent.glob("*.png")} >= {"position_curves_nope.png", "passkey_heatmaps.png",
                                                             "lambda_fit.png"}
    # the report lives in the pipeline's own run (no run of its own), with its HTML page and headline metrics
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    parent = client.get_run(result["run_id"])
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{result['run_id']}'")
    assert not [r for r in children if r.data.tags.get("stage") == "report"]
    assert {"report/report.md", "report/report.html"} <= {a.path for a in client.list_artifacts(result["run_id"],
                                                                                                "report")}
    assert parent.data.metrics["nope/test/len256/ppl"] == pytest.approx(metrics["eval_nope"]["test/len256/ppl"])
    assert "nope lambda_best/test/len256/ppl" in parent.data.metrics  # '=' is not a valid metric character


def test_rerun_skips_finished_steps(full_run, data_cache, capfd):
    root, result = full_run
    os.chdir(root)
    try:
        again = run_stage("pipeline", stage_config("pipeline", PIPELINE, store(root, data_cache)))
    finally:
        os.chdir(REPO)
    assert again["run_id"] == result["run_id"]
    assert capfd.readouterr().err.count("already done, skipped") == 7


def children(pid: int) -> set[int]:
    return {int(c) for task in Path(f"/proc/{pid}/task").iterdir()
            for c in (task / "children").read_text().split()}


@pytest.mark.slow  # ~70-120 s on 2 CPU cores; CI keeps the SIGTERM path (test_stop_resume.py); run with -m slow
# before touching how a pipeline starts or reaps its step processes
def test_killed_pipeline_leaves_no_process_and_resumes_to_the_same_results(full_run, tmp_path, data_cache):
    root, result = full_run
    args = [sys.executable, "-m", "nope_lightning.cli", "run", "pipeline", PIPELINE, *store(tmp_path, data_cache)]
    proc = subprocess.Popen(args, cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    deadline = time.time() + 300
    for line in proc.stderr:  # kill while the second pretraining runs, in its own process (subprocess: true)
        if "[2/7] pretrain pretrain_rope: running" in line or time.time() > deadline:
            time.sleep(2)
            step = children(proc.pid)
            proc.kill()  # the pipeline alone, by SIGKILL: it cannot clean up, the kernel must
            break
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert len(step) == 1
    gone = time.time() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in step) and time.time() < gone:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{pid}").exists() for pid in step)  # the step died with the pipeline
    result_file = tmp_path / "result.json"
    resumed = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "NOPE_LIGHTNING_RESULT": str(result_file)})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "[1/7] pretrain pretrain_nope: already done, skipped" in resumed.stderr
    assert "exists and is not empty" not in resumed.stderr  # the resumed pretrain's folder is its own
    checkpoints = sorted(p.name for p in (tmp_path / "mlruns/checkpoints/pretrain/rope-tiny/checkpoints").iterdir())
    assert checkpoints == ["last.ckpt", "step000010.ckpt", "step000020.ckpt", "step000030.ckpt"]  # one writer
    run_id = json.loads(result_file.read_text())["run_id"]
    want, got = step_metrics(root, result["run_id"]), step_metrics(tmp_path, run_id)
    for step_id in EVAL_STEPS:
        keys = [k for k in want[step_id] if k.endswith(("/ppl", "/entropy"))]  # perplexities and entropies
        assert len(keys) >= 3 and set(keys) <= set(got[step_id])
        for key in keys:
            assert got[step_id][key] == pytest.approx(want[step_id][key], rel=1e-6), (step_id, key)


def dead(pid: int) -> bool:
    """Gone, or a zombie waiting for a parent that is not ours to reap it."""
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_stopped_pipeline_kills_its_steps_process_group(tmp_path):
    """SIGTERM to the pipeline while it waits for a step: the step and what the step started are killed."""
    from nope_lightning.pipeline.runner import kill_group
    from nope_lightning.runtime.stopping import signals_raise

    pid_file = tmp_path / "grandchild"
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "p = subprocess.Popen(['sleep', '600']); open(sys.argv[1], 'w').write(str(p.pid)); "
                             "time.sleep(600)", str(pid_file)], start_new_session=True)
    while not pid_file.exists() or not pid_file.read_text():
        time.sleep(0.05)
    with pytest.raises(SystemExit), signals_raise():  # what run_subprocess does around its wait
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    kill_group(proc, grace_s=5)
    grandchild = int(pid_file.read_text())
    deadline = time.time() + 5
    while not dead(grandchild) and time.time() < deadline:
        time.sleep(0.05)
    assert proc.returncode == -signal.SIGTERM and dead(grandchild)


def test_references_name_their_problem():
    here = Instance(PipelineStep(id="c", stage="evaluate"), 7, (("n_layer", "2"),))
    results = {"a[n_layer=2,seed=7]": {"run_id": "r1"}, "a[n_layer=6,seed=7]": {"run_id": "r6"}}
    assert substitute("checkpoint=runs:/@{a.run_id}/model", here, results) == "checkpoint=runs:/r1/model"
    assert substitute("seed=@{seed} model.n_layer=@{matrix.n_layer}", here, results) == "seed=7 model.n_layer=2"
    with pytest.raises(ValueError, match="no earlier step 'b'"):
        substitute("@{b.run_id}", here, results)
    with pytest.raises(ValueError, match="has no result 'model'"):
        substitute("@{a.model}", here, results)


def test_a_run_key_reads_back_from_the_tags_it_writes():
    key = Instance(PipelineStep(id="eval_nope", stage="evaluate", label="nope"), 7, (("n_layer", "2"),)).key
    assert key.tags() == {"method": "nope", "stage": "evaluate", "step_id": "eval_nope",
                          "pipeline_step": "eval_nope[n_layer=2,seed=7]", "seed": "7", "matrix.n_layer": "2"}
    assert RunKey.from_tags(key.tags()) == key
    assert RunKey.from_tags({"stage": "evaluate"}, name="a run no pipeline tagged") == RunKey(
        "a run no pipeline tagged", stage="evaluate")


def test_a_step_hash_is_the_same_under_any_pipeline_run_and_tells_configs_apart(tracking_overrides):
    cfg = stage_config("pipeline", PIPELINE, [*tracking_overrides, "seeds=[0,1]"])
    first, second = expand(cfg)[0], expand(cfg)[7]  # pretrain_nope at seeds 0 and 1
    assert step_hash(step_config(first, cfg, {}, "parent-a")) == step_hash(step_config(first, cfg, {}, "parent-b"))
    assert step_hash(step_config(first, cfg, {}, "parent-a")) != step_hash(step_config(second, cfg, {}, "parent-a"))


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory, data_cache) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("pipeline_seeds")
    os.chdir(root)
    try:
        result = run_stage("pipeline", stage_config("pipeline", PIPELINE, [*store(root, data_cache), "seeds=[5,6]"]))
    finally:
        os.chdir(REPO)
    return root, result


def test_two_seeds_give_per_seed_runs_and_a_report_pooled_with_intervals(two_seeds):
    from mlflow.tracking import MlflowClient

    root, result = two_seeds
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    exp = client.get_run(result["run_id"]).info.experiment_id
    runs = client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{result['run_id']}'")
    tags = {r.data.tags["pipeline_step"]: r.data.tags for r in runs if "pipeline_step" in r.data.tags}
    assert set(tags) == {f"{step}[seed={seed}]" for seed in (5, 6) for step in
                         ("pretrain_nope", "pretrain_rope", *EVAL_STEPS, "search_nope")}
    assert {tags[f"eval_nope[seed={s}]"]["seed"] for s in (5, 6)} == {"5", "6"}
    pretrains = {r.data.tags["pipeline_step"]: r for r in runs if r.data.tags.get("stage") == "pretrain"}
    assert pretrains["pretrain_nope[seed=5]"].data.params["seed"] == "5"  # the replicate's seed trained it
    assert pretrains["pretrain_nope[seed=5]"].data.metrics != pretrains["pretrain_nope[seed=6]"].data.metrics
    report = Path(result["report"]).read_text()
    assert "2 seeds: mean over seeds, [95 % t interval across seeds]" in report
    assert re.search(r"\| nope \| \d+\.\d \[\d+\.\d, \d+\.\d\] \|", report)  # PPL with its interval
    claims = report.split("### The claims, tested")[1].split("###")[0]
    assert claims.count(" of 2 |") == 4  # every claim says on how many of the 2 seeds it holds
    assert "(per seed: " in claims


def test_extending_seeds_runs_only_the_new_seeds_steps(two_seeds, data_cache, tmp_path, capfd):
    """Another pipeline (a smaller file, seeds 5 and 7) over the store where seeds 5 and 6 ran: seed 5's steps are
    found finished by their hash and reused — no run started, none duplicated — and only seed 7's run; the report
    still lists seed 5's model, placed by this pipeline's step records."""
    import yaml
    from mlflow.tracking import MlflowClient

    root, first = two_seeds
    tiny = yaml.safe_load(Path(PIPELINE).read_text())
    steps = [s for s in tiny["steps"] if s["id"] in ("pretrain_nope", "eval_nope")]
    path = tmp_path / "reuse.yaml"
    path.write_text(yaml.safe_dump({"name": "reuse", "steps": steps}))
    os.chdir(root)
    try:
        result = run_stage("pipeline", stage_config("pipeline", str(path), [*store(root, data_cache), "seeds=[5,7]"]))
    finally:
        os.chdir(REPO)
    err = capfd.readouterr().err
    assert err.count(f"finished under pipeline run {first['run_id']}, reused") == 2
    assert "eval_nope[seed=5]: running" not in err and "eval_nope[seed=7]: running" in err
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    exp = client.get_run(result["run_id"]).info.experiment_id
    children = client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{result['run_id']}'")
    assert sorted(r.data.tags["pipeline_step"] for r in children) == ["eval_nope[seed=7]", "pretrain_nope[seed=7]"]
    evaluations = client.search_runs([exp], filter_string="tags.method = 'nope'")
    assert sorted(r.data.tags["seed"] for r in evaluations) == ["5", "6", "7"]  # one per (method, seed)
    records = {r["id"]: r for r in (json.loads(Path(client.download_artifacts(result["run_id"], a.path)).read_text())
                                    for a in client.list_artifacts(result["run_id"], "steps"))}
    original = json.loads(Path(client.download_artifacts(first["run_id"], "steps/eval_nope[seed=5].json")).read_text())
    assert records["eval_nope[seed=5]"]["result"] == original["result"]  # the same run, the same metrics
    recipe = Path(result["report"]).read_text().split("### Pre-training recipe of the models above")[1]
    assert "| nope-tiny[seed=5] | nope | False | 2 | 64 |" in recipe


def test_declared_results_are_what_the_stages_return(full_run):
    """Every stage the tiny pipeline ran returned exactly the results its declaration names, of their kinds."""
    from mlflow.tracking import MlflowClient

    root, result = full_run
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    for artifact in client.list_artifacts(result["run_id"], "steps"):
        record = json.loads(Path(client.download_artifacts(result["run_id"], artifact.path)).read_text())
        stage = get_stage(record["tags"]["stage"])
        run_id = record["result"]["run_id"]
        cfg = load_config(stage.config_class(), client.download_artifacts(run_id, "config.yaml"))
        assert_declared(stage.result_keys(cfg, 64), record["result"], record["id"])


def test_the_other_stages_return_what_they_declare(full_run, data_cache, tmp_path):
    """The stages the tiny pipeline does not run, on its models (found finished by their hash: nothing is
    retrained), the pipeline and the report: each returns exactly what it declares. Prepare and headscale-search
    run on their own here (as a command line runs them)."""
    import yaml
    from mlflow.tracking import MlflowClient

    root, first = full_run
    on = {"nope": "runs:/@{pretrain_nope.run_id}/model", "rope": "runs:/@{pretrain_rope.run_id}/model"}
    steps = [s for s in yaml.safe_load(Path(PIPELINE).read_text())["steps"] if s["id"].startswith("pretrain")] + [
        {"id": "headscale", "stage": "headscale", "config": "conf/headscale/tiny.yaml",
         "overrides": [f"checkpoint={on['nope']}", "steps=2", "optim.warmup_steps=1", "entropy_windows=0"]},
        {"id": "finetune", "stage": "finetune", "config": "conf/finetune/tiny.yaml",
         "overrides": [f"checkpoint={on['rope']}", "steps=2"]},
        {"id": "synthetic", "stage": "synthetic", "config": "conf/synthetic/tiny.yaml"}]
    path = tmp_path / "stages.yaml"
    path.write_text(yaml.safe_dump({"name": "stages", "steps": steps, "report": False}))
    tracked = store(root, "")[:2]
    alone = {"prepare": ["data.corpus=tiny", "data.vocab_size=512", f"data.cache_dir={data_cache}"],
             "headscale-search": [f"base.checkpoint=runs:/{first_step(root, first, 'pretrain_nope')}/model",
                                  "base.target_len=128", "base.init=default", "base.steps=2", "base.batch_size=2", "base.optim.warmup_steps=1",
                                  "base.trainer.val_batches=1", "base.trainer.progress_bar=false",
                                  "base.entropy_windows=0", *(f"base.{t}" for t in tracked), "num_trials=1",
                                  "val_every_n_steps=1"],
             "report": [f"run={first['run_id']}", *tracked]}
    os.chdir(root)
    try:
        cfg = stage_config("pipeline", str(path), store(root, data_cache))
        result = run_stage("pipeline", cfg)
        for stage, overrides in alone.items():
            stage_cfg = stage_config(stage, None, overrides)
            assert_declared(get_stage(stage).result_keys(stage_cfg), run_stage(stage, stage_cfg), stage)
    finally:
        os.chdir(REPO)
    assert_declared(get_stage("pipeline").result_keys(cfg), result, "pipeline")
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    records = [json.loads(Path(client.download_artifacts(result["run_id"], a.path)).read_text())
               for a in client.list_artifacts(result["run_id"], "steps")]
    assert {r["id"] for r in records if "reused_from" in r} == {"pretrain_nope", "pretrain_rope"}
    for record in records:
        step = next(s for s in cfg.steps if s.id == record["id"])
        overrides = [o.replace("@{pretrain_nope.run_id}", "x").replace("@{pretrain_rope.run_id}", "x")
                     for o in step.overrides]
        stage_cfg = stage_config(step.stage, step.config or None, overrides)
        assert_declared(get_stage(step.stage).result_keys(stage_cfg, 64), record["result"], record["id"])


def first_step(root: Path, result: dict, step: str) -> str:
    """The run id of the pipeline run's step ``step``, from its step record."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    return json.loads(Path(client.download_artifacts(result["run_id"], f"steps/{step}.json")).read_text())[
        "result"]["run_id"]


def assert_declared(declared: dict[str, type] | None, result: dict, where: str) -> None:
    """``result`` has exactly the names ``declared``, each of its kind (an int stands for a float)."""
    assert declared is not None and set(declared) == set(result), (where, set(declared or ()) ^ set(result))
    for name, kind in declared.items():
        assert isinstance(result[name], kind) or (kind is float and isinstance(result[name], int)), (where, name)


def test_fields_added_later_leave_a_store_s_finished_steps_finished(tmp_path):
    """A field added to a schema (here the hybrid-model and iRoPE fields) changes no step's identity while it
    holds its default, so an older store's records and parent runs still match; set, it does change it. The
    report's label data (a step's paper row and family, the paired table's reference) never does."""
    base = stage_config("pretrain", None, [])
    old_yaml = to_yaml(base)
    for key in ("layer_pattern", "nope_every", "layer_windows", "rope_window"):
        assert f"{key}:" in old_yaml  # the fields exist in today's schema ...
    stripped = "\n".join(line for line in old_yaml.splitlines() if not re.match(
        r"\s*(irope_beta|irope_floor|layer_pattern|nope_every|layer_windows|rope_window|reset_layers|fused|past_only|uniform_search|uniform_search_len|padding_multiple|tokenizer|engine|checkpoint_minutes|embedding_init|decay_position_bias):", line)) + "\n"
    # activation checkpointing was a bool, true by default, before "auto" became its default
    stripped = stripped.replace("activation_checkpointing: auto", "activation_checkpointing: true")
    # ... and the hash a store recorded before them (the yaml without them) is still today's
    assert recorded_hash(base) == hashlib.sha256(stripped.encode()).hexdigest()[:16]
    assert step_hash(stage_config("pretrain", None, ["model.pos_encoding=rope", "model.nope_every=4"])) != step_hash(
        stage_config("pretrain", None, ["model.pos_encoding=rope"]))
    steps = [{"id": "a", "stage": "evaluate", "label": "nope"}]
    plain = load_config(PipelineConfig, None, ["name=p", f"steps={steps}"])
    labelled = load_config(PipelineConfig, None, ["name=p", "reference=nope",
                                                  "steps=[{id: a, stage: evaluate, label: nope, family: nope, "
                                                  "paper: {table2: nope}}]"])
    assert pipeline_hash(plain) == pipeline_hash(labelled)


def test_a_report_over_pipeline_runs_in_two_stores_pools_their_seeds(two_seeds, data_cache, tmp_path):
    """A study split into pipeline runs (here seed 7 in a store of its own, as a second machine would hold it)
    is reported together: ``also`` brings the other store's runs in beside the first's, placed by their own tags,
    and a seed that two sources both hold is an error, not a silent choice."""
    import yaml

    root, first = two_seeds
    tiny = yaml.safe_load(Path(PIPELINE).read_text())
    path = tmp_path / "seed7.yaml"
    path.write_text(yaml.safe_dump({"name": "seed7", "report": False,
                                    "steps": [s for s in tiny["steps"] if s["id"] in ("pretrain_nope", "eval_nope")]}))
    other = tmp_path / "other"
    other.mkdir()
    os.chdir(other)
    try:
        second = run_stage("pipeline", stage_config("pipeline", str(path), [*store(other, data_cache), "seeds=[7]"]))
    finally:
        os.chdir(REPO)
    uri = f"sqlite:///{other}/mlflow.db"
    both = stage_config("report", None, [f"run={first['run_id']}", f"tracking.uri=sqlite:///{root}/mlflow.db",
                                         f"tracking.artifact_root={root}/artifacts", f"out_dir={tmp_path / 'both'}",
                                         f"also=[{{run: {second['run_id']}, uri: '{uri}'}}]"])
    assert both.sources[1] == (dataclasses.replace(both.tracking, uri=uri), second["run_id"])
    text = Path(run_stage("report", both)["markdown"]).read_text()
    # 'tiny' and 'seed7' share no first word: the first pipeline names the study; the run ids wait for the end
    assert text.startswith("# Report: tiny\n\nRead from 2 pipeline runs of 2 experiment files;")
    body, provenance = text.split("\n## Provenance\n")
    assert first["run_id"] not in body and second["run_id"] not in body
    assert f"From the MLflow store {uri}:" in provenance and f"| `seed7` | {second['run_id']} |" in provenance
    here = escape(machine())  # every pipeline run names the machine that ran it
    assert provenance.count(f" | {here} |") == 2 and "not recorded" not in provenance
    assert "3 seeds: mean over seeds" in text  # nope: seeds 5 and 6 here, 7 there
    assert "| nope-tiny[seed=7] | nope |" in text.split("### Pre-training recipe of the models above")[1]
    twice = dataclasses.replace(both, also=[*both.also, *both.also])
    with pytest.raises(ValueError, match=f"pipeline run {second['run_id']} and pipeline run {second['run_id']} both hold "
                                         "evaluate 'nope' seed 7"):
        run_stage("report", twice)
    # The other machine's store is gone; its report's results bundle, committed, stands in for it.
    alone = run_stage("report", stage_config("report", None, [f"run={second['run_id']}", f"tracking.uri={uri}",
                                                              f"tracking.artifact_root={other}/artifacts",
                                                              f"out_dir={tmp_path / 'seed7'}"]))
    bundle = Path(alone["markdown"]).parent / "results"
    committed = dataclasses.replace(both, also=[ReportSource(results=str(bundle))],
                                    out_dir=str(tmp_path / "committed"))
    again = Path(run_stage("report", committed)["markdown"]).read_text()
    assert read_back(again) == read_back(text) and f"From the results bundle {bundle}:" in again


def read_back(report: str) -> tuple[str, list[str]]:
    """A report's text before its provenance, and the provenance's rows (pipeline, run id, day) without the
    sources they were read from: a report read from a bundle is the one read from the stores, save where."""
    body, provenance = report.split("\n## Provenance\n")
    return body, [line for line in provenance.splitlines() if line.startswith("| `")]


def test_a_report_made_again_from_its_committed_results_is_the_same_report(full_run, tmp_path):
    """The report writes the results it read (``<out_dir>/results``, a bundle to commit); from that folder alone,
    with no store, the same report comes back to the byte but for the source its provenance names, and again
    in place; a bundle beside the store it came from holds the same runs twice: an error naming both."""
    root, first = full_run
    track = [f"tracking.uri=sqlite:///{root}/mlflow.db", f"tracking.artifact_root={root}/artifacts"]
    made = run_stage("report", stage_config("report", None, [f"run={first['run_id']}", *track,
                                                             f"out_dir={tmp_path / 'made'}"]))
    folder = Path(made["markdown"]).parent
    files = {p.relative_to(folder / "results"): p.read_bytes() for p in (folder / "results").rglob("*") if p.is_file()}
    assert {str(p).split("/")[0] for p in files} >= {"index.json", "evaluate", "scale-search"}
    for out, bundle in ((tmp_path / "again", folder / "results"), (tmp_path / "again", tmp_path / "again/results")):
        again = run_stage("report", stage_config("report", None, [f"also=[{{results: '{bundle}'}}]",
                                                                  f"out_dir={out}"]))
        text = Path(again["markdown"]).read_text()
        assert again["run_id"] == "" and read_back(text) == read_back(Path(made["markdown"]).read_text())
        assert f"From the results bundle {bundle}:" in text
        assert {p.relative_to(out / "results"): p.read_bytes()
                for p in (out / "results").rglob("*") if p.is_file()} == files
        assert sorted(p.name for p in out.glob("*.png")) == sorted(p.name for p in folder.glob("*.png"))
    # the run and its own bundle hold the same results: the bundle's copies are not counted twice
    twice = run_stage("report", stage_config("report", None, [f"run={first['run_id']}", *track,
                                                              f"also=[{{results: '{folder / 'results'}'}}]",
                                                              f"out_dir={tmp_path / 'twice'}"]))
    assert "rows read twice, counted once (the same result in two sources)" in Path(twice["markdown"]).read_text()
    with pytest.raises(ValueError, match="either run=<pipeline run id> .* or results="):
        stage_config("report", None, [f"run={first['run_id']}", f"also=[{{run: x, results: '{folder}'}}]"])
    with pytest.raises(ValueError, match="a report without run= is logged nowhere: give out_dir="):
        stage_config("report", None, [f"also=[{{results: '{folder / 'results'}'}}]"])


def test_a_rerun_logs_what_the_file_now_says_to_the_report(full_run, data_cache):
    """Report-only fields (claims, references) leave the pipeline run the same, and the rerun's report reads the
    file as it is now: a paired table against the newly named reference appears."""
    root, first = full_run
    os.chdir(root)
    try:
        again = run_stage("pipeline", stage_config("pipeline", PIPELINE, [*store(root, data_cache),
                                                                          "more_references=[rope]"]))
    finally:
        os.chdir(REPO)
    assert again["run_id"] == first["run_id"]
    text = Path(again["report"]).read_text()
    assert "### Paired against `nope`" in text and "### Paired against `rope`" in text
