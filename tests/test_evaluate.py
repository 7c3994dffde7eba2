"""The evaluate stage: window perplexity against a brute-force reference, entropy through the probe, and the
stage end to end on a tiny pretrained model."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

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
    scoring_windows,
    target_ends,
    tiled_windows,
)
from nope_lightning.model import GPT
from nope_lightning.model.probes import attention_probs
from nope_lightning.runtime.tracking import download
from nope_lightning.stages.registry import run_stage, stage_config

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
    (what a multi-process sync does); returns the evaluator's results as one rank would see them."""
    merged = WindowEvaluator(model, streams, entropy_chunk=5)
    for rank in range(world):
        evaluator = WindowEvaluator(model, streams, entropy_chunk=5)
        loaders = [DataLoader(WindowDataset(docs, w, s.length, rank, world), batch_size=batch_size)
                   for s, w in zip(streams, windows, strict=True)]
        Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False).test(
            evaluator, dataloaders=loaders, verbose=False)
        for total, part in zip(merged.metrics, evaluator.metrics, strict=True):
            total.merge_state(part)
        for key, (per_window, heads) in evaluator.entropy.items():
            merged.entropy[key][0].merge_state(per_window)
            merged.entropy[key][1].merge_state(heads)
    merged.on_test_epoch_end()
    return merged.results


def brute_force_nll(model, doc, target: int, context: int) -> float:
    """-log p(doc[target] | the ``context`` tokens before it), by a separate forward of exactly that context."""
    with torch.no_grad():
        logits = model(torch.as_tensor(doc[target - context:target], dtype=torch.long)[None])[0, -1].double()
    return -torch.log_softmax(logits, -1)[doc[target]].item()


def test_windows_of_every_length_end_on_the_same_tokens_spread_over_all_documents():
    ends = target_ends([30, 9, 41], longest=2 * L, stride=S, budget=10**6)
    assert ends == [(0, 24), (0, 28), (2, 24), (2, 28), (2, 32), (2, 36), (2, 40)]  # the 9-token doc is too short
    for length in (L, 2 * L):
        windows = scoring_windows(ends, length, S)
        scored = [(w.doc, w.start + i + 1) for w in windows for i in range(w.score_from, length)]
        # the last S tokens up to each end, each with at least length - S + 1 tokens of context
        assert scored == [(d, t) for d, e in ends for t in range(e - S + 1, e + 1)]
        assert all(w.start == e - length for w, (_, e) in zip(windows, ends, strict=True))
    few = target_ends([30, 9, 41], longest=2 * L, stride=S, budget=3 * S)
    assert few == [(0, 24), (2, 28), (2, 40)]  # three ends spread evenly, not the first three
    with pytest.raises(ValueError, match="must be in 1..12"):
        scoring_windows(ends, L, 13)


def test_same_target_ppl_equals_brute_force_whatever_batch_or_world(model, docs):
    ends = target_ends([len(d) for d in docs], 2 * L, S, budget=10**6)
    streams = [Stream("ppl", "c", n, len(ends)) for n in (L, 2 * L)]
    windows = [scoring_windows(ends, n, S) for n in (L, 2 * L)]
    want = {n: [[sum(brute_force_nll(model, docs[d], t, n - (e - t)) for t in range(e - S + 1, e + 1)), S]
                 for d, e in ends] for n in (L, 2 * L)}
    for batch_size, world in ((1, 1), (3, 1), (2, 2)):
        results = evaluate_windows(model, docs, streams, windows, batch_size, world)
        for n in (L, 2 * L):
            np.testing.assert_allclose(results["ppl", "c", n].numpy(), np.array(want[n]), rtol=1e-6)


def test_probe_entropy_equals_entropy_of_the_full_attention_matrix(model, docs):
    windows = [tiled_windows([len(d) for d in docs], L, 3)]
    results = evaluate_windows(model, docs, [Stream("position", "c", L, 3, entropy=True)], windows, batch_size=2)
    heads, per_window = results["entropy_heads", "c", L], results["entropy", "c", L]
    inputs = torch.stack([torch.as_tensor(docs[w.doc][w.start:w.start + L]) for w in windows[0]])
    layers = []
    for layer in range(2):
        probs = attention_probs(model, inputs, layer).double()
        entropy = -(probs * probs.clamp_min(1e-300).log()).sum(-1)  # (windows, H, T), nats
        assert torch.allclose(heads.compute()[layer].double(), entropy.mean(0), atol=1e-5)
        layers.append(entropy)
    assert torch.allclose(per_window, torch.stack(layers).mean((0, 2)), atol=1e-5)  # layer- and head-mean
    assert torch.allclose(heads.compute()[:, :, 0], torch.zeros(2, 2, dtype=heads.compute().dtype))


def test_position_windows_are_spread_evenly_and_score_every_target(model, docs):
    windows = tiled_windows([len(d) for d in docs], L, 3)
    assert [(w.doc, w.start, w.score_from) for w in windows] == [(0, 0, 0), (2, 0, 0), (3, 0, 0)]  # of 6 tiles
    results = evaluate_windows(model, docs, [Stream("position", "c", L, 3)], [windows], batch_size=2)
    table = results["position", "c", L]
    for row, w in zip(table, windows, strict=True):
        want = [brute_force_nll(model, docs[w.doc], w.start + t + 1, t + 1) for t in range(L)]
        np.testing.assert_allclose(row.numpy(), want, rtol=1e-5)


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
    (["checkpoint=/nonexistent"], "checkpoint=/nonexistent: /nonexistent does not exist"),
    (["split=train"], "split='train' is not a valid choice"),
    (["bootstrap=50"], "bootstrap=50 bootstrap resamples are too few"),
    (["stride=100"], "stride=100 exceeds the shortest eval length 64"),
])
def test_evaluate_bad_input(evaluated, extra, message, capsys):
    assert cli.main(["run", "evaluate", *evaluated["overrides"], *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_length_too_short_for_a_passkey_prompt_is_skipped_with_one_line(evaluated, capsys):
    result = run_stage("evaluate", stage_config("evaluate", None, [
        *evaluated["overrides"], "passkey_lengths=[32,256]", "longctx_samples=0", "entropy=false",
        "position_windows=0", "eval_lengths=[64]"]))
    lines = [line for line in capsys.readouterr().err.splitlines() if "passkey skipped" in line]
    assert len(lines) == 1 and re.fullmatch(
        r"evaluate: passkey skipped at lengths \[32\]: the reference prompt needs \d+ tokens", lines[0])
    assert "passkey/len256/acc" in result and not any(k.startswith("passkey/len32/") for k in result)


def test_validation_split_is_scored_under_its_own_name(evaluated):
    result = run_stage("evaluate", stage_config("evaluate", None, [
        *evaluated["overrides"], "split=val", "passkey_keys=0", "longctx_samples=0", "entropy=false",
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
    base = [*evaluated["overrides"], "passkey_keys=0", "longctx_samples=0", "entropy=false",
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
    assert results["ppl"][str(folder)]["64"]["tokens"] == 8 * len(target_ends(lengths, 64, 8, 10**9))
    with pytest.raises(ValueError, match="used whole as test data"):
        run_stage("evaluate", stage_config("evaluate", None, [*base, f"corpora=['{folder}']", "split=val"]))


def test_results_survive_a_tracking_failure_and_a_rerun_logs_them(evaluated, monkeypatch):
    from nope_lightning.runtime import tracking

    overrides = [*evaluated["overrides"], "passkey_keys=0", "longctx_samples=0", "entropy=false",
                 "position_windows=0", "eval_lengths=[64]", "name=survivor", "plots=false"]
    create_run = tracking.create_run

    def store_gone(*args, **kwargs):
        raise ConnectionError("the tracking server went away")

    monkeypatch.setattr(tracking, "create_run", store_gone)
    with pytest.raises(ValueError, match=r"evaluate finished but could not log .* results are kept in (\S+): rerun") as err:
        run_stage("evaluate", stage_config("evaluate", None, overrides))
    kept = re.search(r"results are kept in (\S+): rerun", str(err.value)).group(1)
    saved = json.loads((Path(kept) / "metrics.json").read_text())["metrics"]
    monkeypatch.setattr(tracking, "create_run", create_run)
    computed = []
    monkeypatch.setattr("nope_lightning.stages.evaluate.WindowEvaluator", lambda *a, **k: computed.append(1))
    result = run_stage("evaluate", stage_config("evaluate", None, overrides))  # logs what was saved, no compute
    assert not computed and result["test/len64/ppl"] == saved["test/len64/ppl"]
    uri = next(o for o in evaluated["overrides"] if o.startswith("tracking.uri=")).split("=", 1)[1]
    from mlflow.tracking import MlflowClient

    assert MlflowClient(uri).get_run(result["run_id"]).data.metrics["test/len64/ppl"] == result["test/len64/ppl"]


def test_results_keep_the_data_behind_every_interval(evaluated, tiny_pretrained):
    uri = tiny_pretrained["tracking"][0].split("=", 1)[1]
    results = json.loads(download(TrackingConfig(uri=uri), evaluated["plain"]["run_id"], "results.json").read_text())
    corpus = results["corpora"][0]
    for n in ("64", "128"):
        cell = results["ppl"][corpus][n]
        rows = np.asarray(results["windows"][corpus][n])
        assert cell["nll"] == pytest.approx(rows[:, 0].sum() / rows[:, 1].sum())
        assert cell["nll_low"] < cell["nll"] < cell["nll_high"] and cell["tokens"] == rows[:, 1].sum()
    assert results["windows"][corpus]["doc"] == sorted(results["windows"][corpus]["doc"])  # blocks within documents
    position = results["position"]
    assert [tuple(o) for o in position["octaves"]] == [(0, 64), (64, 128)]  # [0, L), [L, 2L) of the 128 windows
    curve = position["logppl"][corpus]
    assert 0 < len(curve["windows"]) <= 64 and all(lo <= m <= hi for lo, m, hi in zip(curve["low"], curve["mean"], curve["high"],
                                                                                  strict=True))
    assert len(position["entropy"]["mean"]) == len(position["edges"]) - 1
    assert len(results["passkey"]["samples"]) == 2 and results["passkey"]["by_length_interval"]["256"][1] > 0


def test_passkey_prompts_are_drawn_from_the_split(tiny_pretrained):
    from nope_lightning.data import TextTokenizer
    from nope_lightning.eval.passkey import passkey_samples

    tokenizer = TextTokenizer.load(f"{tiny_pretrained['model']}/tokenizer.json")
    keys = {split: [s.key for s in passkey_samples(tokenizer, [256], stage_config(
        "evaluate", None, [f"checkpoint={tiny_pretrained['model']}", f"split={split}"]))] for split in ("val", "test")}
    assert len(keys["test"]) == 100  # paper 001's grid: 10 depths x 10 keys
    assert not set(keys["val"]) & set(keys["test"])  # selection never sees a reporting prompt


def test_empty_length_lists_mean_none(evaluated):
    result = run_stage("evaluate", stage_config("evaluate", None, [
        *evaluated["overrides"], "eval_lengths=[]", "passkey_lengths=[]", "longctx_samples=0", "name=nothing"]))
    assert set(result) == {"run_id"}


def test_a_failed_part_keeps_the_finished_ones_and_a_rerun_resumes_after_them(evaluated, monkeypatch, tmp_path):
    overrides = [*evaluated["overrides"], "longctx_samples=0", "position_windows=0", "eval_lengths=[64]",
                 f"out_dir={tmp_path}/kept", "plots=false"]

    def broken(*args, **kwargs):
        raise RuntimeError("the passkey part failed")

    monkeypatch.setattr("nope_lightning.stages.evaluate.run_passkey", broken)
    with pytest.raises(RuntimeError, match="passkey part failed"):
        run_stage("evaluate", stage_config("evaluate", None, overrides))
    partial = json.loads((tmp_path / "kept" / "partial.json").read_text())
    assert partial["done"] == ["windows"] and "test/len64/ppl" in partial["metrics"]
    monkeypatch.undo()
    computed = []
    monkeypatch.setattr("nope_lightning.stages.evaluate.WindowEvaluator", lambda *a, **k: computed.append(1))
    result = run_stage("evaluate", stage_config("evaluate", None, overrides))
    assert not computed  # the windows were not scored again
    assert result["test/len64/ppl"] == partial["metrics"]["test/len64/ppl"] and "passkey/len256/acc" in result
    assert not (tmp_path / "kept" / "partial.json").exists()
