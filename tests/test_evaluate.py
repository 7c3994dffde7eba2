"""The evaluate stage: window perplexity against a brute-force reference, entropy through the probe, and the
stage end to end on a tiny pretrained model."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer
from torch.utils.data import DataLoader

from nope_lightning import cli
from nope_lightning.config import ModelConfig, TrackingConfig
from nope_lightning.eval.perplexity import (
    Stream,
    WindowDataset,
    WindowEvaluator,
    sliding_windows,
    tiled_windows,
)
from nope_lightning.model import GPT
from nope_lightning.model.probes import attention_probs
from nope_lightning.run import run_stage, stage_config
from nope_lightning.tracking import download

VOCAB, L, S = 61, 12, 4


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=16, intermediate_size=32, pos_encoding="alibi", max_positions=64)
    return GPT(cfg, VOCAB, train_len=8).eval()


@pytest.fixture(scope="module")
def docs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, VOCAB, n) for n in (30, 9, 41, 13)]  # the 9-token doc is too short for L + 1


def evaluate_windows(model, docs, streams, windows, batch_size: int, world: int = 1) -> dict:
    """Run the evaluator over ``world`` simulated ranks and sum their metric states into fresh metrics
    (what a multi-process sync does), so ``compute()`` sees every rank."""
    merged = WindowEvaluator(model, streams, entropy_chunk=5)
    for rank in range(world):
        evaluator = WindowEvaluator(model, streams, entropy_chunk=5)
        loaders = [DataLoader(WindowDataset(docs, w, s.length, rank, world), batch_size=batch_size)
                   for s, w in zip(streams, windows, strict=True)]
        Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False).test(
            evaluator, dataloaders=loaders, verbose=False)
        for total, part in zip(merged.metrics, evaluator.metrics, strict=True):
            total.merge_state(part)
    return {(s.kind, s.length): m for s, m in zip(streams, merged.metrics, strict=True)}


def brute_force_nll(model, docs, length, stride) -> tuple[float, int]:
    """Each target t of each doc predicted from the window that scores it, by a separate forward of
    exactly that context (causality makes it equal to the window's row t)."""
    total, count = 0.0, 0
    for doc in docs:
        n = len(doc)
        for t in range(1, n):
            k = 0 if t <= length else math.ceil((t - length) / stride)
            start = k * stride
            if start + length + 1 > n:
                continue  # beyond the last full window: not scored
            context = torch.as_tensor(doc[start:t], dtype=torch.long)[None]
            with torch.no_grad():
                logits = model(context)[0, -1].double()
            total -= torch.log_softmax(logits, -1)[doc[t]].item()
            count += 1
    return total, count


def brute_force_nll_last_stride(model, docs, length, stride) -> tuple[float, int]:
    """``last_stride`` scoring by brute force: target t is scored once, by the window k = ceil((t - L) / S),
    and only when it falls in that window's last S targets (t > L - S) and the window fits in the doc."""
    total, count = 0.0, 0
    for doc in docs:
        for t in range(length - stride + 1, len(doc)):
            start = max(0, math.ceil((t - length) / stride)) * stride
            if start + length + 1 > len(doc):
                continue
            assert length - stride < t - start <= length  # at least L - S tokens of context
            with torch.no_grad():
                logits = model(torch.as_tensor(doc[start:t], dtype=torch.long)[None])[0, -1].double()
            total -= torch.log_softmax(logits, -1)[doc[t]].item()
            count += 1
    return total, count


def test_last_stride_windows_score_only_their_last_stride_targets():
    windows = sliding_windows([30, 9], L, S, budget=10**6)  # the default: last_stride
    assert [(w.doc, w.start, w.score_from) for w in windows] == [
        (0, 0, 8), (0, 4, 8), (0, 8, 8), (0, 12, 8), (0, 16, 8)]
    scored = [w.start + i + 1 for w in windows for i in range(w.score_from, L)]
    assert scored == list(range(9, 29))  # targets 1..8 have < L - S context: never scored
    assert len(sliding_windows([30, 9], L, S, budget=5)) == 2
    with pytest.raises(ValueError, match="last_stride or first_full"):
        sliding_windows([30], L, S, budget=10, scoring="middle")


def test_last_stride_ppl_equals_brute_force(model, docs):
    windows = [sliding_windows([len(d) for d in docs], L, S, budget=10**6)]
    total, count = brute_force_nll_last_stride(model, docs, L, S)
    metric = evaluate_windows(model, docs, [Stream("ppl", "c", L)], windows, batch_size=3)["ppl", L]
    assert int(metric.count) == count
    assert float(metric.nll_sum) / count == pytest.approx(total / count, rel=1e-6)


def test_sliding_window_windows_score_every_target_once():
    windows = sliding_windows([30, 9], L, S, budget=10**6, scoring="first_full")
    assert [(w.doc, w.start, w.score_from) for w in windows] == [
        (0, 0, 0), (0, 4, 8), (0, 8, 8), (0, 12, 8), (0, 16, 8)]
    scored = [w.start + i + 1 for w in windows for i in range(w.score_from, L)]
    assert scored == list(range(1, 29))  # targets 1..28 once each; 29 would need a window past the end
    # stops once 12 + 4 >= 13 targets are scored
    assert len(sliding_windows([30, 9], L, S, budget=13, scoring="first_full")) == 2


def test_sliding_window_ppl_equals_brute_force_whatever_batch_or_world(model, docs):
    streams = [Stream("ppl", "c", L)]
    windows = [sliding_windows([len(d) for d in docs], L, S, budget=10**6, scoring="first_full")]
    total, count = brute_force_nll(model, docs, L, S)
    for batch_size, world in ((1, 1), (3, 1), (2, 2)):
        metric = evaluate_windows(model, docs, streams, windows, batch_size, world)["ppl", L]
        assert int(metric.count) == count
        assert float(metric.nll_sum) / count == pytest.approx(total / count, rel=1e-6)
        assert float(metric.perplexity()) == pytest.approx(math.exp(total / count), rel=1e-6)


def test_probe_entropy_equals_entropy_of_the_full_attention_matrix(model, docs):
    windows = [tiled_windows([len(d) for d in docs], L, 3)]
    metric = evaluate_windows(model, docs, [Stream("entropy", "c", L)], windows, batch_size=2)["entropy", L]
    inputs = torch.stack([torch.as_tensor(docs[w.doc][w.start:w.start + L]) for w in windows[0]])
    for layer in range(2):
        probs = attention_probs(model, inputs, layer).double()
        want = -(probs * probs.clamp_min(1e-300).log()).sum(-1).mean(0)  # (H, T), nats
        assert torch.allclose(metric.compute()[layer].double(), want, atol=1e-5)
    assert torch.allclose(metric.compute()[:, :, 0], torch.zeros(2, 2, dtype=metric.compute().dtype))


@pytest.fixture(scope="module")
def evaluated(tiny_pretrained, tmp_path_factory) -> dict:
    overrides = [f"checkpoint={tiny_pretrained['model']}", *tiny_pretrained["tracking"], "trainer.progress_bar=false",
                 "ppl_tokens=512", "passkey_keys=1", "passkey_depths=2", "passkey_lengths=[256]",
                 "longctx_samples=1", "longctx_tasks=[multikey_retrieval]", "eval_lengths=[64,128]"]
    plain = run_stage("evaluate", stage_config("evaluate", None, overrides))
    scaled = run_stage("evaluate", stage_config("evaluate", None, [*overrides, "extension.temperature.uniform=1.5"]))
    return {"plain": plain, "scaled": scaled, "overrides": overrides}


def test_evaluate_logs_every_metric_and_plot(evaluated, tiny_pretrained):
    from mlflow.tracking import MlflowClient

    plain = evaluated["plain"]
    for key in ("test/len64/ppl", "test/len128/loss", "test/len128/entropy", "passkey/len256/acc",
                "passkey/len256/depth50/acc", "longctx/multikey_retrieval/len256/score"):
        assert key in plain, key
    assert 1 < plain["test/len64/ppl"] < 512
    assert plain["test/len64/ppl"] == pytest.approx(math.exp(plain["test/len64/loss"]), rel=1e-9)
    assert 0 <= plain["test/len64/entropy"] <= math.log(64)
    uri = tiny_pretrained["tracking"][0].split("=", 1)[1]
    client = MlflowClient(uri)
    run = client.get_run(plain["run_id"])
    assert run.data.tags["stage"] == "evaluate" and run.data.metrics["test/len64/ppl"] == plain["test/len64/ppl"]
    files = {a.path for a in client.list_artifacts(plain["run_id"], "plots")}
    assert files == {"plots/position_curves.png", "plots/entropy_heads.png", "plots/passkey.png"}
    results = json.loads(download(TrackingConfig(uri=uri), plain["run_id"], "results.json").read_text())
    assert results["stride"] == 8 and results["lengths"] == [64, 128]  # train_len 64 / 8
    assert len(results["entropy"]["per_head"]) == 2  # n_layer


def test_a_uniform_temperature_changes_the_numbers(evaluated):
    assert evaluated["scaled"]["test/len64/ppl"] != pytest.approx(evaluated["plain"]["test/len64/ppl"])
    assert evaluated["scaled"]["test/len128/entropy"] < evaluated["plain"]["test/len128/entropy"]  # sharper


@pytest.mark.parametrize("extra,message", [
    (["eval_lengths=[4096]"], "exceed this model's max_positions"),
    (["checkpoint=/nonexistent"], "no such export folder"),
    (["split=train"], "split='train' is not a valid choice"),
    (["window_scoring=middle"], "window_scoring='middle' is not a valid choice"),
])
def test_evaluate_bad_input(evaluated, extra, message, capsys):
    assert cli.main(["run", "evaluate", *evaluated["overrides"], *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_length_too_short_for_a_passkey_prompt_is_skipped_with_one_line(evaluated, capsys):
    result = run_stage("evaluate", stage_config("evaluate", None, [
        *evaluated["overrides"], "passkey_lengths=[32,256]", "longctx_samples=0", "entropy_windows=0",
        "position_windows=0", "eval_lengths=[64]"]))
    lines = [line for line in capsys.readouterr().err.splitlines() if "passkey skipped" in line]
    assert len(lines) == 1 and re.fullmatch(
        r"evaluate: passkey skipped at lengths \[32\]: the reference prompt needs \d+ tokens", lines[0])
    assert "passkey/len256/acc" in result and not any(k.startswith("passkey/len32/") for k in result)


def test_validation_split_is_scored_under_its_own_name(evaluated):
    result = run_stage("evaluate", stage_config("evaluate", None, [
        *evaluated["overrides"], "split=val", "passkey_keys=0", "longctx_samples=0", "entropy_windows=0",
        "position_windows=0", "eval_lengths=[64]"]))
    assert "val/len64/ppl" in result and not any(k.startswith("test/") for k in result)
    assert result["val/len64/ppl"] != pytest.approx(evaluated["plain"]["test/len64/ppl"])  # other documents


def test_a_folder_corpus_is_a_whole_test_set_with_a_valid_metric_name(evaluated, tmp_path):
    from nope_lightning.data import load_documents
    from nope_lightning.data.corpus import corpus_label

    folder = tmp_path / "my eval books"  # a space: the label must still be a valid MLflow name
    folder.mkdir()
    genesis = next(d for d in load_documents("tiny", tmp_path) if d.name == "kjv/Genesis")
    (folder / "a.txt").write_text(genesis.text[:20000])
    (folder / "b.txt").write_text(genesis.text[20000:40000])
    base = [*evaluated["overrides"], "passkey_keys=0", "longctx_samples=0", "entropy_windows=0",
            "position_windows=0", "eval_lengths=[64]", "ppl_tokens=100000"]
    result = run_stage("evaluate", stage_config("evaluate", None, [*base, f"corpora=[tiny,'{folder}']"]))
    label = corpus_label(str(folder))
    assert label.startswith("my_eval_books-") and len(label) == len("my_eval_books-") + 6
    key = f"test/{label}/len64/ppl"
    assert key in result and "test/len64/ppl" in result  # the model's corpus first, the folder by its label
    uri = next(o for o in evaluated["overrides"] if o.startswith("tracking.uri=")).split("=", 1)[1]
    results = json.loads(download(TrackingConfig(uri=uri), result["run_id"], "results.json").read_text())
    # both files scored, every window of each (no 10 % test share of the folder)
    from nope_lightning.data import TextTokenizer

    tok = TextTokenizer.load(next(p for p in evaluated["overrides"] if p.startswith("checkpoint=")).split("=", 1)[1]
                             + "/tokenizer.json")
    lengths = [len(tok.encode(t)) + 2 for t in (genesis.text[:20000], genesis.text[20000:40000])]
    want = sum(64 - w.score_from for w in sliding_windows(lengths, 64, 8, 10**9))
    assert results["ppl"][str(folder)]["64"]["tokens"] == want
    with pytest.raises(ValueError, match="used whole as test data"):
        run_stage("evaluate", stage_config("evaluate", None, [*base, f"corpora=['{folder}']", "split=val"]))


def test_results_survive_a_tracking_failure_and_a_rerun_logs_them(evaluated, monkeypatch):
    from nope_lightning import tracking

    overrides = [*evaluated["overrides"], "passkey_keys=0", "longctx_samples=0", "entropy_windows=0",
                 "position_windows=0", "eval_lengths=[64]", "name=survivor", "plots=false"]
    create_run = tracking.create_run

    def store_gone(*args, **kwargs):
        raise ConnectionError("the tracking server went away")

    monkeypatch.setattr(tracking, "create_run", store_gone)
    with pytest.raises(ValueError, match=r"evaluate finished but could not log .* results are kept in (\S+): rerun"):
        run_stage("evaluate", stage_config("evaluate", None, overrides))
    monkeypatch.setattr(tracking, "create_run", create_run)
    computed = []
    monkeypatch.setattr("nope_lightning.stages.evaluate.WindowEvaluator", lambda *a, **k: computed.append(1))
    result = run_stage("evaluate", stage_config("evaluate", None, overrides))  # logs what was saved, no compute
    assert not computed and result["test/len64/ppl"] == pytest.approx(evaluated["plain"]["test/len64/ppl"])
    uri = next(o for o in evaluated["overrides"] if o.startswith("tracking.uri=")).split("=", 1)[1]
    from mlflow.tracking import MlflowClient

    assert MlflowClient(uri).get_run(result["run_id"]).data.metrics["test/len64/ppl"] == result["test/len64/ppl"]
