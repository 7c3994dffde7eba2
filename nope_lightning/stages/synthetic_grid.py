"""``synthetic-grid``: the tasks of Kazemnejad et al. (2023) x position encodings x seeds.

``run(cfg)`` trains and evaluates every (task, PE, seed) as a child of one parent run (``synthetic.py``'s
``train_and_evaluate``), then logs on the parent the OOD table (task x PE, mean over seeds), the PEs' mean
reciprocal rank over (task, seed) with ties averaged, per-length curves per task and the attention analysis
(``synthetic/analysis.py``).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from nope_lightning import tracking
from nope_lightning.config.parts import TrainerConfig
from nope_lightning.config.synthetic import PAPER_NAMES, SyntheticGridConfig
from nope_lightning.results.synthetic import SyntheticCell, SyntheticGridResult, TaskAttention
from nope_lightning.stages.synthetic import SyntheticData, Trained, metric_prefix, train_and_evaluate
from nope_lightning.synthetic import analysis


def analysis_device(cfg: TrainerConfig) -> torch.device:
    """Where the attention analysis runs: the GPU when the runs trained on one, else the CPU."""
    gpu = cfg.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    return torch.device("cuda" if gpu else "cpu")


def analysis_sequences(data: SyntheticData, per_length: int, train_max: int) -> list[analysis.AnalysisSequence]:
    """The first ``per_length`` examples of every length: ID ones from valid, OOD ones from test."""
    taken: dict[int, int] = defaultdict(int)
    sequences = []
    for example in data.valid + data.test:
        if taken[example.length] < per_length:
            taken[example.length] += 1
            ids, _ = data.vocab.encode(example)
            sequences.append(analysis.AnalysisSequence(example.length, torch.tensor(ids),
                                                       len(data.vocab.encode_prompt(example)) - 1,
                                                       example.length > train_max))
    return sorted(sequences, key=lambda s: s.length)


def analyse_cell(runs: dict[str, Trained], grid: SyntheticGridConfig) -> analysis.AttentionReport:
    """Attention of every PE of one (task, seed) against its NoPE model."""
    device = analysis_device(grid.base.trainer)
    models = {pe: trained.model.to(device) for pe, trained in runs.items()}
    data = runs["nope"].data
    sequences = analysis_sequences(data, grid.attention_examples_per_length, data.cfg.train_max)
    report = analysis.analyse_attention(models, sequences, reference="nope", bins=grid.distance_bins)
    for model in models.values():
        model.cpu()
    return report


class GridSummary(NamedTuple):
    """Per task and PE, one value per seed: OOD and ID exact match, and per-length accuracy curves."""

    ood: dict[str, dict[str, list[float]]]
    id: dict[str, dict[str, list[float]]]
    curves: dict[str, dict[str, dict[int, list[float]]]]


def summarise(results: Sequence[SyntheticCell]) -> GridSummary:
    ood: dict = defaultdict(lambda: defaultdict(list))
    ids: dict = defaultdict(lambda: defaultdict(list))
    curves: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in results:
        ood[r.task][r.pos_encoding].append(r.ood_acc)
        ids[r.task][r.pos_encoding].append(r.id_acc)
        for b in r.buckets:
            curves[r.task][r.pos_encoding][analysis.bucket_start(b.bucket)].append(b.acc)
    return GridSummary(ood, ids, curves)


def grid_mrr(results: Sequence[SyntheticCell], pes: Sequence[str]) -> dict[str, float]:
    """MRR of the PEs by OOD accuracy over (task, seed) queries, ties averaged."""
    by_cell = {(r.task, r.seed, r.pos_encoding): r.ood_acc for r in results}
    queries = sorted({(task, seed) for task, seed, _ in by_cell})
    return analysis.mrr_with_ties({pe: [by_cell[(task, seed, pe)] for task, seed in queries] for pe in pes})


def log_grid(grid: SyntheticGridConfig, parent: str, results: list[SyntheticCell],
             reports: dict[tuple[str, int], analysis.AttentionReport]) -> SyntheticGridResult:
    """Tables, MRR, per-length curves and attention plots on the parent run; returns the summary."""
    track, pes = grid.base.tracking, grid.pos_encodings
    summary, mrr = summarise(results), grid_mrr(results, pes)
    tables = {"ood": analysis.markdown_table(summary.ood, pes, PAPER_NAMES, mrr),
              "id": analysis.markdown_table(summary.id, pes, PAPER_NAMES)}
    mean_ood = {task: {pe: float(np.mean(v)) for pe, v in row.items()} for task, row in summary.ood.items()}
    metrics = {f"mrr/{pe}": value for pe, value in mrr.items()}
    for task, pe in itertools.product(grid.tasks, pes):
        metrics[f"{metric_prefix(task, pe)}/ood_acc"] = mean_ood[task][pe]
        metrics[f"{metric_prefix(task, pe)}/id_acc"] = float(np.mean(summary.id[task][pe]))
    tracking.log_metrics(track, parent, metrics)
    tracking.log_text(track, parent, "## OOD exact match\n\n" + tables["ood"] + "\n## ID exact match\n\n"
                      + tables["id"], "ood_table.md")
    tracking.log_figure(track, parent, analysis.plot_ood_table(mean_ood, pes, PAPER_NAMES, mrr), "ood_table.png")
    train_max = {r.task: r.train_max_len for r in results}
    attention = log_attention(grid, parent, reports, train_max)
    for task in grid.tasks:
        curves = {PAPER_NAMES.get(pe, pe): {x: float(np.mean(v)) for x, v in summary.curves[task][pe].items()}
                  for pe in pes}
        tracking.log_figure(track, parent, analysis.plot_curves(curves, train_max[task], f"{task} (mean over seeds)",
                                                                "exact match"), f"per_length/{task}.png")
    out = SyntheticGridResult(parent, mrr, mean_ood, tables, attention, results)
    tracking.log_json(track, parent, out.to_dict(), "results.json")
    return out


def log_attention(grid: SyntheticGridConfig, parent: str, reports: dict[tuple[str, int], analysis.AttentionReport],
                  train_max: dict[str, int]) -> dict[str, TaskAttention]:
    """Per task: JSD-to-NoPE vs length (mean over seeds) and attended-distance histograms (summed)."""
    out: dict[str, TaskAttention] = {}
    for task in grid.tasks:
        cells = [report for (t, _), report in reports.items() if t == task]
        if not cells:
            continue
        jsd = {PAPER_NAMES.get(pe, pe): {length: float(np.mean([c.jsd[pe][length] for c in cells]))
                                         for length in cells[0].jsd[pe]}
               for pe in cells[0].jsd}
        by_layer = {PAPER_NAMES.get(pe, pe): {length: np.mean([c.jsd_layers[pe][length] for c in cells], axis=0).tolist()
                                              for length in cells[0].jsd_layers[pe]}
                    for pe in cells[0].jsd_layers}
        hist = {PAPER_NAMES.get(pe, pe): sum(c.hist[pe] for c in cells) for pe in cells[0].hist}
        track = grid.base.tracking
        tracking.log_figure(track, parent, analysis.plot_curves(
            jsd, train_max[task], f"{task}: min-head JSD to NoPE (nats, mean over layers)", "JSD (nats)"),
            f"attention/jsd_{task}.png")
        tracking.log_figure(track, parent, analysis.plot_layer_curves(
            by_layer, train_max[task], f"{task}: min-head JSD to NoPE per layer (nats)", "JSD (nats)"),
            f"attention/jsd_by_layer_{task}.png")
        tracking.log_figure(track, parent, analysis.plot_distance_hist(
            hist, cells[0].edges, f"{task}: attended distance, OOD output queries"),
            f"attention/distance_{task}.png")
        out[task] = TaskAttention(jsd, by_layer, {pe: counts.tolist() for pe, counts in hist.items()},
                                  cells[0].edges.tolist())
    return out


def run(cfg: SyntheticGridConfig) -> dict[str, Any]:
    """The ``synthetic-grid`` stage: every (task, PE, seed) as a child run, then the aggregate."""
    track = cfg.base.tracking
    parent = tracking.create_run(track, "synthetic-grid", cfg.run_name, cfg)
    try:
        results: list[SyntheticCell] = []
        reports: dict[tuple[str, int], analysis.AttentionReport] = {}
        # One (task, seed) at a time, so only its PEs' models are held for the attention analysis.
        for (task, seed), cells in itertools.groupby(cfg.cells(parent), key=lambda c: (c.task, c.seed)):
            runs = {cell.pos_encoding: train_and_evaluate(cell) for cell in cells}
            results += [trained.result for trained in runs.values()]
            if cfg.attention_examples_per_length:
                reports[(task, seed)] = analyse_cell(runs, cfg)
        summary = log_grid(cfg, parent, results, reports)
    except BaseException:
        tracking.end_run(track, parent, "FAILED")
        raise
    tracking.end_run(track, parent)
    return summary.to_dict()
