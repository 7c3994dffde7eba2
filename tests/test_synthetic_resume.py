"""A synthetic grid resumes: killed (SIGKILL) after its first cell, the same command again reuses that cell, training
it no second time, and trains the rest; a grid still running in a live process is refused; what a rerun finds the
grid by (``config_hash``) and the attention analysis it stores per (task, seed)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from nope_lightning.config import load_config
from nope_lightning.config.parts import TrackingConfig
from nope_lightning.config.synthetic import SyntheticGridConfig
from nope_lightning.results.synthetic import SeedAttention, SyntheticGridResult, TaskAttention
from nope_lightning.runtime import tracking
from nope_lightning.stages import synthetic_grid
from tests.conftest import REPO

TINY = REPO / "conf/synthetic/tiny.yaml"
NOPE, ALIBI = "copy_repeat/nope/s0", "copy_repeat/alibi/s0"


def grid_file(tmp_path: Path, track: TrackingConfig) -> Path:
    """copy_repeat x (NoPE, ALiBi) x seed 0 at the tiny size, with the attention analysis: the kill falls inside the
    (task, seed) whose analysis needs both models, so the rerun must rebuild NoPE's from its kept weights."""
    base = {**yaml.safe_load(TINY.read_text()), "log_model": False,
            "tracking": {"uri": track.uri, "artifact_root": track.artifact_root}}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"tasks": ["copy_repeat"], "pos_encodings": ["nope", "alibi"], "seeds": [0],
                                    "attention_examples_per_length": 1, "distance_bins": 5, "base": base}))
    return path


def runs(track: TrackingConfig) -> list:
    client = tracking.client(track)
    return client.search_runs([tracking.experiment_id(track)], max_results=1000)


def wait_for(log: Path, line: str, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    """Poll ``log`` until it holds ``line``; fail if ``proc`` ends first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while line not in log.read_text():
        assert proc.poll() is None, f"the grid exited ({proc.returncode}) before {line!r}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {line!r} in {timeout}s"
        time.sleep(0.05)


def test_a_grid_killed_after_its_first_cell_resumes_without_retraining_it(tmp_path):
    track = TrackingConfig(uri=f"sqlite:///{tmp_path}/mlflow.db", artifact_root=str(tmp_path / "artifacts"))
    command = [sys.executable, "-m", "nope_lightning.cli", "run", "synthetic-grid", str(grid_file(tmp_path, track))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = tmp_path / "first.log"
    with log.open("w") as stderr:
        first = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            # The grid names the next cell only once the first one is tagged finished: kill it right then,
            # while ALiBi is still being set up.
            wait_for(log, f"synthetic-grid {ALIBI}: training", first)
        finally:
            first.kill()  # SIGKILL: no handler of ours runs
            first.wait()
    killed = {r.info.run_id: r for r in runs(track)}
    (parent,) = [r.info.run_id for r in killed.values() if synthetic_grid.GRID_TAG in r.data.tags]
    tagged = {r.data.tags[synthetic_grid.CELL_TAG]: r.info.run_id for r in killed.values()
              if synthetic_grid.CELL_TAG in r.data.tags}
    assert list(tagged) == [NOPE], "ALiBi finished before the kill: the test did not interrupt the grid"
    nope = tagged[NOPE]
    assert killed[parent].info.status == "RUNNING"  # as the kill left it
    kept = tmp_path / "checkpoints/synthetic-grid" / parent / "copy_repeat_s0"
    assert [p.name for p in kept.iterdir()] == ["nope.safetensors"]

    rerun = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"synthetic-grid run {parent}: 2 cells, 1 already finished" in rerun.stderr
    assert f"synthetic-grid {NOPE}: finished in run {nope}, reused" in rerun.stderr
    assert f"synthetic-grid {ALIBI}: training\n" in rerun.stderr
    summary = SyntheticGridResult.from_dict(json.loads(rerun.stdout))
    assert summary.parent_run_id == parent and set(summary.mrr) == {"nope", "alibi"}
    assert [(r.pos_encoding, r.steps) for r in summary.runs] == [("nope", 8), ("alibi", 8)]
    assert summary.runs[0].run_id == nope  # NoPE's result is the killed grid's, read back
    assert sorted(summary.attention["copy_repeat"].jsd["ALiBi"]) == [1, 2, 3, 4, 5, 6]  # NoPE's model rebuilt

    after = runs(track)
    children = [r for r in after if r.data.tags.get(tracking.PARENT_TAG) == parent]
    by_pe = {pe: [r for r in children if r.info.run_name == f"synthetic-copy_repeat-{pe}-s0"] for pe in ("nope", "alibi")}
    assert [r.info.run_id for r in by_pe["nope"]] == [nope]  # trained once
    client = tracking.client(track)
    assert len(client.get_metric_history(nope, "val/id_acc")) == 2  # its steps 4 and 8, not logged again
    # ALiBi: the run the kill interrupted (if it got as far as creating one), closed, and the finished one
    assert sorted(r.info.status for r in by_pe["alibi"]) in (["FINISHED"], ["FINISHED", "KILLED"])
    assert {r.data.tags.get(synthetic_grid.CELL_TAG) for r in by_pe["alibi"] if r.info.status == "FINISHED"} == {ALIBI}
    assert client.get_run(parent).info.status == "FINISHED"
    assert len([r for r in after if synthetic_grid.GRID_TAG in r.data.tags]) == 1  # no second grid
    assert not kept.parent.exists()  # the kept weights are deleted once the analysis is stored


def test_ctrl_c_in_a_cell_resumes_it_from_its_checkpoint_to_the_tables_of_a_grid_never_stopped(tmp_path):
    """Ctrl-C while a cell trains, after its first checkpoint: exit 130, no traceback, one line naming the cell and the
    step it resumes from; the same command again resumes it there and ends with the results of a grid never stopped."""
    track = TrackingConfig(uri=f"sqlite:///{tmp_path}/mlflow.db", artifact_root=str(tmp_path / "artifacts"))
    recipe = ["pos_encodings=[alibi]", "attention_examples_per_length=0", "base.trainer.max_steps=100",
              "base.trainer.val_every_n_steps=25", "base.optim.lr=1e-2"]
    command = [sys.executable, "-m", "nope_lightning.cli", "run", "synthetic-grid", str(grid_file(tmp_path, track)),
               *recipe]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = tmp_path / "stop.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            deadline = time.monotonic() + 300
            while not list(tmp_path.glob("checkpoints/synthetic-grid/*/copy_repeat_s0_alibi_training/checkpoints/*")):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 130
        finally:
            proc.kill()
    text = log.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    (line,) = [line for line in text.splitlines() if line.startswith("nope-lightning: stopped")]
    prefix = (f"nope-lightning: stopped synthetic-grid; rerun the same command to resume — it keeps every finished "
              f"cell; {ALIBI}, stopped in training, resumes from its checkpoint at step ")
    assert line.startswith(prefix), line
    step = int(line.removeprefix(prefix))
    assert 25 <= step < 100 and step % 25 == 0

    rerun = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"synthetic synthetic-copy_repeat-alibi-s0: resumes from its checkpoint at step {step}" in rerun.stderr
    resumed = SyntheticGridResult.from_dict(json.loads(rerun.stdout))
    assert not list(tmp_path.glob("checkpoints/synthetic-grid/*"))  # the cell's checkpoints went with it

    other = tmp_path / "never_stopped"
    other.mkdir()
    track = TrackingConfig(uri=f"sqlite:///{other}/mlflow.db", artifact_root=str(other / "artifacts"))
    command[5] = str(grid_file(other, track))
    plain = subprocess.run(command, cwd=other, env=env, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr[-3000:]
    never_stopped = SyntheticGridResult.from_dict(json.loads(plain.stdout))
    assert (resumed.mrr, resumed.ood, resumed.tables) == (never_stopped.mrr, never_stopped.ood, never_stopped.tables)
    timeless = [dataclasses.replace(r, run_id="", train_seconds=0.0, eval_seconds=0.0)
                for r in (*resumed.runs, *never_stopped.runs)]
    assert timeless[0] == timeless[1] and timeless[0].best_step > 25  # selection past the first validation


def tiny_grid(track_overrides: list[str], *more: str) -> SyntheticGridConfig:
    return load_config(SyntheticGridConfig, None, [*(f"base.{o}" for o in track_overrides), "tasks=[copy_repeat]",
                                                   "pos_encodings=[nope]", "attention_examples_per_length=0", *more])


def test_a_grid_still_running_in_a_live_process_is_refused(tracking_overrides):
    cfg = tiny_grid(tracking_overrides)
    track = cfg.base.tracking
    running = tracking.create_run(track, "synthetic-grid", cfg.run_name, cfg)  # owned by this live process
    tracking.client(track).set_tag(running, synthetic_grid.GRID_TAG, cfg.config_hash)
    with pytest.raises(ValueError, match=f"synthetic-grid 'synthetic-grid-1x1x1' is already running as run {running} "
                                         f"\\(process {tracking.owner()}\\); wait for it, or stop it and run the same "
                                         f"command again to resume it"):
        synthetic_grid.run(cfg)
    assert [r.info.run_id for r in runs(track)] == [running]  # nothing started
    # Its process dead (a pid beyond any pid_max on this host), the grid is continued by this process.
    tracking.client(track).set_tag(running, tracking.OWNER_TAG, f"{socket.gethostname()}:4999999:")
    assert synthetic_grid.open_grid(cfg) == synthetic_grid.Grid(running, {}, set())
    assert tracking.client(track).get_run(running).data.tags[tracking.OWNER_TAG] == tracking.owner()


def test_the_config_hash_is_what_a_rerun_finds_the_grid_by(tracking_overrides):
    cfg = tiny_grid(tracking_overrides)
    assert tiny_grid(tracking_overrides).config_hash == cfg.config_hash  # the same command: the same grid
    assert len(cfg.config_hash) == 16
    others = [tiny_grid(tracking_overrides, "seeds=[1]"), tiny_grid(tracking_overrides, "base.n_test=17"),
              tiny_grid(tracking_overrides, "base.tracking.parent_run_id=abc")]  # nested in another pipeline run
    assert len({cfg.config_hash, *(other.config_hash for other in others)}) == 4


def test_the_stored_attention_analysis_round_trips(tmp_path):
    stored = SeedAttention("copy_repeat", 3, TaskAttention({"alibi": {5: 0.125, 6: 0.1}}, {"alibi": {5: [0.1, 0.15]}},
                                                           {"nope": [1, 0, 2], "alibi": [0, 3, 0]}, [0.0, 0.5, 1.0]))
    stored.save(tmp_path / "copy_repeat_s3.json")
    assert SeedAttention.load(tmp_path / "copy_repeat_s3.json") == stored  # lengths are ints again
