"""A tiny version of the sharpness study (``experiments/sharpness/sharpness.yaml``): a matrix over depth and tokens per
parameter, RoPE at one extreme, two seeds; the report's sweep section is computed from the study's own runs."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from nope_lightning.stages.registry import run_stage, stage_config
from tests.conftest import REPO

TINY = {
    "name": "tiny_sweep",
    "seeds": [1, 2],
    "matrix": {"n_layer": ["1", "2"], "tokens_per_parameter": ["0.05", "0.2"]},
    "sweep": {"x": "tokens_per_parameter", "lines": "n_layer", "nope": "nope", "rope": "rope", "search": "search_nope",
              "repaired": "nope lambda=best@2x"},
    "common": ["trainer.progress_bar=false", "ppl_tokens=256", "position_windows=6", "passkey_keys=0",
               "longctx_samples=0", "stride=8"],
    "steps": [
        {"id": "pretrain_nope", "stage": "pretrain", "config": "conf/pretrain/tiny.yaml",
         "overrides": ["model.n_layer=@{matrix.n_layer}", "tokens_per_parameter=@{matrix.tokens_per_parameter}",
                       "name=nope-@{matrix.n_layer}-@{matrix.tokens_per_parameter}-@{seed}"]},
        {"id": "eval_nope", "stage": "evaluate", "label": "nope",
         "overrides": ["checkpoint=runs:/@{pretrain_nope.run_id}/model", "eval_lengths=[64,128,256]"]},
        {"id": "search_nope", "stage": "scale-search",
         "overrides": ["checkpoint=runs:/@{pretrain_nope.run_id}/model", "target_lengths=[128]", "grid=[1.0,1.5]",
                       "bootstrap=100"]},
        {"id": "eval_nope_best_2x", "stage": "evaluate", "label": "nope lambda=best@2x",
         "overrides": ["checkpoint=runs:/@{pretrain_nope.run_id}/model", "eval_lengths=[64,128,256]",
                       "position_windows=0",
                       "extension.temperature.uniform_search=@{search_nope.run_id}",
                       "extension.temperature.uniform_search_len=128"]},
        {"id": "pretrain_rope", "stage": "pretrain", "config": "conf/pretrain/tiny.yaml",
         "only": {"tokens_per_parameter": ["0.2"]},
         "overrides": ["model.pos_encoding=rope", "model.n_layer=@{matrix.n_layer}",
                       "tokens_per_parameter=@{matrix.tokens_per_parameter}",
                       "name=rope-@{matrix.n_layer}-@{matrix.tokens_per_parameter}-@{seed}"]},
        {"id": "eval_rope", "stage": "evaluate", "label": "rope", "only": {"tokens_per_parameter": ["0.2"]},
         "overrides": ["checkpoint=runs:/@{pretrain_rope.run_id}/model", "eval_lengths=[64,128,256]",
                       "position_windows=0"]},
    ],
}


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory, data_cache) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("sweep")
    path = root / "tiny_sweep.yaml"
    path.write_text(yaml.safe_dump(TINY))
    overrides = [f"tracking.uri=sqlite:///{root}/mlflow.db", f"tracking.artifact_root={root}/artifacts",
                 "bootstrap=200", f"common=[{','.join(TINY['common'])},data.cache_dir={data_cache}]"]
    os.chdir(root)
    try:
        result = run_stage("pipeline", stage_config("pipeline", str(path), overrides))
    finally:
        os.chdir(REPO)
    return root, result


def test_the_sweep_runs_every_point_and_seed_and_plots_from_its_runs(sweep_run):
    root, result = sweep_run
    assert result["steps"] == 2 * (4 * 4 + 2 * 2)  # seeds x (points x NoPE steps + extreme points x RoPE steps)
    report = Path(result["report"])
    text = report.read_text()
    section = text.split("### Sweep over `tokens_per_parameter`, one line per `n_layer`")[1]
    rows = [line for line in section.splitlines() if re.match(r"\| [12] \| 0\.", line)]
    assert len(rows) == 4 and all(" | 2 | " in row for row in rows)  # every point, pooled over both seeds
    assert "NoPE PPL(2L) / PPL(L)" in section and "RoPE PPL(2L) / PPL(L)" in section
    assert re.search(r"\| \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\] \|", section)  # each measure with its interval
    assert "Log-log slope of NoPE PPL(2L) / PPL(L) against tokens_per_parameter: n_layer = 1:" in section
    assert (report.parent / "sweep.png").is_file()


def test_tokens_per_parameter_sets_each_points_training_steps(sweep_run):
    from mlflow.tracking import MlflowClient

    root, _ = sweep_run
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string="tags.stage = 'pretrain'")
    steps = {r.data.tags["pipeline_step"]: int(r.data.params["trainer.max_steps"]) for r in runs}
    # tiny model with n_layer 1 / 2: 50,336 / 100,672 non-embedding parameters; 8 x 64 tokens per step
    assert steps["pretrain_nope[n_layer=1,tokens_per_parameter=0.2,seed=1]"] == round(0.2 * 50336 / 512)
    assert steps["pretrain_nope[n_layer=2,tokens_per_parameter=0.2,seed=2]"] == round(0.2 * 100672 / 512)
    assert steps["pretrain_rope[n_layer=2,tokens_per_parameter=0.2,seed=1]"] == round(0.2 * 100672 / 512)
