"""The pretrain stage end to end on the tiny config: tracking, export, exact resume, DDP, bad input."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from safetensors.torch import load_file

from nope_lightning import cli
from nope_lightning.config import PretrainConfig, TrackingConfig
from nope_lightning.model.checkpoint import load_model
from nope_lightning.stages.registry import run_stage, stage_config
from nope_lightning.training import trainer as trainer_module
from nope_lightning.training.budget import default_name
from tests.conftest import REPO

TINY = str(REPO / "conf/pretrain/tiny.yaml")


@pytest.fixture
def overrides(tmp_path, data_cache, tracking_overrides) -> list[str]:
    return [*tracking_overrides, f"data.cache_dir={data_cache}", f"out_dir={tmp_path}/run",
            "trainer.progress_bar=false"]


def tiny_config(overrides: list[str], *extra: str) -> PretrainConfig:
    return stage_config("pretrain", TINY, [*overrides, *extra])


def test_tiny_pretrain_is_tracked_and_exported(overrides, tmp_path):
    cfg = tiny_config(overrides)
    result = run_stage("pretrain", cfg)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(cfg.tracking.uri)
    run = client.get_run(result["run_id"])
    assert run.data.tags["stage"] == "pretrain"
    assert run.data.params["model.pos_encoding"] == "nope" and run.data.params["train_len"] == "64"
    loss, ppl = run.data.metrics["val/len64/loss"], run.data.metrics["val/len64/ppl"]
    assert ppl == pytest.approx(math.exp(loss), rel=1e-5)
    assert loss < math.log(512) - 0.5  # learned something beyond the uniform distribution over the vocab
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert len(history) >= 3 and history[-1].value < history[0].value
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert {"model/model.safetensors", "model/config.yaml", "model/tokenizer.json"} <= artifacts
    assert "config.yaml" in {a.path for a in client.list_artifacts(run.info.run_id)}
    # The export reloads (from the folder and from MLflow) to the trained weights.
    for ref in (result["model"], f"runs:/{run.info.run_id}/model"):
        loaded = load_model(ref, cfg.tracking)
        trained = load_file(str(Path(result["model"]) / "model.safetensors"))
        assert all(torch.equal(v, trained[k]) for k, v in loaded.model.state_dict().items())


class KillAt(Callback):
    """Raises at the start of the batch after ``step`` — after that step's checkpoint was written."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError("simulated kill")


def test_resume_after_a_kill_gives_identical_weights(overrides, tmp_path, monkeypatch):
    straight = run_stage("pretrain", tiny_config(overrides, f"out_dir={tmp_path}/straight"))

    original = trainer_module.build_trainer

    def killing_trainer(*args, callbacks=(), **kwargs):
        return original(*args, callbacks=[*callbacks, KillAt(10)], **kwargs)

    monkeypatch.setattr(trainer_module, "build_trainer", killing_trainer)
    with pytest.raises(RuntimeError, match="simulated kill"):
        run_stage("pretrain", tiny_config(overrides, f"out_dir={tmp_path}/killed"))
    monkeypatch.setattr(trainer_module, "build_trainer", original)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = run_stage("pretrain", tiny_config(overrides, f"out_dir={tmp_path}/killed"))
    assert not [w for w in caught if "exists and is not empty" in str(w.message)]  # its own checkpoints

    assert resumed["step"] == straight["step"] == 20
    assert resumed["run_id"] == (tmp_path / "killed/mlflow_run_id").read_text()  # same MLflow run
    a = load_file(str(Path(straight["model"]) / "model.safetensors"))
    b = load_file(str(Path(resumed["model"]) / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def _cli(args: list[str], capsys) -> tuple[int, str]:
    code = cli.main(args)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["run", "nosuchstage"], "unknown stage 'nosuchstage'"),
    (["run", "pretrain", "model.n_layers=3"], "model.n_layers"),
    (["run", "pretrain", "model.n_layer=three"], "model.n_layer"),
    (["run", "pretrain", "model.pos_encoding=xpos"], "model.pos_encoding='xpos' is not a valid choice"),
    (["run", "pretrain", "train_len=0"], "train_len=0 is out of range"),
    (["run", "pretrain", "data.vocab_size=100"], "data.vocab_size=100 is out of range"),
    (["run", "pretrain", "trainer.strategy=fsdp", "trainer.accelerator=cpu"], "fsdp needs CUDA GPUs"),
    (["run", "pretrain", "no_equals_sign"], "key=value"),
    (["run", "pretrain", "missing.yaml"], "config file not found"),
])
def test_bad_input_is_one_clear_line(args, message, capsys, overrides):
    code, err = _cli([*args, *overrides] if args[1] == "pretrain" and len(args) > 2 else args, capsys)
    assert code == 2 and message in err and err.count("\n") == 1


def test_bad_corpus_errors_before_any_compute(overrides, tmp_path, capsys):
    code, err = _cli(["run", "pretrain", TINY, *overrides, f"data.corpus={tmp_path}/nowhere"], capsys)
    assert code == 2 and "no such corpus or folder" in err
    (tmp_path / "empty").mkdir()
    code, err = _cli(["run", "pretrain", TINY, *overrides, f"data.corpus={tmp_path}/empty"], capsys)
    assert code == 2 and "no .txt" in err
    assert not (tmp_path / "run").exists()


def test_resume_guards_keep_the_earlier_run(overrides, tmp_path, capsys):
    first = run_stage("pretrain", tiny_config(overrides))
    last = tmp_path / "run/checkpoints/last.ckpt"
    before = last.read_bytes()
    code, err = _cli(["run", "pretrain", TINY, *overrides, "model.n_layer=3"], capsys)
    assert code == 2 and "comes from another config" in err and "model.n_layer" in err
    code, err = _cli(["run", "pretrain", TINY, *overrides, "resume=false"], capsys)
    assert code == 2 and "already holds a run" in err
    assert last.read_bytes() == before
    last.write_bytes(b"not a checkpoint")
    code, err = _cli(["run", "pretrain", TINY, *overrides], capsys)
    assert code == 2 and "corrupt checkpoint" in err
    from mlflow.tracking import MlflowClient

    cfg = tiny_config(overrides)
    assert MlflowClient(cfg.tracking.uri).get_run(first["run_id"]).info.status == "FINISHED"


def test_corrupt_or_mismatched_export_is_rejected(overrides, tmp_path):
    result = run_stage("pretrain", tiny_config(overrides))
    export = Path(result["model"])
    tracking = TrackingConfig(uri=overrides[0].split("=", 1)[1])
    with pytest.raises(ValueError, match="does not match"):
        from nope_lightning.model import GPT
        from nope_lightning.model.checkpoint import load_weights

        other = GPT(tiny_config(overrides, "model.n_embd=32").model, 512, 64)
        load_weights(other, export / "model.safetensors")
    (export / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="corrupt checkpoint"):
        load_model(str(export), tracking)
    with pytest.raises(FileNotFoundError, match="no such export folder"):
        load_model(str(tmp_path / "nothing"), tracking)


def test_ddp_on_two_cpu_processes(overrides, tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "nope_lightning.cli", "run", "pretrain", TINY, *overrides,
                           "trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp",
                           "trainer.max_steps=6", "trainer.val_every_n_steps=3", "trainer.checkpoint_every_n_steps=3"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert result["world_size"] == 2 and result["step"] == 6 and math.isfinite(result["val/len64/loss"])
    assert (tmp_path / "run/model/model.safetensors").is_file()


def test_a_hybrid_never_trains_into_its_rope_base_s_out_dir():
    """The default out_dir names a hybrid's layout, so a file that pre-trains RoPE and iRoPE with the same seed
    does not resume one model from the other's checkpoint."""
    rope = stage_config("pretrain", None, ["model.pos_encoding=rope"])
    assert default_name(rope) == "pretrain-rope-kjv-L128-s1234"
    assert default_name(stage_config("pretrain", None, ["model.pos_encoding=rope", "model.nope_every=4"])) == \
        "pretrain-rope-nope4-kjv-L128-s1234"
    assert default_name(stage_config("pretrain", None, ["model.pos_encoding=rope", "model.nope_every=4",
                                                        "model.rope_window=64"])) == "pretrain-rope-nope4-swa64-kjv-L128-s1234"
    listed = default_name(stage_config("pretrain", None, ["model.pos_encoding=rope",
                                                          "model.layer_pattern=[rope,rope,rope,nope]"]))
    assert re.fullmatch(r"pretrain-rope-layers-[0-9a-f]{8}-kjv-L128-s1234", listed)
