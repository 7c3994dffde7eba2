"""``evaluate``: any trained model under any length-extension setting, logged to one MLflow run.

Measures (paper 001 §2.3, §4.2-4.4): sliding-window perplexity per corpus and length, on the same target tokens
at every length (``eval/perplexity.py``); per-position log-PPL and attention entropy (nats) over the longest
windows; passkey retrieval per length x depth; synthetic long-context tasks, LongBench files and
lm-evaluation-harness tasks. Every figure keeps the per-window / per-prompt data behind it and a 95 % interval
(``eval/summary.py``). Window scoring runs in ``trainer.test`` (so it shards over processes); generation runs
on rank 0. Each part's results are saved beside the artifact root before the next part starts, and a rerun of
the same evaluation resumes after the last finished part.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nope_lightning.analysis.lengthgen import plots
from nope_lightning.config.core import to_dict
from nope_lightning.config.stages import EvaluateConfig
from nope_lightning.data.corpus import corpus_label
from nope_lightning.data.tokenizer import TextTokenizer
from nope_lightning.eval import longctx, summary
from nope_lightning.eval.harness import check_harness_tasks, run_harness
from nope_lightning.eval.longbench import check_longbench, run_longbench
from nope_lightning.eval.passkey import passkey_samples, run_passkey
from nope_lightning.eval.perplexity import (
    Stream,
    Window,
    WindowData,
    WindowEvaluator,
    comparable_documents,
    scoring_windows,
    split_documents_of,
    target_ends,
    tiled_windows,
)
from nope_lightning.model.checkpoint import LoadedModel
from nope_lightning.model.extension import extension_label, load_extended, resolve_temperature
from nope_lightning.model.temperature import temperatures, tuning_len
from nope_lightning.results.evaluation import EvaluationResult
from nope_lightning.runtime import tracking
from nope_lightning.training.trainer import build_trainer, check_strategy


def plan_streams(cfg: EvaluateConfig, docs: dict[str, list[np.ndarray]], lengths: list[int],
                 stride: int) -> tuple[list[Stream], list[list[Window]], dict[str, list[tuple[int, int]]]]:
    """The evaluation streams, their windows, and per corpus the ``(doc, end)`` of its scoring windows (every
    document already holds the longest window)."""
    streams, windows, ends = [], [], {}
    primary, longest = next(iter(docs)), max(lengths)
    for corpus, arrays in docs.items():
        doc_lengths = [len(a) for a in arrays]
        ends[corpus] = target_ends(doc_lengths, longest, stride, cfg.ppl_tokens)
        for length in lengths:
            streams.append(Stream("ppl", corpus, length, len(ends[corpus])))
            windows.append(scoring_windows(ends[corpus], length, stride))
        if cfg.position_windows:
            tiles = tiled_windows(doc_lengths, longest, cfg.position_windows)
            streams.append(Stream("position", corpus, longest, len(tiles), cfg.entropy and corpus == primary))
            windows.append(tiles)
    return streams, windows, ends


def run(cfg: EvaluateConfig) -> dict[str, Any]:
    check_strategy(cfg.trainer)
    if cfg.longbench_files:  # every input a later part reads, checked before the model is even built
        check_longbench(cfg.longbench_files, cfg.longbench_config)
    if cfg.harness_tasks:
        check_harness_tasks(cfg.harness_tasks, cfg.harness_include or None)
    loaded = load_extended(cfg.checkpoint, cfg.extension, cfg.tracking)
    local = local_results_dir(cfg, loaded)
    if (local / "metrics.json").is_file() and not (local / "logged").is_file():
        # A finished evaluation whose logging failed: log what is there instead of computing it again.
        name, metrics = saved_metrics(local)
        return log_results(cfg, name, metrics, EvaluationResult.load(local / "results.json"), local)
    model, train_len = loaded.model.eval(), loaded.config.train_len
    lengths, passkey_lengths = cfg.perplexity_lengths(train_len), cfg.passkey_lengths_for(train_len)
    too_long = [n for n in {*lengths, *passkey_lengths} if n + cfg.max_new_tokens > model.cfg.max_positions]
    if too_long:
        raise ValueError(f"lengths {sorted(too_long)} (+{cfg.max_new_tokens} generated tokens) exceed this "
                         f"model's max_positions={model.cfg.max_positions}; shorten eval_lengths/passkey_lengths")
    stride = cfg.stride or max(1, train_len // 8)
    if lengths and stride > lengths[0]:
        raise ValueError(f"stride={stride} exceeds the shortest eval length {lengths[0]}: every length scores the "
                         f"same last-stride targets; lower stride or drop the short length")
    tokenizer = TextTokenizer.load(loaded.tokenizer_file)
    corpora = cfg.corpora or [loaded.config.data.corpus]
    named_docs = {corpus: split_documents_of(loaded, corpus, tokenizer, cfg.split) for corpus in corpora}
    # Every prompt before any compute; a length too short for the prompt is skipped (one line).
    keys = passkey_samples(tokenizer, passkey_lengths, cfg) if passkey_lengths else []
    texts = [text for text, _ in named_docs[corpora[0]]]
    tasks = longctx.task_samples(tokenizer, texts, passkey_lengths, cfg) if cfg.longctx_samples else {}

    name = cfg.name or default_run_name(loaded, cfg)
    parts = Parts(local, name, EvaluationResult(train_len, corpora, applied_setting(cfg, loaded), cfg.split,
                                                lengths, stride, cfg.bootstrap, temperature_table(model),
                                                tuning_len=tuning_len(loaded.config.model.temperature)))
    if lengths and parts.todo("windows"):
        docs = {corpus: comparable_documents(corpus, [a for _, a in named], max(lengths), cfg.split)
                for corpus, named in named_docs.items()}
        scored = score_windows(cfg, model, docs, lengths, stride, train_len)
        if scored is None:  # a rank other than 0 of a multi-process evaluation
            return {}
        sections, metrics = scored
        parts.finish("windows", metrics, **sections)
    if keys and parts.todo("passkey"):
        section, metrics = run_passkey(model, tokenizer, keys, cfg)
        parts.finish("passkey", metrics, passkey=section)
    if tasks and parts.todo("longctx"):
        scores, skipped, metrics = longctx.run_tasks(model, tokenizer, tasks, cfg)
        parts.finish("longctx", metrics, longctx=scores, longctx_skipped=skipped)
    for path in cfg.longbench_files:
        if parts.todo(f"longbench:{path}"):
            metrics = run_longbench(model, tokenizer, path, model.cfg.max_positions, config_dir=cfg.longbench_config,
                                    max_length=cfg.longbench_max_length, num_beams=cfg.longbench_beams,
                                    batch_size=cfg.batch_size)
            parts.finish(f"longbench:{path}", metrics, longbench={**(parts.result.longbench or {}), **metrics})
    if cfg.harness_tasks and parts.todo("harness"):
        metrics = run_harness(model, tokenizer, cfg.harness_tasks, include_path=cfg.harness_include or None,
                              batch_size=cfg.batch_size)
        parts.finish("harness", metrics, harness=metrics)
    return log_results(cfg, name, parts.metrics, parts.complete(), local)


class Parts:
    """An evaluation's results as its parts finish: each finished part is written to ``local/partial.json``
    before the next one starts, so a failure later (a LongBench file, a tracking outage) loses nothing, and a
    rerun of the same evaluation (same config and model: the same ``local`` folder) resumes after it."""

    def __init__(self, local: Path, name: str, base: EvaluationResult) -> None:
        self.path = local / "partial.json"
        saved = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.name = name
        self.result = EvaluationResult.from_dict(saved["results"], str(self.path)) if saved else base
        self.metrics: dict[str, float] = saved.get("metrics", {})
        self.done: list[str] = saved.get("done", [])

    def todo(self, part: str) -> bool:
        return part not in self.done

    def finish(self, part: str, metrics: dict[str, float], **sections: Any) -> None:
        """``part`` is done: its ``metrics``, and its ``sections`` (``EvaluationResult`` fields) into the result."""
        self.result = dataclasses.replace(self.result, **sections)
        self.metrics.update(metrics)
        self.done.append(part)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"results": self.result.to_dict(), "metrics": self.metrics,
                                         "done": self.done}, default=str))

    def complete(self) -> EvaluationResult:
        """The finished evaluation, saved as ``results.json`` + ``metrics.json`` before any logging."""
        local = self.path.parent
        local.mkdir(parents=True, exist_ok=True)
        self.result.save(local / "results.json")
        (local / "metrics.json").write_text(json.dumps({"name": self.name, "metrics": self.metrics}, indent=1))
        self.path.unlink(missing_ok=True)
        return self.result


def saved_metrics(local: Path) -> tuple[str, dict[str, float]]:
    """The run name and metrics a finished evaluation saved beside its result (``Parts.complete``)."""
    saved = json.loads((local / "metrics.json").read_text())
    return saved["name"], saved["metrics"]


def applied_setting(cfg: EvaluateConfig, loaded: LoadedModel) -> str:
    """The setting's label (``extension_label``); a searched uniform lambda also names the value it resolved to on
    this model (``lamsearch256=1.45``), which the run's params (the search's run id) do not show."""
    label, temperature = extension_label(cfg.extension), cfg.extension.temperature
    if temperature.uniform_search:
        label += f"={resolve_temperature(temperature, loaded.folder, cfg.tracking).uniform:g}"
    return label


def temperature_table(model) -> list | None:
    """The per-head temperatures (n_layer, n_head; units of 1/sqrt(d)) the model is evaluated with, when they
    differ between heads: what an ablation is compared by (an ablation that converged to the full method's
    table tests nothing)."""
    table = temperatures(model)
    return None if bool((table == table.flatten()[0]).all()) else table.tolist()


def score_windows(cfg: EvaluateConfig, model, docs: dict[str, list[np.ndarray]], lengths: list[int], stride: int,
                  train_len: int) -> tuple[dict[str, Any], dict[str, float]] | None:
    """Perplexity, per-position curves and entropy in one ``trainer.test``: ``(sections, metrics)`` on global
    rank 0 (``sections``: the ``EvaluationResult`` fields it fills), None elsewhere."""
    streams, windows, ends = plan_streams(cfg, docs, lengths, stride)
    evaluator = WindowEvaluator(model, streams, cfg.entropy_chunk)
    trainer = build_trainer(cfg.trainer, enable_checkpointing=False)
    with torch.no_grad():
        trainer.test(evaluator, datamodule=WindowData(docs, streams, windows, cfg.batch_size), verbose=False)
    if not trainer.is_global_zero:
        return None
    corpora, longest, res = list(docs), max(lengths), evaluator.results
    ppl, per_window, metrics = summary.perplexity(res, corpora, lengths, ends, cfg.split, cfg.bootstrap, cfg.seed)
    sections: dict[str, Any] = {"ppl": ppl, "windows": per_window}
    if cfg.position_windows:
        sections["position"] = summary.position(res, corpora, longest, train_len, cfg.position_buckets,
                                                cfg.entropy, cfg.bootstrap, cfg.seed)
        if cfg.entropy:
            entropy, by_length, entropy_metrics = summary.entropy_section(res, corpora[0], longest, lengths,
                                                                          cfg.position_buckets, cfg.split)
            sections.update(entropy=entropy, entropy_by_length=by_length)
            metrics.update(entropy_metrics)
    return sections, metrics


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


def log_results(cfg: EvaluateConfig, name: str, metrics: dict[str, float], results: EvaluationResult,
                local: Path) -> dict:
    """One MLflow run with the metrics, ``results.json`` and the plots; on a tracking failure, an error that
    says where the results are kept."""
    try:
        run_id = tracking.create_run(cfg.tracking, "evaluate", name, cfg)
        tracking.log_metrics(cfg.tracking, run_id, metrics)
        tracking.log_json(cfg.tracking, run_id, results.to_dict(), "results.json")
        if cfg.plots:
            log_plots(cfg, run_id, results)
        tracking.end_run(cfg.tracking, run_id)
    except Exception as err:  # noqa: BLE001 - any tracking failure: the results are safe on disk, say where
        message = " ".join(str(err).split())
        raise ValueError(f"evaluate finished but could not log to {cfg.tracking.uri} ({type(err).__name__}: "
                         f"{message}); its results are kept in {local}: rerun the same command to log them") from err
    (local / "logged").write_text(run_id)
    return {"run_id": run_id, **metrics}


def log_plots(cfg: EvaluateConfig, run_id: str, results: EvaluationResult) -> None:
    """Fig 1 (log-PPL + entropy vs position, with bands), Fig 3 (entropy per head) and Fig 6 (passkey) PNGs."""
    setting, train_len, position = results.setting, results.train_len, results.position
    if position is not None:
        edges = position.edges
        centers = [(a + b - 1) / 2 for a, b in zip(edges[:-1], edges[1:], strict=True)]
        logppl = {f"{corpus} ({setting})": (centers, c.mean, c.low, c.high) for corpus, c in position.logppl.items()}
        entropy = position.entropy
        curves = {setting: (centers, entropy.mean, entropy.low, entropy.high)} if entropy else {}
        bound = (centers, list(np.log(np.asarray(centers) + 1))) if curves else None
        tracking.log_figure(cfg.tracking, run_id, plots.position_curves(logppl, curves, train_len, bound,
                            title=f"per-position log-PPL and entropy ({setting})"), "plots/position_curves.png")
    if results.entropy is not None:
        fig = plots.entropy_heatmap(np.asarray(results.entropy.per_head), results.entropy.edges, train_len,
                                    title=f"attention entropy per head, nats ({setting})")
        tracking.log_figure(cfg.tracking, run_id, fig, "plots/entropy_heads.png")
    if results.passkey is not None:
        cells = {(c.length, c.depth): c.accuracy for c in results.passkey.by_cell}
        tracking.log_figure(cfg.tracking, run_id, plots.passkey_heatmap(cells, title=f"passkey ({setting})"),
                            "plots/passkey.png")


# --- declared results: the registry's ``Stage.results`` (what a later step may reference; the dry run) ---


def result_keys(cfg: EvaluateConfig, train_len: int | None = None) -> dict[str, type] | None:
    """What ``run`` returns: the run id and every metric (``window_metrics``, passkey, long-context) for a model
    pre-trained at ``train_len``; None when only known once it ran — LongBench and harness metric names come
    from their tasks, and the default lengths from the model's ``train_len`` (None: not known yet)."""
    if cfg.longbench_files or cfg.harness_tasks or (train_len is None and (
            cfg.eval_lengths is None or (cfg.passkey_keys and cfg.passkey_lengths is None))):
        return None
    lengths, passkey = cfg.perplexity_lengths(train_len or 0), cfg.passkey_lengths_for(train_len or 0)
    prefixes = [cfg.split, *(f"{cfg.split}/{corpus_label(c)}" for c in cfg.corpora[1:])]
    keys: dict[str, type] = {"run_id": str}
    keys.update({f"{p}/len{n}/{m}": float for p in prefixes for n in lengths for m in ("ppl", "loss")})
    if cfg.entropy and cfg.position_windows:
        keys.update({f"{cfg.split}/len{n}/entropy": float for n in lengths})
    if cfg.passkey_keys:
        depths = [round(100 * i / cfg.passkey_depths) for i in range(cfg.passkey_depths)]
        keys.update({f"passkey/len{n}/{m}": float for n in passkey for m in ("acc", "key_nll")})
        keys.update({f"passkey/len{n}/depth{d}/acc": float for n in passkey for d in depths})
    if cfg.longctx_samples:
        keys.update({f"longctx/{t}/len{n}/score": float for t in cfg.longctx_tasks for n in passkey})
    return keys
