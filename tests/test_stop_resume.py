"""Stop and resume that tell the truth: Ctrl-C or SIGTERM ends a pipeline or a stage in one line with exit code
130 / 143, every run it opened KILLED, and the rerun continues those runs from their checkpoint (or restarts them
without one) instead of opening same-named new ones; SIGTERM under 2-process DDP ends within seconds even when
it lands while one rank is in its forward and the other in the gradient all-reduce; a dry run writes nothing to
the store; ``last.ckpt`` is also written by training time."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

from nope_lightning import cli
from nope_lightning.config.parts import TrackingConfig
from nope_lightning.runtime import tracking
from nope_lightning.stages.registry import run_stage, stage_config
from tests.conftest import REPO

TINY = str(REPO / "conf/pretrain/tiny.yaml")
STOP = re.compile(r"^nope-lightning: stopped .*$", re.M)


def start(args: list[str], cwd: Path, log: Path, script: str = "-m nope_lightning.cli") -> subprocess.Popen:
    """``python <script> run <args>`` in its own session (as a terminal's job), stderr into ``log``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, *script.split(), "run", *args], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=log.open("w"), start_new_session=True)


def wait_for(condition, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def runs(store: Path) -> list:
    """``(name, stage, status, run id)`` of every run of the store's experiment, oldest first."""
    cfg = TrackingConfig(uri=f"sqlite:///{store}/mlflow.db", artifact_root=str(store / "artifacts"))
    found = tracking.client(cfg).search_runs([tracking.experiment_id(cfg)], order_by=["attributes.start_time ASC"])
    return [(r.info.run_name, r.data.tags.get("stage"), r.info.status, r.info.run_id) for r in found]


def pipeline_file(tmp_path: Path, data_cache: str, subprocess_step: bool, *overrides: str) -> Path:
    path = tmp_path / "stop.yaml"
    path.write_text(textwrap.dedent(f"""
        name: stop_test
        report: false
        common: [trainer.progress_bar=false, "data.cache_dir={data_cache}", trainer.val_every_n_steps=0]
        steps:
          - {{id: pretrain_nope, stage: pretrain, config: {TINY}, subprocess: {str(subprocess_step).lower()},
             overrides: [{", ".join(overrides)}]}}
    """))
    return path


def test_sigterm_stops_a_pipeline_in_one_line_and_the_rerun_resumes_its_runs(tmp_path, data_cache):
    """A subprocess step: the pipeline kills the step's process group; the step stops at a step boundary, marks
    its run KILLED and tells the pipeline what it resumes; the rerun finishes in the same two runs."""
    file = pipeline_file(tmp_path, data_cache, True, "trainer.max_steps=60", "trainer.checkpoint_every_n_steps=5",
                         "trainer.checkpoint_minutes=0")
    args = ["pipeline", str(file), f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
            f"tracking.artifact_root={tmp_path}/artifacts"]
    last = tmp_path / "mlruns/checkpoints/pretrain/pretrain-nope-tiny-L64-s1234/checkpoints/last.ckpt"
    proc = start(args, tmp_path, tmp_path / "first.log")
    wait_for(last.exists)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    log = (tmp_path / "first.log").read_text()
    assert "Traceback" not in log and "Received SIGTERM" not in log
    (line,) = STOP.findall(log)
    match = re.fullmatch(r"nope-lightning: stopped at step 1 of 1 \(pretrain pretrain_nope\); finished "
                         r"steps are kept; rerun the same command to resume — this step resumes from its checkpoint "
                         r"at step (\d+)", line)
    assert match, line
    step = int(match[1])
    assert step > 0 and step % 5 == 0 and torch.load(last, weights_only=True)["global_step"] == step
    (parent, child) = runs(tmp_path)
    assert parent[1:3] == ("pipeline", "KILLED") and child[1:3] == ("pretrain", "KILLED")

    rerun = start(args, tmp_path, tmp_path / "second.log")
    assert rerun.wait(timeout=240) == 0, (tmp_path / "second.log").read_text()[-3000:]
    log = (tmp_path / "second.log").read_text()
    assert f"pretrain pretrain-nope-tiny-L64-s1234: resumes from its checkpoint at step {step} (MLflow run " \
           f"{child[3]})" in log
    assert [r[2:] for r in runs(tmp_path)] == [("FINISHED", parent[3]), ("FINISHED", child[3])]  # no new runs


def test_ctrl_c_before_the_first_checkpoint_restarts_the_step_in_its_own_run(tmp_path, data_cache):
    """An in-process step stopped before its first checkpoint: the line says it restarts, and the rerun restarts
    it in the same (KILLED, now RUNNING again) run rather than beside it; SIGTERM then stops the rerun too."""
    file = pipeline_file(tmp_path, data_cache, False, "trainer.max_steps=100000",
                         "trainer.checkpoint_every_n_steps=100000", "trainer.checkpoint_minutes=0")
    args = ["pipeline", str(file), f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
            f"tracking.artifact_root={tmp_path}/artifacts"]
    out = tmp_path / "mlruns/checkpoints/pretrain/pretrain-nope-tiny-L64-s1234"
    proc = start(args, tmp_path, tmp_path / "first.log")
    wait_for((out / "mlflow_run_id").exists)
    time.sleep(1.0)  # into the training loop
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    log = (tmp_path / "first.log").read_text()
    assert "Traceback" not in log and "KeyboardInterrupt" not in log
    assert STOP.findall(log) == ["nope-lightning: stopped at step 1 of 1 (pretrain pretrain_nope); "
                                 "finished steps are kept; rerun the same command to resume — this step restarts: "
                                 "no checkpoint yet"]
    (parent, child) = runs(tmp_path)
    assert parent[2] == child[2] == "KILLED"

    rerun = start(args, tmp_path, tmp_path / "second.log")
    said = f"pretrain pretrain-nope-tiny-L64-s1234: restarts from step 0: no checkpoint yet (MLflow run {child[3]})"
    wait_for(lambda: said in (tmp_path / "second.log").read_text())
    wait_for(lambda: [r[2] for r in runs(tmp_path)] == ["RUNNING", "RUNNING"], timeout=60)  # the same two runs
    rerun.send_signal(signal.SIGTERM)
    assert rerun.wait(timeout=60) == 143
    assert [r[2:] for r in runs(tmp_path)] == [("KILLED", parent[3]), ("KILLED", child[3])]


#: A pretrain under 2-process DDP whose rank 1 is held inside its forward (``training_step`` runs inside DDP's
#: forward) at step 3 until the stop signal lands, while rank 0 is past its forward into the backward, whose
#: gradient all-reduce waits for rank 1: the race in which a collective in the signal handler deadlocks.
HELD = """
import os, sys, time
from pathlib import Path
from nope_lightning import cli
from nope_lightning.training.module import CausalLM

step, marks = CausalLM.training_step, Path(os.environ["HOLD_MARKS"])

def training_step(self, batch, batch_idx):
    if self.global_step == 3 and self.global_rank == 1:
        (marks / "rank1_forward").write_text(str(os.getpid()))
        deadline = time.monotonic() + 60
        while not self.trainer.received_sigterm and time.monotonic() < deadline:
            time.sleep(0.01)
    return step(self, batch, batch_idx)

def on_before_backward(self, loss):
    if self.global_step == 3 and self.global_rank == 0:
        (marks / "rank0_backward").write_text(str(os.getpid()))

CausalLM.training_step, CausalLM.on_before_backward = training_step, on_before_backward
sys.exit(cli.main(sys.argv[1:]))
"""


def test_sigterm_during_a_ddp_step_ends_both_ranks_within_seconds(tmp_path, data_cache):
    script = tmp_path / "held.py"
    script.write_text(HELD)
    os.environ["HOLD_MARKS"] = str(tmp_path)
    try:
        proc = start(["pretrain", TINY, f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
                      f"tracking.artifact_root={tmp_path}/artifacts", f"out_dir={tmp_path}/run",
                      f"data.cache_dir={data_cache}", "trainer.progress_bar=false", "trainer.accelerator=cpu",
                      "trainer.devices=2", "trainer.strategy=ddp", "trainer.max_steps=50"],
                     tmp_path, tmp_path / "ddp.log", script=str(script))
    finally:
        del os.environ["HOLD_MARKS"]
    wait_for(lambda: (tmp_path / "rank1_forward").exists() and (tmp_path / "rank0_backward").exists())
    time.sleep(0.5)  # rank 0 is in the gradient all-reduce, rank 1 in its forward
    rank1 = int((tmp_path / "rank1_forward").read_text())
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)  # as `timeout` does: the command's whole group
    assert proc.wait(timeout=30) == 143, (tmp_path / "ddp.log").read_text()[-3000:]
    assert time.monotonic() - sent < 30
    wait_for(lambda: not Path(f"/proc/{rank1}").exists() or "Z" in Path(f"/proc/{rank1}/stat").read_text()
             .rsplit(")", 1)[1].split()[:1], timeout=10)
    log = (tmp_path / "ddp.log").read_text()
    assert "Traceback" not in log
    assert STOP.findall(log) == ["nope-lightning: stopped pretrain; rerun the same command to resume — it "
                                 "restarts: no checkpoint yet"]  # one line: rank 1 says nothing
    assert [r[2] for r in runs(tmp_path)] == ["KILLED"]


def test_a_dry_run_writes_nothing_to_the_store(tmp_path, tracking_overrides):
    """Neither an experiment created, nor a dead process's RUNNING run closed: the store's bytes stay as they
    were; and with no store at all, the dry run still plans and creates none."""
    cfg = TrackingConfig(uri=f"sqlite:///{tmp_path}/mlflow.db", artifact_root=f"{tmp_path}/artifacts",
                         experiment="elsewhere")
    dead_owner = f"{socket.gethostname()}:999999999:1"
    run = tracking.client(cfg).create_run(tracking.experiment_id(cfg), tags={tracking.OWNER_TAG: dead_owner})
    db = tmp_path / "mlflow.db"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    pipeline = str(REPO / "experiments/tiny/tiny.yaml")
    plan = run_stage("pipeline", stage_config("pipeline", pipeline, [*tracking_overrides, "dry_run=true"]))
    assert len(plan["steps"]) == 7
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert tracking.client(cfg).get_run(run.info.run_id).info.status == "RUNNING"
    assert tracking.existing_experiment_id(TrackingConfig(uri=cfg.uri, artifact_root=cfg.artifact_root)) is None

    nothing = tmp_path / "none"
    nothing.mkdir()
    run_stage("pipeline", stage_config("pipeline", pipeline, [f"tracking.uri=sqlite:///{nothing}/mlflow.db",
                                                              f"tracking.artifact_root={nothing}/artifacts",
                                                              "dry_run=true"]))
    assert list(nothing.iterdir()) == []


def test_last_checkpoint_is_written_by_training_time_too(tmp_path, tracking_overrides, data_cache):
    """``checkpoint_minutes`` writes ``last.ckpt`` between the step checkpoints (none here: every 1000 steps)."""
    result = run_stage("pretrain", stage_config("pretrain", TINY, [
        *tracking_overrides, f"data.cache_dir={data_cache}", f"out_dir={tmp_path}/run", "trainer.progress_bar=false",
        "trainer.max_steps=3", "trainer.val_every_n_steps=0", "trainer.checkpoint_every_n_steps=1000",
        "trainer.checkpoint_minutes=0.00001"]))
    assert result["step"] == 3
    assert sorted(p.name for p in (tmp_path / "run/checkpoints").iterdir()) == ["last.ckpt"]
    assert torch.load(tmp_path / "run/checkpoints/last.ckpt", weights_only=True)["global_step"] == 3


def test_a_stop_kills_this_process_runs_and_dead_ones_but_not_live_ones(tmp_path):
    cfg = TrackingConfig(uri=f"sqlite:///{tmp_path}/mlflow.db", artifact_root=f"{tmp_path}/artifacts")
    client, exp = tracking.client(cfg), tracking.experiment_id(cfg)
    live = subprocess.Popen(["sleep", "60"])
    try:
        owners = {"mine": tracking.owner(), "dead": f"{socket.gethostname()}:999999999:1",
                  "live": tracking.owner(live.pid)}
        ids = {name: client.create_run(exp, tags={tracking.OWNER_TAG: value}).info.run_id
               for name, value in owners.items()}
        assert sorted(tracking.stop_runs(cfg)) == sorted([ids["mine"], ids["dead"]])
        assert {n: client.get_run(i).info.status for n, i in ids.items()} == {
            "mine": "KILLED", "dead": "KILLED", "live": "RUNNING"}
    finally:
        live.kill()
        live.wait()


def held_write(tmp_path: Path, opened: list[str]):
    """A stand-in for ``run_stage``: opens an MLflow run in the store, then takes the store's SQLite write lock in
    its own frame (as an MLflow write does) when SIGTERM arrives; the signal raises there."""
    def stage(name, cfg):
        opened.append(tracking.create_run(cfg.tracking, name, "held", cfg))
        writer = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # not reached: the signal raises Stopped first
    return stage


def test_a_stop_landing_inside_a_store_write_still_marks_the_run_killed_at_once(tmp_path, tracking_overrides,
                                                                               monkeypatch, capsys):
    """The stop's cleanup runs once the interrupted frames are released, so the write lock they held is gone:
    handled inside the ``except`` clause, the traceback kept the lock and MLflow gave up after its 20 s busy wait,
    leaving the run RUNNING."""
    opened: list[str] = []
    monkeypatch.setattr(cli, "run_stage", held_write(tmp_path, opened))
    t0 = time.monotonic()
    assert cli.main(["run", "pretrain", *tracking_overrides]) == 143
    assert time.monotonic() - t0 < 15
    assert [r[2:] for r in runs(tmp_path)] == [("KILLED", opened[0])]
    assert STOP.findall(capsys.readouterr().err) == ["nope-lightning: stopped pretrain; rerun the same command to "
                                                     "resume — it starts again"]


def test_a_stop_that_cannot_mark_its_runs_says_so_in_one_line(tmp_path, tracking_overrides, monkeypatch, capsys):
    """Every attempt failing: the stop line, and one line saying the next command on the store closes the runs."""
    calls = []

    def broken(cfg):
        calls.append(cfg)
        raise OSError("store unreachable")

    monkeypatch.setattr(cli, "run_stage", lambda name, cfg: os.kill(os.getpid(), signal.SIGINT) or time.sleep(30))
    monkeypatch.setattr(tracking, "stop_runs", broken)
    assert cli.main(["run", "pretrain", *tracking_overrides]) == 130
    err = capsys.readouterr().err
    assert len(calls) == 2 and "Traceback" not in err
    assert err.splitlines() == [
        "nope-lightning: note: could not mark this command's MLflow runs KILLED (OSError: store unreachable); the "
        "next command on the same store does",
        "nope-lightning: stopped pretrain; rerun the same command to resume — it starts again"]
