"""experiments/synthetic_paper/synthetic_paper.yaml, paper 002's full grid as a pipeline: its dry run plans 17 tasks x 5 PEs
x 3 seeds = 255 cells of the paper recipe without compute. tools/synthetic_cost.py: its FLOP count of
one run against a count by hand from the generated sequences (numpy) and the architecture's shapes."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from nope_lightning.config.core import load_config
from nope_lightning.config.parts import TrackingConfig
from nope_lightning.config.synthetic import PAPER_PES, SyntheticConfig
from nope_lightning.model.gpt import non_embedding_parameters
from nope_lightning.runtime import tracking
from nope_lightning.stages.registry import run_stage, stage_config
from nope_lightning.synthetic import TASKS, make_split
from tests.conftest import REPO

PIPELINE = REPO / "experiments/synthetic_paper/synthetic_paper.yaml"
SEEDS = [256788, 234054, 146317]  # the reference's


@pytest.fixture(scope="module")
def cost():
    spec = importlib.util.spec_from_file_location("synthetic_cost", REPO / "tools/synthetic_cost.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves its annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_the_paper_file_passes_the_dry_run_with_255_cells(tmp_path, capfd):
    track = TrackingConfig(uri=f"sqlite:///{tmp_path}/mlflow.db", artifact_root=str(tmp_path / "artifacts"))
    plan = run_stage("pipeline", stage_config("pipeline", str(PIPELINE), [
        f"tracking.uri={track.uri}", f"tracking.artifact_root={track.artifact_root}", "dry_run=true"]))
    assert plan["name"] == "synthetic_paper" and plan["seeds"] == SEEDS and plan["problems"] == []
    # One grid per replicate seed (the grid file's own seed list gives way), each 17 tasks x 5 PEs, 40K steps
    # but PCFG's 100K (the paper's, the grid file's task_overrides).
    steps = plan["steps"]
    assert [s["id"] for s in steps] == [f"grid[seed={seed}]" for seed in SEEDS]
    per_task = {task: 100_000 if task == "pcfg" else 40_000 for task in TASKS}
    assert all((s["stage"], s["cells"], s["steps"]) == ("synthetic-grid", 17 * 5, per_task) for s in steps)
    assert sum(s["cells"] for s in steps) == len(TASKS) * len(PAPER_PES) * len(SEEDS) == 255
    for step in steps:
        assert set(step["lengths"]) == set(TASKS)
        assert all(row["positions"] <= row["max_positions"] == 1024 for row in step["lengths"].values())
    err = capfd.readouterr().err
    assert all(f"synthetic-grid grid[seed={seed}]: dry run: ok" in err for seed in SEEDS)
    assert len(tracking.client(track).search_runs([tracking.experiment_id(track)])) == 0  # nothing ran


def test_the_cost_of_one_run_matches_a_count_by_hand(cost):
    # The paper recipe on copy with one training batch of the whole sample (its width: the sample's longest
    # sequence) and one evaluation batch per pass, so that the hand count needs no shuffle.
    seed, sample = SEEDS[0], 128
    cell = load_config(SyntheticConfig, REPO / "conf/synthetic/paper.yaml", [
        "task=copy", f"seed={seed}", f"batch_size={sample}", "n_valid=40", "n_test=60",
        "eval.batch_size=1000"])
    run = cost.run_cost(cell, sample=sample, epochs=2)
    L, d, ff = 12, 768, 2048
    assert (cell.model.n_layer, cell.model.n_embd, cell.model.intermediate_size) == (L, d, ff)

    # Training: rows padded to the longest <bos> prompt <sep> target <eos>; the model reads all but the last.
    train = make_split("copy", "train", n=sample, seed=seed)
    lengths = np.array([len(e.prompt) + len(e.target) + 3 for e in train])
    width = int(lengths.max()) - 1
    assert (run.mean_len, run.max_len) == (pytest.approx(lengths.mean()), lengths.max())
    assert run.tokens_per_step == sample * width
    assert run.attention_per_step == pytest.approx(sample * 3 * L * 4 * d * width * (width + 1) / 2)

    # Decoding: prefill of the longest <bos> prompt <sep>, then one position per new token up to the longest
    # target + <eos>, the last never fed back: prompt + 2 + target + 1 - 1 positions a row.
    def decoded(examples):
        w = max(len(e.prompt) for e in examples) + 2 + max(len(e.target) for e in examples)
        return len(examples) * w, len(examples) * L * 4 * d * w * (w + 1) / 2

    valid = make_split("copy", "valid", n=40, seed=seed)
    test = make_split("copy", "test", n=60, seed=seed)
    assert (run.val_tokens, run.val_attention) == pytest.approx(decoded(valid))
    assert (run.test_tokens, run.test_attention) == pytest.approx(decoded(valid + test))

    # N by hand: per layer QKV + output projection 4d^2, SwiGLU 3 d ff, two RMSNorm weights; the final norm.
    # The output head: d x the vocabulary (117 tokens) padded to a multiple of 64.
    n = L * (4 * d * d + 3 * d * ff + 2 * d) + d
    assert n == non_embedding_parameters(cell.model, 64) == 84_953_856
    head = d * 128
    assert cost.head_parameters(cell.model, "copy") == head
    steps, validations = 40_000, 40_000 // 2000
    by_hand = (steps * (6 * (n + head) * sample * width + run.attention_per_step)
               + validations * (2 * (n + head) * run.val_tokens + run.val_attention)
               + 2 * (n + head) * run.test_tokens + run.test_attention)
    assert run.flops(n + head, steps, 2000) == pytest.approx(by_hand)
    per_step = 6 * n * sample * width + 6 * L * d * sample * width * (width + 1)  # the docstring's formula
    assert run.train_flops(n, 1) == pytest.approx(per_step)
