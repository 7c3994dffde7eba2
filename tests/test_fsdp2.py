"""trainer.strategy=fsdp2 (FSDP2, ``fully_shard``) on two CPU processes (gloo): pretrain and HeadScale run sharded,
frozen weights never get a gradient, HeadScale trains exactly n_layer x n_head scalars, the exports hold the plain
model's keys and load without any process group, and pretraining matches DDP on the same two processes (same
windows, same gradient mean, same clipping)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nope_lightning.config import TrackingConfig, TrainerConfig
from nope_lightning.model import GPT
from nope_lightning.model.checkpoint import WEIGHTS, load_model
from nope_lightning.training.trainer import check_strategy
from tests.conftest import REPO

# Every rank runs this (Lightning's launcher re-executes the command line): the stage, with a callback that
# records, per rank, the parameters that ever held a gradient, whether every parameter was a DTensor after each
# backward (the root's stay gathered after a forward without backward), the FSDP units and the trainable count.
DRIVER = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    from lightning.pytorch.callbacks import Callback
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    from nope_lightning.stages import registry as run
    from nope_lightning.training import trainer
    from nope_lightning.model import count_parameters

    out, stage, yaml = Path(sys.argv[1]), sys.argv[2], sys.argv[3]

    class Probe(Callback):
        def on_train_start(self, trainer, module):
            self.with_grad, self.dtensors = set(), True

        def on_after_backward(self, trainer, module):
            self.with_grad |= {n for n, p in module.model.named_parameters() if p.grad is not None}
            self.dtensors &= all(isinstance(p, DTensor) for p in module.model.parameters())

        def on_train_end(self, trainer, module):
            (out / f"rank{trainer.global_rank}.json").write_text(json.dumps({
                "with_grad": sorted(self.with_grad), "dtensors": self.dtensors,
                "names": sorted(n for n, _ in module.model.named_parameters()),
                "units": [n for n, m in module.model.named_modules() if isinstance(m, FSDPModule)],
                "trainable": count_parameters(module.model, trainable_only=True)}))

    build = trainer.build_trainer
    trainer.build_trainer = lambda cfg, callbacks=(), **kw: build(cfg, callbacks=[*callbacks, Probe()], **kw)
    result = run.run_stage(stage, run.stage_config(stage, yaml, sys.argv[4:]))
    if result.get("run_id"):  # global rank 0
        (out / "result.json").write_text(json.dumps(result))
''')


def run_two_processes(tmp_path: Path, name: str, stage: str, yaml: str, *overrides: str) -> tuple[dict, list[dict]]:
    """Run ``stage`` on 2 CPU processes; returns rank 0's result and each rank's probe record."""
    out = tmp_path / name
    out.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(driver), str(out), stage, yaml, f"out_dir={out}/run",
                           "trainer.accelerator=cpu", "trainer.devices=2", "trainer.progress_bar=false", *overrides],
                          capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return json.loads((out / "result.json").read_text()), ranks


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, data_cache) -> dict:
    """The tiny NoPE model pretrained for 6 steps on 2 processes, under fsdp2 and under ddp. The clipping norm is
    far below the gradient norm, so every step clips: a norm taken over one rank's shards would show."""
    root = tmp_path_factory.mktemp("fsdp2")
    tracking = [f"tracking.uri=sqlite:///{root}/mlflow.db", f"tracking.artifact_root={root}/artifacts"]
    args = [*tracking, f"data.cache_dir={data_cache}", "trainer.max_steps=6", "trainer.val_every_n_steps=0",
            "optim.grad_clip=0.05"]
    runs = {strategy: run_two_processes(root, strategy, "pretrain", str(REPO / "conf/pretrain/tiny.yaml"), *args,
                                        f"trainer.strategy={strategy}") for strategy in ("fsdp2", "ddp")}
    return {"runs": runs, "tracking": tracking, "root": root}


def test_pretrain_shards_trains_every_weight_and_matches_ddp(pretrained):
    (result, ranks), (ddp, _) = pretrained["runs"]["fsdp2"], pretrained["runs"]["ddp"]
    assert result["world_size"] == 2 and result["step"] == 6
    for rank in ranks:
        assert rank["dtensors"] and rank["units"] == ["", "transformer.h.0", "transformer.h.1"]  # blocks, root
        # Pre-training leaves the temperatures frozen: every other weight, and only those, got a gradient.
        assert rank["with_grad"] == [n for n in rank["names"] if not n.endswith("attn.temperature.per_head")]
    # Two ranks' gradients sum the same way under reduce-scatter and all-reduce: equal up to float32 rounding
    # (bit-identical in our runs).
    assert result["val/len64/loss"] == pytest.approx(ddp["val/len64/loss"], rel=1e-6)
    sharded, replicated = load_file(Path(result["model"]) / WEIGHTS), load_file(Path(ddp["model"]) / WEIGHTS)
    assert sharded.keys() == replicated.keys()
    for key in sharded:
        torch.testing.assert_close(sharded[key], replicated[key], msg=key)


def test_pretrain_export_loads_without_a_process_group(pretrained):
    result, _ = pretrained["runs"]["fsdp2"]
    values = dict(o.split("=", 1) for o in pretrained["tracking"])
    assert not torch.distributed.is_initialized()
    loaded = load_model(result["model"], TrackingConfig(uri=values["tracking.uri"],
                                                        artifact_root=values["tracking.artifact_root"]))
    weights = load_file(Path(result["model"]) / WEIGHTS)
    plain = GPT(loaded.model.cfg, loaded.meta["vocab_size"], loaded.config.train_len)
    assert weights.keys() == plain.state_dict().keys()  # the plain model's keys, full shapes
    assert all(weights[k].shape == v.shape for k, v in plain.state_dict().items())
    assert all(torch.equal(v, weights[k]) for k, v in loaded.model.state_dict().items())
    assert torch.isfinite(loaded.model(torch.zeros(1, 8, dtype=torch.long))).all()


def test_headscale_trains_only_the_temperatures(pretrained):
    base, _ = pretrained["runs"]["fsdp2"]
    result, ranks = run_two_processes(pretrained["root"], "headscale", "headscale", str(REPO / "conf/headscale/tiny.yaml"),
                                      *pretrained["tracking"], f"checkpoint={base['model']}", "steps=3",
                                      "entropy_windows=1", "trainer.strategy=fsdp2")
    n_layer, n_head = 2, 2  # conf/pretrain/tiny.yaml
    temperatures = [f"transformer.h.{i}.attn.temperature.per_head" for i in range(n_layer)]
    for rank in ranks:
        assert rank["dtensors"] and rank["with_grad"] == temperatures  # no frozen weight ever got a gradient
        assert rank["trainable"] == n_layer * n_head  # freeze_for_headscale's count, on the sharded model
    assert result["world_size"] == 2 and result["step"] == 3 and result["headscale/lambda_min"] >= 1.0
    table = load_file(result["table"])["head_scale"]
    assert table.shape == (n_layer, n_head) and bool((table >= 1.0).all())


@pytest.mark.parametrize(("overrides", "message"), [
    ({"strategy": "fsdp2", "precision": "16-mixed"}, "fsdp2 takes trainer.precision=32-true or bf16-mixed"),
    ({"strategy": "fsdp", "accelerator": "cpu"}, "on CPU use trainer.strategy=fsdp2"),
])
def test_refused_before_any_compute(overrides, message):
    with pytest.raises(ValueError, match=message):
        check_strategy(TrainerConfig(**overrides))
