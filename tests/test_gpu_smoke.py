"""tools/gpu_smoke.py on the CPU at the tiny size: its JSON fields, and its FLOP formula against an
independent count of one forward pass (torch's FlopCounterMode)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from nope_lightning.model import GPT
from tests.conftest import REPO

SCRIPT = REPO / "tools/gpu_smoke.py"


@pytest.fixture(scope="module")
def smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # ~38 s on 2 CPU cores: the script is the device's check; CI keeps its time for the CPU paths
def test_tiny_cpu_run_prints_every_field(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--size", "tiny", "--steps", "6",
                           "--warmup", "2", "--peak-tflops", "1", "--attention-iters", "2"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout[done.stdout.index("{"):])
    assert result["device"] == "cpu" and result["world_size"] == 1 and result["strategy"] == "fsdp2"
    assert (result["n_layer"], result["n_embd"], result["seq_len"], result["timed_steps"]) == (2, 64, 64, 4)
    assert result["tokens_per_s"] > 0 and torch.isfinite(torch.tensor(result["final_loss"]))
    assert result["mfu"] == pytest.approx(result["tokens_per_s"] * result["flops_per_token"] / 1e12)
    assert result["activation_checkpointing"] == {"setting": "auto", "on": False}  # a tiny model fits
    # The recipe's settings, on the CPU: compiled blocks, fused AdamW; the attention timed both ways
    assert result["accumulate"] == 1 and result["compile"] is True and result["fused_adamw"] is True
    assert set(result["attention_lambda"]) == {"eager", "compiled"}
    for lam in result["attention_lambda"].values():
        assert lam["plain_ms"] > 0 and lam["lambda_ms"] > 0 and lam["goal"] == 0.97
        assert lam["throughput_ratio"] == pytest.approx(lam["plain_ms"] / lam["lambda_ms"])


@pytest.mark.parametrize("size", ["tiny", "120m"])
def test_flop_formula_matches_a_counted_forward(smoke, size):
    """Matmuls (aten.mm: every Linear, lm_head included) are 2 N per token forward; attention under the math
    backend is two batched matmuls over the full T x T square (aten.bmm), 4 T d per layer and token, of which
    the causal mask keeps half. Training = 3 x forward (backward = 2 x forward). Exact, at two sizes."""
    cfg = smoke.smoke_config(size, ["train_len=128"])
    with torch.device("meta"):  # shapes suffice to count: no memory, no compute
        model = GPT(cfg.model, cfg.data.vocab_size, cfg.train_len)
        tokens = torch.zeros(1, cfg.train_len, dtype=torch.long)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), counter:
        model(tokens)
    ops = {str(op).split(".")[1]: n for op, n in counter.get_flop_counts()["Global"].items()}
    assert set(ops) == {"mm", "bmm"}
    per_token = 3 * (ops["mm"] + ops["bmm"] / 2) / cfg.train_len
    # The formula's N also holds the norm gains and λ (vectors, no matmul): 6 FLOPs each, < 0.3% here.
    vectors = sum(p.numel() for p in model.parameters() if p.dim() < 2)
    assert smoke.model_flops_per_token(model, cfg.train_len) - 6 * vectors == per_token


def test_peak_table_and_unknown_devices(smoke):
    assert smoke.peak_tflops("NVIDIA H100 80GB HBM3", None) == 989.0
    assert smoke.peak_tflops("NVIDIA H100 PCIe", None) == 756.0
    assert smoke.peak_tflops("NVIDIA H200", None) == 989.0
    assert smoke.peak_tflops("NVIDIA A100-SXM4-80GB", None) == 312.0
    assert smoke.peak_tflops("cpu", 2.5) == 2.5
    with pytest.raises(ValueError, match="pass --peak-tflops"):
        smoke.peak_tflops("NVIDIA GeForce RTX 4090", None)


def test_help_documents_the_options(smoke, capsys):
    with pytest.raises(SystemExit) as done:
        smoke.parse_args(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for option in ("--size", "--steps", "--peak-tflops", "--device", "--devices", "--strategy", "--warmup"):
        assert option in text
    for field in ("tokens_per_s", "mfu", "flops_per_token", "throughput_ratio"):  # what it prints
        assert field in text


def test_bad_input_is_one_line_before_any_compute(smoke, monkeypatch):
    with pytest.raises(SystemExit, match="gpu_smoke: no bf16 peak known for 'cpu': pass --peak-tflops"):
        smoke.main(["--device", "cpu", "--size", "tiny"])
    monkeypatch.setattr("nope_lightning.training.trainer.shutil.which", lambda name: None)
    with pytest.raises(SystemExit, match=r"gpu_smoke: trainer.compile=true, but no C\+\+ compiler"):
        smoke.main(["--device", "cpu", "--size", "tiny", "--peak-tflops", "1"])
    with pytest.raises(SystemExit):  # argparse's own line: invalid choice
        smoke.parse_args(["--size", "7b"])
