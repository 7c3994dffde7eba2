"""HeadScale: only the temperatures train (no weight gradient is even computed), the focus constraint holds by
projection at any lr, a learned table reloads through evaluate's path to identical logits, init=search, bad
input; the Optuna search over init and lr (pruning, resume); DDP on two CPU processes."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from mlflow.tracking import MlflowClient

from nope_lightning.config import (
    AttentionTemperature,
    ExtensionConfig,
    HeadScaleConfig,
    HeadScaleSearchConfig,
    TrackingConfig,
    load_config,
)
from nope_lightning.model import count_parameters, set_temperatures, temperatures
from nope_lightning.model.checkpoint import load_model
from nope_lightning.model.extension import load_extended
from nope_lightning.results import HeadScaleResult
from nope_lightning.runtime import tracking
from nope_lightning.stages import headscale
from nope_lightning.stages.headscale_search import run as run_search
from tests.conftest import REPO

TINY = str(REPO / "conf/headscale/tiny.yaml")
TARGET = 128


@pytest.fixture(scope="module")
def export(tiny_pretrained) -> str:
    return tiny_pretrained["model"]


@pytest.fixture(scope="module")
def store(tiny_pretrained) -> TrackingConfig:
    """The fixture model's MLflow store (already migrated: a fresh SQLite store costs seconds to create)."""
    values = dict(o.split("=", 1) for o in tiny_pretrained["tracking"])
    return TrackingConfig(uri=values["tracking.uri"], artifact_root=values["tracking.artifact_root"])


def config(tiny_pretrained, tmp_path, *extra: str) -> HeadScaleConfig:
    return load_config(HeadScaleConfig, TINY, [*tiny_pretrained["tracking"], f"checkpoint={tiny_pretrained['model']}",
                                               f"out_dir={tmp_path}/hs", "trainer.progress_bar=false", *extra])


@pytest.fixture(scope="module")
def probe() -> torch.Tensor:
    return torch.randint(0, 500, (2, TARGET), generator=torch.Generator().manual_seed(0))


class Recorder(Callback):
    """What the trainer did: parameters holding a gradient after each backward, the temperature table after
    each optimizer step, the trainable count, and the trained model's state and logits on ``probe``."""

    def __init__(self, probe: torch.Tensor) -> None:
        self.probe, self.with_grad, self.tables = probe, [], []

    def on_train_start(self, trainer, module) -> None:
        self.trainable = count_parameters(module.model, trainable_only=True)

    def on_after_backward(self, trainer, module) -> None:
        self.with_grad.append({n for n, p in module.model.named_parameters() if p.grad is not None})

    def on_train_batch_end(self, trainer, module, *args) -> None:
        self.tables.append(temperatures(module.model).clone())

    def on_train_end(self, trainer, module) -> None:
        self.state = {k: v.clone() for k, v in module.model.state_dict().items()}
        with torch.no_grad():
            self.logits = module.model(self.probe)


def test_only_the_temperatures_train_and_the_table_reloads(tiny_pretrained, tmp_path, probe, store):
    recorder = Recorder(probe)
    result = headscale.run(config(tiny_pretrained, tmp_path, "steps=4"), callbacks=[recorder])
    base = load_model(tiny_pretrained["model"], store).model
    n_layer, n_head = base.cfg.n_layer, base.cfg.n_head
    scale_names = {f"transformer.h.{i}.attn.temperature.per_head" for i in range(n_layer)}

    assert result["step"] == 4 and recorder.trainable == n_layer * n_head
    assert recorder.with_grad == [scale_names] * 4  # no frozen weight ever got a .grad
    for name, value in base.state_dict().items():
        if name not in scale_names:
            assert torch.equal(recorder.state[name], value), name  # bit-identical
    assert all(bool((t >= 1.0).all()) for t in recorder.tables)
    assert not torch.equal(recorder.tables[-1], torch.ones(n_layer, n_head))  # the temperatures did move

    # The saved table, loaded the way evaluate loads one (file, and runs:/ artifact), gives the same logits.
    table = AttentionTemperature(table=result["table"])
    reloaded = load_model(tiny_pretrained["model"], store, temperature=table).model
    assert torch.equal(temperatures(reloaded), recorder.tables[-1])
    artifact = f"runs:/{result['run_id']}/headscale/lambda.safetensors"
    ext = ExtensionConfig(temperature=AttentionTemperature(table=artifact))
    via_evaluate = load_extended(tiny_pretrained["model"], ext, store).model
    with torch.no_grad():
        assert torch.equal(reloaded(probe), recorder.logits)
        assert torch.equal(via_evaluate(probe), recorder.logits)

    client = MlflowClient(store.uri)
    run = client.get_run(result["run_id"])
    assert run.data.tags["stage"] == "headscale" and run.data.params["init"] == "default"
    assert {"train/loss", "headscale/lambda_mean", "headscale/lambda_min", "headscale/lambda_max",
            f"val/len{TARGET}/loss", f"val/len{TARGET}/ppl"} <= set(run.data.metrics)
    assert run.data.metrics["headscale/lambda_min"] == pytest.approx(float(recorder.tables[-1].min()))
    artifacts = {a.path for folder in (None, "headscale", "plots") for a in client.list_artifacts(run.info.run_id, folder)}
    assert {"headscale/lambda.safetensors", "headscale/lambda.json", "headscale.json",
            "plots/entropy_vs_lambda.png"} <= artifacts
    summary = HeadScaleResult.load(tracking.download(store, run.info.run_id, "headscale.json"))
    assert summary.constraint is True and (summary.symbol, summary.init_value) == ("lambda", 1.0)
    assert summary.val_loss == pytest.approx(result[f"val/len{TARGET}/loss"])
    assert len(summary.converged_entropy.per_head) == n_layer
    # The last position's entropy is logged beside the last eighth's mean, per head, and is no copy of it.
    last, tail = np.asarray(summary.converged_entropy.last_position), np.asarray(summary.converged_entropy.per_head)
    assert last.shape == tail.shape and np.all(last >= 0) and not np.allclose(last, tail)


@pytest.mark.parametrize("constraint", [True, False])
def test_projection_holds_after_every_step_at_a_huge_lr(tiny_pretrained, tmp_path, probe, constraint):
    # init 4 is far too sharp, so the gradient pushes lambdas down and lr=1e3 throws them far below 1.
    recorder = Recorder(probe)
    headscale.run(config(tiny_pretrained, tmp_path, "init=4", "optim.lr=1e3", "optim.warmup_steps=1", "steps=3",
                         f"constraint={constraint}", "entropy_windows=0"), callbacks=[recorder])
    lowest = min(float(t.min()) for t in recorder.tables)
    if constraint:
        assert lowest == 1.0  # reached the bound and never crossed it
    else:
        assert lowest == pytest.approx(headscale.UNCONSTRAINED_FLOOR)  # below 1, kept positive (float32 0.01)


def test_lambda_one_reproduces_the_base_logits(export, store, probe):
    base, tuned = load_model(export, store).model, load_model(export, store).model
    set_temperatures(tuned, torch.full((base.cfg.n_layer, base.cfg.n_head), 1.0))
    module = headscale.HeadScaleLM(tuned, headscale.LAMBDA, load_config(HeadScaleConfig, TINY, [f"checkpoint={export}"]).optim,
                                   10, headscale.CONSTRAINED_FLOOR)
    with torch.no_grad():
        assert torch.equal(module.model(probe), base(probe))


def test_init_search_reads_a_scale_search_result(export, store, tmp_path):
    loaded = load_model(export, store)
    result = {"model_fingerprint": loaded.fingerprint, "train_len": 64, "best": {"128": 1.35, "256": 1.6}}
    path = tmp_path / "scale_search.json"
    path.write_text(json.dumps(result))
    run_id = tracking.create_run(store, "scale-search", "fake-search", HeadScaleConfig(checkpoint=export, target_len=2,
                                                                                       init="default"))
    tracking.log_json(store, run_id, result, "scale_search.json")
    for ref in (str(path), run_id, f"runs:/{run_id}"):
        cfg = HeadScaleConfig(checkpoint=export, target_len=TARGET, init="search", scale_search=ref, tracking=store)
        assert headscale.initial_value(cfg, loaded) == 1.35
    cfg = HeadScaleConfig(checkpoint=export, target_len=512, init="search", scale_search=str(path))
    with pytest.raises(ValueError, match=r"no result for target_len=512 \(it has \[128, 256\]\)"):
        headscale.initial_value(cfg, loaded)
    path.write_text(json.dumps({**result, "model_fingerprint": "0" * 64}))
    with pytest.raises(ValueError, match="was run on another model"):
        headscale.initial_value(dataclasses.replace(cfg, target_len=TARGET), loaded)


def test_bad_input_is_refused_before_training(tiny_pretrained, tmp_path):
    with pytest.raises(ValueError, match="checkpoint= is required"):
        load_config(HeadScaleConfig, TINY, [])
    with pytest.raises(ValueError, match="target_len=64 must exceed the model's train_len=64"):
        headscale.run(config(tiny_pretrained, tmp_path, "target_len=64"))
    with pytest.raises(FileNotFoundError, match="no such export folder"):
        headscale.run(config(tiny_pretrained, tmp_path, f"checkpoint={tmp_path}/nothing"))
    with pytest.raises(ValueError, match="below the focus constraint"):
        headscale.run(config(tiny_pretrained, tmp_path, "init=0.5"))
    other = tmp_path / "other_tokenizer"
    shutil.copytree(tiny_pretrained["model"], other)
    meta = json.loads((other / "meta.json").read_text())
    (other / "meta.json").write_text(json.dumps({**meta, "tokenizer_sha256": "f" * 64}))
    with pytest.raises(ValueError, match="wrong tokenizer"):
        headscale.run(config(tiny_pretrained, tmp_path, f"checkpoint={other}"))
    assert not (tmp_path / "hs").exists()


def test_search_over_init_and_lr_prunes_and_resumes(tiny_pretrained, tmp_path, store, monkeypatch):
    import optuna

    # The median rule's verdict depends on float noise; make trial 1 the pruned one, at its first report.
    monkeypatch.setattr(optuna.pruners.MedianPruner, "prune", lambda self, study, trial: trial.number == 1)
    tracking_args = [f"base.{o}" for o in tiny_pretrained["tracking"]]
    args = [*tracking_args, f"base.checkpoint={tiny_pretrained['model']}", f"base.target_len={TARGET}",
            "base.init=default", "base.steps=4", "base.batch_size=2", "base.optim.warmup_steps=1",
            "base.trainer.val_batches=1", "base.entropy_windows=0", "base.trainer.progress_bar=false",
            f"base.out_dir={tmp_path}/trials", f"storage=sqlite:///{tmp_path}/optuna.db", "val_every_n_steps=2",
            "pruner_warmup_steps=2", "pruner_startup_trials=1"]
    first = run_search(load_config(HeadScaleSearchConfig, None, [*args, "num_trials=2"]))
    resumed = run_search(load_config(HeadScaleSearchConfig, None, [*args, "num_trials=3"]))  # one more trial only
    assert resumed["study"] == first["study"] and resumed["run_id"] == first["run_id"] and resumed["trials"] == 3

    trials = optuna.load_study(study_name=first["study"], storage=f"sqlite:///{tmp_path}/optuna.db").trials
    assert len({(t.params["init"], t.params["lr"]) for t in trials}) == 3  # the resumed sampler drew a new point
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED", "COMPLETE"]
    assert [set(t.intermediate_values) for t in trials] == [{2, 4}, {2}, {2, 4}]  # reported per optimizer step
    client = MlflowClient(store.uri)
    children = [client.get_run(t.user_attrs["headscale_run_id"]) for t in trials]
    assert [c.info.status for c in children] == ["FINISHED", "KILLED", "FINISHED"]
    assert children[1].data.tags["optuna.pruned"] == "true"
    assert all(c.data.tags["mlflow.parentRunId"] == first["run_id"] for c in children)
    assert all(t.user_attrs["command"].startswith("nope-lightning run headscale checkpoint=") for t in trials)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = min(complete, key=lambda t: t.value)
    assert resumed["headscale_search/best_logppl"] == best.value
    assert "headscale_search.json" in {a.path for a in client.list_artifacts(first["run_id"])}


def test_ddp_on_two_cpu_processes(tiny_pretrained, tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "nope_lightning.cli", "run", "headscale", TINY,
                           *tiny_pretrained["tracking"], f"checkpoint={tiny_pretrained['model']}",
                           f"out_dir={tmp_path}/run", "trainer.progress_bar=false", "steps=3", "entropy_windows=0",
                           "trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert result["world_size"] == 2 and result["step"] == 3 and math.isfinite(result[f"val/len{TARGET}/loss"])
    assert result["headscale/lambda_min"] >= 1.0
    assert Path(result["table"]).is_file()
