"""finetune: the PI/YaRN export rebuilds the fine-tuned model exactly (scaling and reference length recorded),
fair vs raw token budgets, and the inputs it refuses (non-RoPE, already scaled, target_len <= train_len)."""

from __future__ import annotations

import json

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from mlflow.tracking import MlflowClient

from nope_lightning.config import (
    EvaluateConfig,
    FinetuneConfig,
    PretrainConfig,
    RopeScalingConfig,
    TrackingConfig,
    load_config,
)
from nope_lightning.model.checkpoint import load_model
from nope_lightning.model.extension import load_extended
from nope_lightning.stages import finetune
from nope_lightning.stages.registry import run_stage, stage_config
from nope_lightning.training import trainer as trainer_module
from tests.conftest import REPO

TINY = str(REPO / "conf/finetune/tiny.yaml")
TARGET, TRAIN_LEN, BATCH = 128, 64, 4


@pytest.fixture(scope="module")
def rope(tmp_path_factory, data_cache) -> dict:
    """A tiny RoPE model (train_len 64) in its own MLflow store: ``model`` (export) and ``tracking``."""
    root = tmp_path_factory.mktemp("tiny_rope")
    overrides = [f"tracking.uri=sqlite:///{root}/mlflow.db", f"tracking.artifact_root={root}/artifacts"]
    cfg = stage_config("pretrain", str(REPO / "conf/pretrain/tiny.yaml"),
                       [*overrides, f"data.cache_dir={data_cache}", f"out_dir={root}/run", "model.pos_encoding=rope",
                        "trainer.progress_bar=false", "trainer.max_steps=10"])
    return {**run_stage("pretrain", cfg), "tracking": overrides,
            "store": TrackingConfig(uri=overrides[0].split("=", 1)[1], artifact_root=overrides[1].split("=", 1)[1])}


@pytest.fixture(scope="module")
def probe() -> torch.Tensor:
    return torch.randint(0, 500, (2, TARGET), generator=torch.Generator().manual_seed(0))


class FinalLogits(Callback):
    """The fine-tuned model's logits on ``probe`` at the end of training."""

    def __init__(self, probe: torch.Tensor) -> None:
        self.probe = probe

    def on_train_end(self, trainer, module) -> None:
        with torch.no_grad():
            self.logits = module.model(self.probe)


def finetune_recorded(rope: dict, out, probe, monkeypatch, *extra: str) -> tuple[dict, torch.Tensor]:
    recorder = FinalLogits(probe)
    build = trainer_module.build_trainer
    monkeypatch.setattr(trainer_module, "build_trainer",
                        lambda *a, callbacks=(), **k: build(*a, callbacks=[*callbacks, recorder], **k))
    cfg = load_config(FinetuneConfig, TINY, [*rope["tracking"], f"checkpoint={rope['model']}", f"out_dir={out}",
                                             "trainer.progress_bar=false", *extra])
    return finetune.run(cfg), recorder.logits


@pytest.fixture(scope="module")
def pi_fair(rope, tmp_path_factory, probe) -> tuple[dict, torch.Tensor]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        return finetune_recorded(rope, tmp_path_factory.mktemp("pi"), probe, monkeypatch, "rope_scaling.method=pi",
                                 "steps=2")


@pytest.mark.parametrize("method,budget,steps", [("pi", "fair", 2), ("yarn", "raw", 2 * 2)])
def test_the_export_rebuilds_the_finetuned_model(method, budget, steps, rope, pi_fair, tmp_path, probe, monkeypatch):
    if method == "pi":
        result, logits = pi_fair
    else:
        result, logits = finetune_recorded(rope, tmp_path, probe, monkeypatch, f"rope_scaling.method={method}",
                                           f"budget={budget}", "raw_multiplier=2", "steps=2")
    assert result["step"] == steps and result["tokens"] == steps * BATCH * TARGET  # fair: HeadScale's budget

    exported = load_config(PretrainConfig, f"{result['model']}/config.yaml")
    assert exported.train_len == TRAIN_LEN  # RoPE scaling's reference length stays the original one
    scaling = exported.model.rope_scaling
    assert (scaling.method, scaling.factor, scaling.original_len) == (method, TARGET / TRAIN_LEN, TRAIN_LEN)
    assert json.loads(open(f"{result['model']}/meta.json").read())["train_len"] == TRAIN_LEN

    store = rope["store"]
    reloaded = load_model(result["model"], store).model
    unscaled = load_model(result["model"], store, rope_scaling=RopeScalingConfig()).model
    with torch.no_grad():
        assert torch.equal(reloaded(probe), logits)
        assert not torch.allclose(unscaled(probe), logits)  # so the equality above needed the recorded scaling

    client = MlflowClient(store.uri)
    run = client.get_run(result["run_id"])
    assert run.data.tags["stage"] == "finetune" and run.data.params["rope_scaling.method"] == method
    assert run.data.metrics["finetune/tokens"] == result["tokens"]
    assert "model/model.safetensors" in {a.path for a in client.list_artifacts(run.info.run_id, "model")}


def test_evaluate_applies_the_exported_scaling(rope, pi_fair, probe):
    result, logits = pi_fair
    ext = EvaluateConfig(checkpoint=result["model"]).extension
    model = load_extended(result["model"], ext, rope["store"]).model
    with torch.no_grad():
        assert torch.equal(model(probe), logits)


def test_refused_inputs(rope, pi_fair, tiny_pretrained, tmp_path):
    def run(checkpoint: str, *extra: str) -> None:
        finetune.run(load_config(FinetuneConfig, TINY, [*rope["tracking"], f"checkpoint={checkpoint}",
                                                        f"out_dir={tmp_path}/ft", *extra]))

    with pytest.raises(ValueError, match="is a nope model; finetune extends RoPE models"):
        run(tiny_pretrained["model"])
    with pytest.raises(ValueError, match="already uses rope_scaling=pi"):
        run(pi_fair[0]["model"])
    with pytest.raises(ValueError, match="target_len=64 must exceed the model's train_len=64"):
        run(rope["model"], "target_len=64")
    with pytest.raises(ValueError, match="rope_scaling.method='ntk' is not a valid choice"):
        run(rope["model"], "rope_scaling.method=ntk")
    assert not (tmp_path / "ft").exists()
