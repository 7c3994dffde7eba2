"""Real faults: unusable tracking stores fail fast in one line, two processes on a new store, a damaged
checkpoint, a SIGKILLed HeadScale run resumed bit for bit, an out_dir of another store, a second writer of an
out_dir, and download folders that outlive their process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from nope_lightning import cli
from nope_lightning.config import HeadScaleConfig, TrackingConfig, load_config
from nope_lightning.model.checkpoint import torch_load
from nope_lightning.runtime import tracking
from tests.conftest import REPO

TINY_PRETRAIN = str(REPO / "conf/pretrain/tiny.yaml")
TINY_HEADSCALE = str(REPO / "conf/headscale/tiny.yaml")


def one_line_error(args: list[str], capsys) -> tuple[int, str, float]:
    """Exit code, stderr and seconds of ``nope-lightning <args>`` run in this process."""
    capsys.readouterr()
    start = time.perf_counter()
    code = cli.main(args)
    return code, capsys.readouterr().err, time.perf_counter() - start


def python(code: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=600, **kwargs)


# --- fail fast on the tracking store ---------------------------------------------------------------------


def test_an_unreachable_store_fails_in_seconds_with_one_line_and_no_compute(tmp_path, capsys):
    cache = tmp_path / "cache"
    code, err, seconds = one_line_error(["run", "pretrain", TINY_PRETRAIN, "tracking.uri=http://127.0.0.1:9/",
                                         f"data.cache_dir={cache}", f"out_dir={tmp_path}/run"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "tracking.uri=http://127.0.0.1:9/" in err and "cannot be used" in err and "Connection refused" in err
    assert seconds < 30
    assert not cache.exists() and not (tmp_path / "run").exists()  # no data prepared, nothing trained
    assert os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES") is None  # later calls keep MLflow's retries


def without_root_override() -> None:
    """A ``preexec_fn``: drop root's power to write into read-only folders (CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH leave the bounding set, so the exec'd process never has them)."""
    import ctypes

    pr_capbset_drop, cap_dac_override, cap_dac_read_search = 24, 1, 2
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (cap_dac_override, cap_dac_read_search):
        if libc.prctl(pr_capbset_drop, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_read_only_store_and_artifact_root_fail_in_one_line(tmp_path):
    """A SQLite store in a read-only folder, then a read-only artifact root."""
    locked, writable = tmp_path / "locked", tmp_path / "writable"
    locked.mkdir(mode=0o555)
    writable.mkdir()
    script = f"""
        import contextlib, io, json, time
        from nope_lightning import cli
        out = []
        for store, artifacts in [("{locked}/mlflow.db", "{writable}/artifacts"),
                                 ("{writable}/mlflow.db", "{locked}/artifacts")]:
            err, start = io.StringIO(), time.perf_counter()
            with contextlib.redirect_stderr(err):
                code = cli.main(["run", "pretrain", "{TINY_PRETRAIN}", "tracking.uri=sqlite:///" + store,
                                 "tracking.artifact_root=" + artifacts, "out_dir={writable}/run",
                                 "data.cache_dir={writable}/cache"])
            out.append([code, err.getvalue(), time.perf_counter() - start])
        print(json.dumps(out))
    """
    try:
        proc = python(script, tmp_path, preexec_fn=without_root_override if os.getuid() == 0 else None)
    finally:
        locked.chmod(0o755)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (code1, err1, s1), (code2, err2, s2) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert code1 == 2 and err1.count("\n") == 1 and f"cannot write to {locked}" in err1, err1
    assert code2 == 2 and err2.count("\n") == 1 and f"cannot write to {locked}/artifacts" in err2, err2
    assert "artifact root" in err2 and s1 < 30 and s2 < 30
    assert not (writable / "run").exists() and not (writable / "cache").exists()


def test_runs_references_fail_in_one_line(tiny_pretrained, tmp_path, capsys):
    store = TrackingConfig(**{k.removeprefix("tracking."): v for k, v in
                              (o.split("=", 1) for o in tiny_pretrained["tracking"])})
    bare = tracking.create_run(store, "pretrain", "no-model", store)
    tracking.end_run(store, bare)
    for ref, message in [("runs:/0123456789abcdef/model", "has no run 0123456789abcdef"),
                         (f"runs:/{bare}/model", f"run {bare} has no artifact 'model' (it has config.yaml)")]:
        code, err, _ = one_line_error(["run", "evaluate", f"checkpoint={ref}", *tiny_pretrained["tracking"],
                                       "eval_lengths=[64]"], capsys)
        assert code == 2 and err.count("\n") == 1 and message in err, err


def test_a_refused_checkpoint_keeps_torch_whole_reason(tmp_path):
    path = tmp_path / "pickled.ckpt"
    torch.save({"state_dict": {}, "not_a_tensor": zipfile.ZipInfo("x")}, path)  # a global weights_only refuses
    with pytest.raises(ValueError) as info:
        torch_load(path)
    message = str(info.value)
    assert "\n" not in message and len(message) > 400
    assert "zipfile.ZipInfo" in message and "no intact checkpoint is beside it" in message


# --- one new store, two processes -------------------------------------------------------------------------


def test_two_stages_started_together_on_a_new_store_both_finish(tiny_pretrained, data_cache, tmp_path):
    store = [f"tracking.uri=sqlite:///{tmp_path}/new/mlflow.db", f"tracking.artifact_root={tmp_path}/new/artifacts"]
    procs = [subprocess.Popen([sys.executable, "-m", "nope_lightning.cli", "run", "headscale", TINY_HEADSCALE,
                               *store, f"checkpoint={tiny_pretrained['model']}", f"out_dir={tmp_path}/hs{i}",
                               "steps=2", "entropy_windows=0", "trainer.progress_bar=false"],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    errors = [p.communicate(timeout=600)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for e in errors]
    client = MlflowClient(store[0].split("=", 1)[1])
    runs = client.search_runs([client.get_experiment_by_name("nope_lightning").experiment_id])
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED"]


# --- checkpoint integrity ----------------------------------------------------------------------------------


def flip_tensor_bytes(path: Path, count: int = 64) -> None:
    """Invert ``count`` bytes in the middle of the largest tensor record of a torch zip checkpoint."""
    with zipfile.ZipFile(path) as archive:
        record = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(record.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        start = record.header_offset + 30 + name_len + extra_len + record.file_size // 2
        f.seek(start)
        data = bytes(b ^ 0xFF for b in f.read(count))
        f.seek(start)
        f.write(data)


def test_a_damaged_checkpoint_is_refused_naming_the_newest_intact_one(tiny_pretrained, data_cache, tmp_path,
                                                                      tracking_overrides, capsys):
    run = tmp_path / "run"
    shutil.copytree(Path(tiny_pretrained["out_dir"]), run)
    (run / "mlflow_run_id").unlink()  # the copy continues in this test's store, not in the fixture's run
    last = run / "checkpoints" / "last.ckpt"
    assert torch_load(last)["global_step"] == 40
    flip_tensor_bytes(last)
    newest = run / "checkpoints" / "step000040.ckpt"
    with pytest.raises(ValueError, match=f"fails its CRC check.*newest intact checkpoint is {newest}"):
        torch_load(last)
    args = ["run", "pretrain", TINY_PRETRAIN, *tracking_overrides, f"data.cache_dir={data_cache}", f"out_dir={run}",
            "trainer.progress_bar=false"]
    before = last.read_bytes()
    code, err, _ = one_line_error([*args, "trainer.max_steps=60"], capsys)
    assert code == 2 and err.count("\n") == 1 and "corrupt checkpoint" in err and str(newest) in err
    assert last.read_bytes() == before and sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "last.ckpt", "step000010.ckpt", "step000020.ckpt", "step000030.ckpt", "step000040.ckpt"]
    last.unlink()  # the advice works: the run resumes from step 40 and trains on
    assert cli.main([*args, "trainer.max_steps=50"]) == 0
    assert torch_load(last)["global_step"] == 50


# --- a killed HeadScale run: closed, then resumed bit for bit ------------------------------------------------


def test_a_killed_headscale_run_is_closed_and_resumes_bit_identically(tiny_pretrained, tmp_path):
    overrides = [*tiny_pretrained["tracking"], f"checkpoint={tiny_pretrained['model']}", "steps=12",
                 "trainer.checkpoint_every_n_steps=4", "trainer.log_every_n_steps=1", "trainer.val_every_n_steps=4",
                 "entropy_windows=0", "trainer.progress_bar=false"]
    from nope_lightning.stages import headscale

    straight = headscale.run(load_config(HeadScaleConfig, TINY_HEADSCALE, [*overrides, f"out_dir={tmp_path}/a"]))
    killed_cfg = load_config(HeadScaleConfig, TINY_HEADSCALE, [*overrides, f"out_dir={tmp_path}/b"])
    # SIGKILL from inside at the start of step 7: steps 5 and 6 were logged after the step-4 checkpoint.
    proc = python(f"""
        import os, signal
        from lightning.pytorch.callbacks import Callback
        from nope_lightning.config import HeadScaleConfig, load_config
        from nope_lightning.stages import headscale

        class Kill(Callback):
            def on_train_batch_start(self, trainer, module, batch, batch_idx):
                if trainer.global_step == 6:
                    os.kill(os.getpid(), signal.SIGKILL)

        headscale.run(load_config(HeadScaleConfig, {TINY_HEADSCALE!r}, {[*overrides, f"out_dir={tmp_path}/b"]!r}),
                      callbacks=[Kill()])
    """, tmp_path)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    run_id = (tmp_path / "b/mlflow_run_id").read_text()
    client = MlflowClient(killed_cfg.tracking.uri)
    assert client.get_run(run_id).info.status == "RUNNING"
    tracking.check_store(killed_cfg)  # what every stage does first
    assert client.get_run(run_id).info.status == "KILLED"

    resumed = headscale.run(killed_cfg)
    assert resumed["run_id"] == run_id and resumed["step"] == 12
    assert client.get_run(run_id).info.status == "FINISHED"
    from safetensors.torch import load_file

    a, b = load_file(straight["table"]), load_file(resumed["table"])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit
    for key in ("headscale/lambda_mean", "train/loss", "headscale/init_lambda", "val/len128/loss"):
        want = [(m.step, m.value) for m in client.get_metric_history(straight["run_id"], key)]
        got = [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
        assert sorted(got) == sorted(want), key  # each step once, no replayed duplicates
    assert len(list((tmp_path / "b/checkpoints").glob("*.ckpt"))) == 4  # step 4, 8, 12 and last
    assert (tmp_path / "b/checkpoints/last.ckpt").stat().st_size < 100_000  # the temperatures, not the weights


# --- an out_dir of another store, a second writer -----------------------------------------------------------


def test_an_out_dir_of_another_store_stops_with_one_line(tiny_pretrained, data_cache, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(Path(tiny_pretrained["out_dir"]), run)
    args = ["run", "pretrain", TINY_PRETRAIN, f"data.cache_dir={data_cache}", f"out_dir={run}"]
    other = [f"tracking.uri=sqlite:///{tmp_path}/other.db", f"tracking.artifact_root={tmp_path}/artifacts"]
    code, err, _ = one_line_error([*args, *other], capsys)
    saved_uri = tiny_pretrained["tracking"][0].split("=", 1)[1]
    assert code == 2 and err.count("\n") == 1, err
    assert f"pass tracking.uri={saved_uri} to continue it" in err and "another out_dir=" in err
    # The same store deleted: the out_dir names a run that is gone.
    config = run / "config.yaml"
    config.write_text(config.read_text().replace(saved_uri, other[0].split("=", 1)[1]))
    code, err, _ = one_line_error([*args, *other], capsys)
    assert code == 2 and err.count("\n") == 1 and "which no longer holds it" in err, err


def test_a_second_writer_of_an_out_dir_is_refused(tiny_pretrained, data_cache, tmp_path, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from nope_lightning.training.trainer import out_dir_lock
        from pathlib import Path
        with out_dir_lock(Path({str(out)!r})):
            print("locked", flush=True)
            time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, err, _ = one_line_error(["run", "pretrain", TINY_PRETRAIN, *tiny_pretrained["tracking"],
                                       f"data.cache_dir={data_cache}", f"out_dir={out}"], capsys)
        assert code == 2 and err.count("\n") == 1, err
        assert f"out_dir={out} is in use by another process (pid {holder.pid})" in err
    finally:
        holder.kill()
        holder.wait()
    assert not out.exists()


# --- download folders ---------------------------------------------------------------------------------------


def test_download_folders_are_removed_with_their_process(tiny_pretrained, tmp_path):
    store = dict(o.split("=", 1) for o in tiny_pretrained["tracking"])
    run_id = tiny_pretrained["run_id"]
    orphan = Path(tempfile.gettempdir()) / "nope_lightning_999999999_x"  # a folder of a process that died
    orphan.mkdir(exist_ok=True)
    proc = python(f"""
        from nope_lightning.runtime import tracking
        from nope_lightning.config import TrackingConfig
        cfg = TrackingConfig(uri={store['tracking.uri']!r}, artifact_root={store['tracking.artifact_root']!r})
        print(tracking.download(cfg, {run_id!r}, "model"))
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = Path(proc.stdout.strip().splitlines()[-1])
    assert folder.name == "model" and folder.parent.parent.name.startswith("nope_lightning_")
    assert not folder.exists() and not folder.parent.parent.exists()
    assert not orphan.exists()
