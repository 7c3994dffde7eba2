"""``evaluate``: any trained model under any length-extension setting, logged to one MLflow run.

Measures (paper 001 §2.3, §4.2-4.4): sliding-window perplexity per corpus and length; per-position log-PPL
at the longest length; attention entropy (nats) per layer x head x position; passkey retrieval per
length x depth; synthetic long-context tasks and user-supplied LongBench files. Window scoring runs in
``trainer.test`` (so it shards over processes); generation runs on rank 0.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from nope_lightning import tracking
from nope_lightning.checkpoint import LoadedModel
from nope_lightning.config import EvaluateConfig, to_dict
from nope_lightning.data.corpus import corpus_label
from nope_lightning.eval.perplexity import (
    Stream,
    WindowDataset,
    WindowEvaluator,
    sliding_windows,
    tiled_windows,
)
from nope_lightning.extension import extension_label, load_extended
from nope_lightning.metrics import AttentionEntropy, position_buckets


def split_documents_of(loaded: LoadedModel, corpus: str, tokenizer, split: str) -> list[tuple[str, np.ndarray]]:
    """``(text, token ids)`` of the ``split`` (val or test) of ``corpus``; the ids carry BOS/EOS.

    The model's own training corpus (and any built-in corpus, whose splits are fixed by the data config) is
    split as the model's data config splits it, so test documents were never trained on. A folder that is
    not the training corpus is an evaluation set (e.g. a PG19 or Proof-pile test folder) and is used whole
    for ``test``; selecting on such a folder (``val``) would select on the test data, so it is refused.
    """
    from nope_lightning.data import load_documents, split_documents
    from nope_lightning.data.corpus import BUILTIN_CORPORA

    data = loaded.config.data
    documents = load_documents(corpus, data.cache_path)
    if corpus in BUILTIN_CORPORA or corpus == data.corpus:
        docs = split_documents(documents, data.val_fraction, data.test_fraction, data.split_seed)[split]
    elif split == "test":
        docs = documents
    else:
        raise ValueError(f"corpus {corpus!r} is an evaluation folder, used whole as test data: selecting on it "
                         f"(split=val) would select on test data; use the model's own corpus for split=val")
    encoded = tokenizer.encode_batch([d.text for d in docs])
    return [(d.text, np.asarray([tokenizer.bos_id, *ids, tokenizer.eos_id], dtype=np.int64))
            for d, ids in zip(docs, encoded, strict=True)]


def comparable_documents(corpus: str, arrays: list[np.ndarray], longest: int, split: str) -> list[np.ndarray]:
    """The documents long enough for the longest window: every length is then scored on the same
    documents, so PPL differences across lengths come from context, not from a changing document mix."""
    kept = [a for a in arrays if len(a) >= longest + 1]
    if not kept:
        raise ValueError(f"no {split} document of corpus {corpus!r} has {longest + 1} tokens (longest: "
                         f"{max(map(len, arrays))}); lower eval_lengths or use a corpus with longer documents")
    return kept


class WindowData(LightningDataModule):
    """One test dataloader per stream, sharded by rank inside ``WindowDataset``."""

    def __init__(self, docs: dict[str, list[np.ndarray]], streams: list[Stream], windows: list, batch_size: int):
        super().__init__()
        self.docs, self.streams, self.windows, self.batch_size = docs, streams, windows, batch_size

    def test_dataloader(self) -> list[DataLoader]:
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        return [DataLoader(WindowDataset(self.docs[s.corpus], w, s.length, rank, world), batch_size=self.batch_size)
                for s, w in zip(self.streams, self.windows, strict=True)]


def plan_streams(cfg: EvaluateConfig, docs: dict[str, list[np.ndarray]], lengths: list[int],
                 stride: int) -> tuple[list[Stream], list[list]]:
    """The evaluation streams and their windows (every document already holds the longest window)."""
    streams, windows = [], []
    primary, longest = next(iter(docs)), max(lengths)
    for corpus, arrays in docs.items():
        doc_lengths = [len(a) for a in arrays]
        for length in lengths:
            streams.append(Stream("ppl", corpus, length))
            windows.append(sliding_windows(doc_lengths, length, min(stride, length), cfg.ppl_tokens,
                                           cfg.window_scoring))
        if cfg.position_windows:
            streams.append(Stream("position", corpus, longest))
            windows.append(tiled_windows(doc_lengths, longest, cfg.position_windows))
    if cfg.entropy_windows:
        for length in lengths:
            streams.append(Stream("entropy", primary, length))
            windows.append(tiled_windows([len(a) for a in docs[primary]], length, cfg.entropy_windows))
    return streams, windows


def run(cfg: EvaluateConfig) -> dict[str, Any]:
    from nope_lightning.data import TextTokenizer
    from nope_lightning.run import build_trainer, check_strategy

    check_strategy(cfg.trainer)
    loaded = load_extended(cfg.checkpoint, cfg.extension, cfg.tracking)
    local = local_results_dir(cfg, loaded)
    if (local / "metrics.json").is_file() and not (local / "logged").is_file():
        # A finished evaluation whose logging failed: log what is there instead of computing it again.
        saved = json.loads((local / "metrics.json").read_text())
        return log_results(cfg, saved["name"], saved["metrics"], json.loads((local / "results.json").read_text()),
                           local)
    model, train_len = loaded.model.eval(), loaded.config.train_len
    lengths = sorted(cfg.eval_lengths or [train_len * m for m in (1, 2, 4, 8)])
    passkey_lengths = sorted(cfg.passkey_lengths or lengths)
    too_long = [n for n in {*lengths, *passkey_lengths} if n + cfg.max_new_tokens > model.cfg.max_positions]
    if too_long:
        raise ValueError(f"lengths {sorted(too_long)} (+{cfg.max_new_tokens} generated tokens) exceed this "
                         f"model's max_positions={model.cfg.max_positions}; shorten eval_lengths/passkey_lengths")
    stride = cfg.stride or max(1, train_len // 8)
    tokenizer = TextTokenizer.load(loaded.tokenizer_file)
    corpora = cfg.corpora or [loaded.config.data.corpus]
    named_docs = {corpus: split_documents_of(loaded, corpus, tokenizer, cfg.split) for corpus in corpora}
    docs = {corpus: comparable_documents(corpus, [a for _, a in named], max(lengths), cfg.split)
            for corpus, named in named_docs.items()}
    streams, windows = plan_streams(cfg, docs, lengths, stride)
    # Build every prompt before any compute; a length too short for the prompt is skipped (one line).
    keys = passkey_samples(tokenizer, passkey_lengths, cfg) if cfg.passkey_keys else []
    texts = [text for text, _ in named_docs[corpora[0]]]
    tasks = long_context_samples(tokenizer, texts, passkey_lengths, cfg) if cfg.longctx_samples else {}

    evaluator = WindowEvaluator(model, streams, cfg.entropy_chunk)
    trainer = build_trainer(cfg.trainer, enable_checkpointing=False)
    with torch.no_grad():
        trainer.test(evaluator, datamodule=WindowData(docs, streams, windows, cfg.batch_size), verbose=False)
    if not trainer.is_global_zero:
        return {}

    results: dict[str, Any] = {"setting": extension_label(cfg.extension), "train_len": train_len,
                               "split": cfg.split, "lengths": lengths, "stride": stride,
                               "window_scoring": cfg.window_scoring, "corpora": corpora}
    metrics = window_metrics(evaluator.results, corpora, lengths, cfg, results)
    if keys:
        metrics.update(passkey(model, tokenizer, keys, cfg, results))
    if tasks:
        metrics.update(long_context(model, tokenizer, tasks, cfg, results))
    for path in cfg.longbench_files:
        metrics.update(longbench(model, tokenizer, path, cfg, results))
    if cfg.harness_tasks:
        metrics.update(harness(model, tokenizer, cfg, results))

    name = cfg.name or default_run_name(loaded, cfg)
    # Saved before any logging: a tracking failure from here on loses nothing, and a rerun logs these.
    local.mkdir(parents=True, exist_ok=True)
    (local / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (local / "metrics.json").write_text(json.dumps({"name": name, "metrics": metrics}, indent=1))
    return log_results(cfg, name, metrics, results, local)


def default_run_name(loaded: LoadedModel, cfg: EvaluateConfig) -> str:
    split = "" if cfg.split == "test" else f"-{cfg.split}"
    return f"evaluate-{loaded.config.name or Path(loaded.folder).parent.name}-{extension_label(cfg.extension)}{split}"


def local_results_dir(cfg: EvaluateConfig, loaded: LoadedModel) -> Path:
    """Where this evaluation's results are kept on disk before they are logged: ``cfg.out_dir`` or
    ``<artifact root>/../results/evaluate/<run name>-<hash of the resolved config>`` (``mlruns/results/...``
    by default), so only the same evaluation of the same model finds them again."""
    if cfg.out_dir:
        return Path(cfg.out_dir)
    digest = hashlib.sha256(json.dumps({"config": to_dict(cfg), "model": loaded.fingerprint}, sort_keys=True,
                                       default=str).encode()).hexdigest()[:10]
    root = Path(cfg.tracking.artifact_root).parent / "results" / "evaluate"
    return root / f"{cfg.name or default_run_name(loaded, cfg)}-{digest}"


def log_results(cfg: EvaluateConfig, name: str, metrics: dict[str, float], results: dict, local: Path) -> dict:
    """One MLflow run with the metrics, ``results.json`` and the plots; on a tracking failure, an error that
    says where the results are kept."""
    try:
        run_id = tracking.create_run(cfg.tracking, "evaluate", name, cfg)
        tracking.log_metrics(cfg.tracking, run_id, metrics)
        tracking.log_json(cfg.tracking, run_id, results, "results.json")
        if cfg.plots:
            log_plots(cfg, run_id, results, results["train_len"])
        tracking.end_run(cfg.tracking, run_id)
    except Exception as err:  # noqa: BLE001 - any tracking failure: the results are safe on disk, say where
        message = " ".join(str(err).split())
        raise ValueError(f"evaluate finished but could not log to {cfg.tracking.uri} ({type(err).__name__}: "
                         f"{message}); its results are kept in {local}: rerun the same command to log them") from err
    (local / "logged").write_text(run_id)
    return {"run_id": run_id, **metrics}


def window_metrics(res: dict, corpora: list[str], lengths: list[int], cfg: EvaluateConfig,
                   results: dict) -> dict[str, float]:
    """Perplexity, per-position log-PPL and entropy metrics from the evaluator's synced results."""
    metrics: dict[str, float] = {}
    results["ppl"] = {}
    for corpus in corpora:
        results["ppl"][corpus] = {}
        # The first corpus is the primary one (``{split}/len{L}/...``); the others are named by their label.
        prefix = cfg.split if corpus == corpora[0] else f"{cfg.split}/{corpus_label(corpus)}"
        for length in lengths:
            nll = res["ppl", corpus, length]
            ppl, loss = float(nll.perplexity()), float(nll.compute())
            results["ppl"][corpus][length] = {"ppl": ppl, "nll": loss, "tokens": int(nll.count.item())}
            metrics[f"{prefix}/len{length}/ppl"] = ppl
            metrics[f"{prefix}/len{length}/loss"] = loss
    longest = max(lengths)
    if cfg.position_windows:
        edges = position_buckets(longest, cfg.position_buckets, "linear")
        results["position"] = {"edges": edges.tolist(), "logppl": {
            corpus: res["position", corpus, longest].bucketed(edges).tolist() for corpus in corpora}}
    if cfg.entropy_windows:
        results["entropy_by_length"] = {}
        for length in lengths:
            ent: AttentionEntropy = res["entropy", corpora[0], length]
            mean = float(ent.compute().nanmean())
            metrics[f"{cfg.split}/len{length}/entropy"] = results["entropy_by_length"][length] = mean
        ent = res["entropy", corpora[0], longest]
        edges = position_buckets(longest, cfg.position_buckets, "linear")
        results["entropy"] = {"edges": edges.tolist(), "unit": "nats",
                              "per_head": ent.bucketed(edges).tolist(),
                              "mean": np.nanmean(ent.bucketed(edges).numpy(), axis=(0, 1)).tolist()}
    return metrics


def passkey_samples(tokenizer, lengths: list[int], cfg: EvaluateConfig) -> list:
    """The passkey grid lengths x ``passkey_depths`` depths (0, 1/n, ...) x ``passkey_keys`` keys; lengths that
    cannot hold the prompt's fixed parts are skipped with one warning line."""
    from nope_lightning.eval.passkey import PasskeyPromptBuilder, make_passkey_samples

    shortest = PasskeyPromptBuilder(tokenizer, [tokenizer.bos_id], cfg.passkey_prompt).min_length()
    fitting = [n for n in lengths if n >= shortest]
    if len(fitting) < len(lengths):
        print(f"evaluate: passkey skipped at lengths {[n for n in lengths if n < shortest]}: the "
              f"{cfg.passkey_prompt} prompt needs {shortest} tokens", file=sys.stderr)
    depths = [i / cfg.passkey_depths for i in range(cfg.passkey_depths)]
    return make_passkey_samples(tokenizer, fitting, depths, cfg.passkey_keys, cfg.seed, [tokenizer.bos_id],
                                cfg.passkey_prompt)


def passkey(model, tokenizer, samples: list, cfg: EvaluateConfig, results: dict) -> dict[str, float]:
    """Greedy passkey retrieval (reference or compact prompt), scored by exact match of the key's tokens;
    accuracy per length and per (length, depth)."""
    from nope_lightning.eval.generate import greedy_generate
    from nope_lightning.eval.passkey import passkey_accuracy, score_passkey_tokens

    outputs = []
    for length in tqdm(sorted({s.length for s in samples}), desc="passkey", leave=False):
        batch = [s for s in samples if s.length == length]
        generated = greedy_generate(model, [s.input_ids for s in batch], cfg.max_new_tokens, cfg.batch_size,
                                    tokenizer.vocab_size)
        # Exact match of the key's tokens (a longer number or a stray digit fails, unlike a first-integer check).
        outputs += [score_passkey_tokens(g, tokenizer.encode(f" {s.key}")) for s, g in zip(batch, generated, strict=True)]
    accuracy = passkey_accuracy(samples, outputs)
    results["passkey"] = {"prompt": cfg.passkey_prompt, "by_length": accuracy.by_length, "overall": accuracy.overall,
                          "by_cell": [[length, depth, acc] for (length, depth), acc in accuracy.by_cell.items()]}
    return accuracy.metrics("passkey")


def long_context_samples(tokenizer, documents: list[str], lengths: list[int], cfg: EvaluateConfig) -> dict:
    """``(task, length) -> samples`` of the offline long-context tasks built from the test documents.

    A task whose fixed parts do not fit a (short) length is skipped for that length with one line on stderr; the
    skip is listed in ``results.json`` under ``longctx_skipped``.
    """
    from nope_lightning.eval import longctx

    tasks, skipped = {}, {}
    for task in cfg.longctx_tasks:
        for length in lengths:
            try:
                tasks[task, length] = getattr(longctx, task)(tokenizer, documents, length, cfg.longctx_samples,
                                                             seed=cfg.seed)
            except ValueError as err:
                skipped[f"{task}/len{length}"] = str(err)
                print(f"evaluate: long-context task {task} skipped at length {length}: {err}", file=sys.stderr)
    return {"samples": tasks, "skipped": skipped}


def long_context(model, tokenizer, tasks: dict, cfg: EvaluateConfig, results: dict) -> dict[str, float]:
    """Greedy answers to the long-context samples; mean score in [0, 1] per task x length."""
    from nope_lightning.eval.generate import greedy_generate

    metrics, results["longctx"], results["longctx_skipped"] = {}, {}, tasks["skipped"]
    for (task, length), samples in tqdm(tasks["samples"].items(), desc="long-context tasks", leave=False):
        new = max(s.max_new_tokens for s in samples)
        # BOS first, as every training document starts (NoPE models lean on it to count positions).
        generated = greedy_generate(model, [[tokenizer.bos_id, *s.prompt_ids] for s in samples], new,
                                    cfg.batch_size, tokenizer.vocab_size)
        score = float(np.mean([s.score(tokenizer.decode(g)) for s, g in zip(samples, generated, strict=True)]))
        metrics[f"longctx/{task}/len{length}/score"] = score
        results["longctx"].setdefault(task, {})[length] = score
    return metrics


def longbench(model, tokenizer, path: str, cfg: EvaluateConfig, results: dict) -> dict[str, float]:
    """A user's LongBench(-E) JSONL file run with LongBench's protocol (``eval/longbench.py``): per-task
    prompts and budgets from ``longbench_config``, prompts cut in the middle to the model's window."""
    from nope_lightning.eval.longbench import run_longbench

    metrics = run_longbench(model, tokenizer, path, model.cfg.max_positions, config_dir=cfg.longbench_config,
                            num_beams=cfg.longbench_beams, batch_size=cfg.batch_size)
    results.setdefault("longbench", {}).update(metrics)
    return metrics


def harness(model, tokenizer, cfg: EvaluateConfig, results: dict) -> dict[str, float]:
    """lm-evaluation-harness tasks (e.g. paper 001's Table 1: arc_easy, hellaswag, ...) on the evaluated
    model under the same extension setting; ``harness/{task}/{metric}``."""
    from nope_lightning.eval.harness import run_harness

    metrics = run_harness(model, tokenizer, cfg.harness_tasks, include_path=cfg.harness_include or None,
                          batch_size=cfg.batch_size)
    results["harness"] = metrics
    return metrics


def log_plots(cfg: EvaluateConfig, run_id: str, results: dict, train_len: int) -> None:
    """Fig 1 (log-PPL + entropy vs position), Fig 3 (entropy per head) and Fig 6 (passkey) PNGs."""
    from nope_lightning.eval import plots

    setting = results["setting"]
    if "position" in results:
        edges = results["position"]["edges"]
        centers = [(a + b - 1) / 2 for a, b in zip(edges[:-1], edges[1:], strict=True)]
        logppl = {f"{corpus} ({setting})": (centers, v) for corpus, v in results["position"]["logppl"].items()}
        entropy = {}
        bound = None
        if "entropy" in results:
            e_edges = results["entropy"]["edges"]
            e_centers = [(a + b - 1) / 2 for a, b in zip(e_edges[:-1], e_edges[1:], strict=True)]
            entropy = {setting: (e_centers, results["entropy"]["mean"])}
            bound = (e_centers, list(np.log(np.asarray(e_centers) + 1)))
        tracking.log_figure(cfg.tracking, run_id, plots.position_curves(logppl, entropy, train_len, bound,
                            title=f"per-position log-PPL and entropy ({setting})"), "plots/position_curves.png")
    if "entropy" in results:
        fig = plots.entropy_heatmap(np.asarray(results["entropy"]["per_head"]), results["entropy"]["edges"],
                                    train_len, title=f"attention entropy per head, nats ({setting})")
        tracking.log_figure(cfg.tracking, run_id, fig, "plots/entropy_heads.png")
    if "passkey" in results:
        cells = {(int(length), float(depth)): acc for length, depth, acc in results["passkey"]["by_cell"]}
        tracking.log_figure(cfg.tracking, run_id, plots.passkey_heatmap(cells, title=f"passkey ({setting})"),
                            "plots/passkey.png")

