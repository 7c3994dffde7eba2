"""Real multi-process runs on the CPU: evaluate with 2 DDP processes (gloo) gives the 1-process metrics, and
two processes preparing the same data build it once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO


def run_cli(args: list[str], cwd) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "nope_lightning.cli", "run", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow  # ~38 s on 2 CPU cores; run with -m slow before touching the evaluation's sharding
def test_evaluate_on_two_processes_equals_one_process(tiny_pretrained, tmp_path):
    args = ["evaluate", f"checkpoint={tiny_pretrained['model']}", *tiny_pretrained["tracking"],
            "eval_lengths=[64,128]", "ppl_tokens=512", "passkey_keys=1", "passkey_depths=2",
            "passkey_lengths=[256]", "longctx_samples=0", "trainer.progress_bar=false", "trainer.accelerator=cpu"]
    one = run_cli(args, tmp_path)
    two = run_cli([*args, "trainer.devices=2", "trainer.strategy=ddp"], tmp_path)
    metrics = {k for k in one if k != "run_id"}
    assert metrics == {k for k in two if k != "run_id"}
    assert {"test/len64/ppl", "test/len128/entropy", "passkey/len256/acc"} <= metrics
    for key in metrics:  # windows sharded over ranks, sums synced: the same numbers
        assert two[key] == pytest.approx(one[key], rel=1e-6), key


def test_concurrent_prepares_build_the_data_once(tmp_path):
    log = tmp_path / "builds.txt"
    script = textwrap.dedent(f"""
        import importlib
        import os
        from nope_lightning.config import DataConfig
        prep = importlib.import_module("nope_lightning.data.prepare")  # the module, not the function
        build = prep._build
        def counted(*args, **kwargs):
            with open({str(log)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            return build(*args, **kwargs)
        prep._build = counted
        print(prep.prepare(DataConfig(corpus="tiny", vocab_size=300, cache_dir={str(tmp_path / 'cache')!r})).key)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    keys = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        keys.append(out.strip())
    assert keys[0] == keys[1]
    assert len(log.read_text().splitlines()) == 1  # one process built, the other read the cache
