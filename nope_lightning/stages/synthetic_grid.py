"""``synthetic-grid``: the tasks of Kazemnejad et al. (2023) x position encodings x seeds.

``run(cfg)`` trains and evaluates every (task, PE, seed) as a child of one parent run (``synthetic.py``'s
``train_and_evaluate``), then logs on the parent the OOD table (task x PE, mean over seeds), the PEs' mean
reciprocal rank over (task, seed) with ties averaged, per-length curves per task and the attention analysis
(``analysis/synthetic/grid.py``).

Resume: the same command again (the same resolved config, whose ``config_hash`` tags the parent) continues that
config's newest parent, killed, failed or finished, training only the cells not finished (stderr names those reused).
A cell is finished once its child run has the ``grid_cell`` tag, set last, after its ``results.json`` and kept weights
(not the run's status: Lightning marks it FINISHED when ``fit`` ends, before the test). A cell stopped in training
resumes from the checkpoint of its last validation and ends as if never stopped (``train_and_evaluate``). A (task,
seed)'s attention analysis, which needs all its models and the previous seed's NoPE (the floor), is stored on the
parent (``attention_by_seed/<task>_s<seed>.json``); until then its cells' weights, its NoPE's until the next seed's,
and a training cell's checkpoints (``<task>_s<seed>_<pe>_training/``) are kept in
``mlruns/checkpoints/synthetic-grid/<parent run>/`` (beside the artifact root; ``log_model`` may be off).
"""

from __future__ import annotations

import itertools
import shutil
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from safetensors.torch import load_file

from nope_lightning.analysis.synthetic import grid as synthetic_grid
from nope_lightning.analysis.synthetic import grid_plots
from nope_lightning.config.parts import TrackingConfig
from nope_lightning.config.synthetic import PAPER_NAMES, SyntheticConfig, SyntheticGridConfig
from nope_lightning.data.synthetic_batches import SyntheticData
from nope_lightning.model.gpt import GPT
from nope_lightning.results.synthetic import SeedAttention, SyntheticCell, SyntheticGridResult, TaskAttention
from nope_lightning.runtime import stopping, tracking
from nope_lightning.stages.synthetic import (
    Trained,
    build_model,
    metric_prefix,
    save_weights,
    train_and_evaluate,
)
from nope_lightning.training.trainer import resume_note

GRID_TAG = "grid_hash"  # on the parent: the config's hash, by which running it again finds it
CELL_TAG = "grid_cell"  # on a child, set last: ``cell_key``, once all the grid needs of the cell is stored
ATTENTION_DIR = "attention_by_seed"  # the parent's folder of (task, seed) attention analyses
KEPT = "keeps every finished cell"  # what a stopped grid's rerun does (``stopping.stop_line``)


def analyse_cell(runs: dict[str, Trained], grid: SyntheticGridConfig,
                 previous: tuple[int, GPT] | None) -> synthetic_grid.AttentionReport:
    """Attention of every PE of one (task, seed) against its NoPE model, and the floor: ``previous`` (a seed and its
    NoPE model; None: no floor) against that NoPE model."""
    gpu = grid.base.trainer.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()  # as the runs trained
    device = torch.device("cuda" if gpu else "cpu")
    models = {pe: trained.model.to(device) for pe, trained in runs.items()}
    data = runs["nope"].data
    sequences = synthetic_grid.analysis_sequences(data.vocab, data.valid + data.test, grid.attention_examples_per_length,
                                            data.cfg.train_max)
    floor = None if previous is None else (previous[0], previous[1].to(device))
    report = synthetic_grid.analyse_attention(models, sequences, reference="nope", bins=grid.distance_bins, floor=floor)
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
            curves[r.task][r.pos_encoding][synthetic_grid.bucket_start(b.bucket)].append(b.acc)
    return GridSummary(ood, ids, curves)


def grid_mrr(results: Sequence[SyntheticCell], pes: Sequence[str]) -> dict[str, float]:
    """MRR of the PEs by OOD accuracy over (task, seed) queries, ties averaged."""
    by_cell = {(r.task, r.seed, r.pos_encoding): r.ood_acc for r in results}
    queries = sorted({(task, seed) for task, seed, _ in by_cell})
    return synthetic_grid.mrr_with_ties({pe: [by_cell[(task, seed, pe)] for task, seed in queries] for pe in pes})


def log_grid(grid: SyntheticGridConfig, parent: str, results: list[SyntheticCell],
             reports: dict[tuple[str, int], synthetic_grid.AttentionReport]) -> SyntheticGridResult:
    """Tables, MRR, per-length curves and attention plots on the parent run; returns the summary."""
    track, pes = grid.base.tracking, grid.pos_encodings
    summary, mrr = summarise(results), grid_mrr(results, pes)
    tables = {"ood": grid_plots.markdown_table(summary.ood, pes, PAPER_NAMES, mrr),
              "id": grid_plots.markdown_table(summary.id, pes, PAPER_NAMES)}
    mean_ood = {task: {pe: float(np.mean(v)) for pe, v in row.items()} for task, row in summary.ood.items()}
    metrics = {f"mrr/{pe}": value for pe, value in mrr.items()}
    for task, pe in itertools.product(grid.tasks, pes):
        metrics[f"{metric_prefix(task, pe)}/ood_acc"] = mean_ood[task][pe]
        metrics[f"{metric_prefix(task, pe)}/id_acc"] = float(np.mean(summary.id[task][pe]))
    tracking.log_metrics(track, parent, metrics)
    tracking.log_text(track, parent, "## OOD exact match\n\n" + tables["ood"] + "\n## ID exact match\n\n"
                      + tables["id"], "ood_table.md")
    tracking.log_figure(track, parent, grid_plots.plot_ood_table(mean_ood, pes, PAPER_NAMES, mrr), "ood_table.png")
    train_max = {r.task: r.train_max_len for r in results}
    attention = log_attention(grid, parent, reports, train_max)
    for task in grid.tasks:
        curves = {PAPER_NAMES.get(pe, pe): {x: float(np.mean(v)) for x, v in summary.curves[task][pe].items()}
                  for pe in pes}
        tracking.log_figure(track, parent, grid_plots.plot_curves(curves, train_max[task], f"{task} (mean over seeds)",
                                                            "exact match"), f"per_length/{task}.png")
    out = SyntheticGridResult(parent, mrr, mean_ood, tables, attention, results)
    tracking.log_json(track, parent, out.to_dict(), "results.json")
    return out


def log_attention(grid: SyntheticGridConfig, parent: str, reports: dict[tuple[str, int], synthetic_grid.AttentionReport],
                  train_max: dict[str, int]) -> dict[str, TaskAttention]:
    """Per task, ``synthetic_grid.task_attention`` (JSD to NoPE over seeds, attended distances), plotted."""
    out: dict[str, TaskAttention] = {}
    for task in grid.tasks:
        if not (cells := {seed: report for (t, seed), report in reports.items() if t == task}):
            continue
        out[task] = a = synthetic_grid.task_attention(cells, PAPER_NAMES)
        for name, figure in grid_plots.attention_figures(task, a, train_max[task]).items():
            tracking.log_figure(grid.base.tracking, parent, figure, name)
    return out


# --- resume (module docstring) -------------------------------------------------------------------------

def grid_line(line: str) -> None:
    print(f"synthetic-grid {line}", file=sys.stderr, flush=True)


def cell_key(cell: SyntheticConfig) -> str:
    """``task/pe/s<seed>``: a finished cell's ``CELL_TAG``."""
    return f"{cell.task}/{cell.pos_encoding}/s{cell.seed}"


def group_name(task: str, seed: int) -> str:
    """A (task, seed)'s stored attention analysis (``<name>.json``) and folder of kept weights."""
    return f"{task}_s{seed}"


class Grid(NamedTuple):
    """The parent run, ``cell key -> run id`` of its finished cells, the ``group_name``s analysed."""

    parent: str
    finished: dict[str, str]
    analysed: set[str]


def open_grid(cfg: SyntheticGridConfig) -> Grid:
    """The newest parent run of this config, continued by this process, else a new one. A parent still
    running in a live process is refused: two processes would train the same cells."""
    track, digest = cfg.base.tracking, cfg.config_hash
    client, experiment = tracking.client(track), tracking.experiment_id(track)
    found = client.search_runs([experiment], f"tags.{GRID_TAG} = '{digest}'",
                               order_by=["attributes.start_time DESC"], max_results=1)
    if not found:
        parent = tracking.create_run(track, "synthetic-grid", cfg.run_name, cfg)
        client.set_tag(parent, GRID_TAG, digest)
        return Grid(parent, {}, set())
    parent, owner = found[0].info.run_id, found[0].data.tags.get(tracking.OWNER_TAG, "")
    if found[0].info.status == "RUNNING" and tracking.owner_alive(owner):
        raise ValueError(f"synthetic-grid {cfg.run_name!r} is already running as run {parent} (process {owner}); "
                         f"wait for it, or stop it and run the same command again to resume it")
    tracking.claim_run(track, parent)
    children = client.search_runs([experiment], f"tags.`{tracking.PARENT_TAG}` = '{parent}'",
                                  order_by=["attributes.start_time DESC"], max_results=50_000)  # MLflow's most
    # oldest first, so that a cell trained again (its kept weights were lost) maps to its newest run
    finished = {c.data.tags[CELL_TAG]: c.info.run_id for c in reversed(children) if CELL_TAG in c.data.tags}
    return Grid(parent, finished, {Path(a.path).stem for a in client.list_artifacts(parent, ATTENTION_DIR)})


def kept_weights(cfg: SyntheticGridConfig, parent: str) -> Path:
    """The folder of the weights kept until their (task, seed)'s attention analysis (NoPE's: the next seed's) is stored."""
    return Path(cfg.base.tracking.artifact_root).parent / "checkpoints" / "synthetic-grid" / parent


def load_model(cell: SyntheticConfig, weights: Path) -> tuple[GPT, SyntheticData]:
    """A finished cell's model again, from its kept weights, and its regenerated data."""
    model = build_model(cell, data := SyntheticData(cell))
    model.load_state_dict(load_file(str(weights)))
    return model, data


def previous_nope(cfg: SyntheticGridConfig, parent: str, task: str, seed: int) -> tuple[int, GPT] | None:
    """The seed and NoPE model that (task, seed)'s floor compares with (``synthetic_grid.floor_partner``), from the weights
    kept since that seed's analysis; None for the first seed, or when they are gone (said so)."""
    if (partner := synthetic_grid.floor_partner(cfg.seeds, seed)) is None:
        return None
    if not (weights := kept_weights(cfg, parent) / group_name(task, partner) / "nope.safetensors").exists():
        grid_line(f"{task}/s{seed}: no NoPE-vs-NoPE floor, seed {partner}'s NoPE weights are gone ({weights})")
        return None
    return partner, load_model(cfg.task_base(task).cell(task, "nope", partner, parent), weights)[0]


def release_weights(cfg: SyntheticGridConfig, parent: str, task: str, seed: int) -> None:
    """After (task, seed)'s analysis: the previous seed's kept weights (its NoPE served this floor) and this seed's
    but its NoPE, which the next seed's floor reads (the task's last seed keeps none)."""
    if (partner := synthetic_grid.floor_partner(cfg.seeds, seed)) is not None:
        shutil.rmtree(kept_weights(cfg, parent) / group_name(task, partner), ignore_errors=True)
    for path in (kept_weights(cfg, parent) / group_name(task, seed)).glob("*"):
        if seed == cfg.seeds[-1] or path.name != "nope.safetensors":
            path.unlink()


def run_group(cfg: SyntheticGridConfig, grid: Grid, cells: list[SyntheticConfig],
              analyse: bool) -> tuple[list[SyntheticCell], dict[str, Trained]]:
    """One (task, seed)'s results, training only its unfinished cells; with ``analyse`` also every PE's model
    (a finished cell's rebuilt from its kept weights, or trained again if they are gone)."""
    track = cfg.base.tracking
    folder = kept_weights(cfg, grid.parent) / group_name(cells[0].task, cells[0].seed)
    results, runs = [], {}
    for cell in cells:
        key, run_id = cell_key(cell), grid.finished.get(cell_key(cell))
        weights = folder / f"{cell.pos_encoding}.safetensors"
        if run_id is not None and (not analyse or weights.exists()):
            grid_line(f"{key}: finished in run {run_id}, reused")
            result = SyntheticCell.load(tracking.download(track, run_id, "results.json"))
            if analyse:
                runs[cell.pos_encoding] = Trained(result, *load_model(cell, weights))
        else:
            out = kept_weights(cfg, grid.parent) / f"{group_name(cell.task, cell.seed)}_{cell.pos_encoding}_training"
            stopping.STATE.note = lambda out=out, key=key: f"{KEPT}; {key}, stopped in training, {resume_note(out)}"
            grid_line(f"{key}: training" + (f" again: the weights of run {run_id}, which the attention analysis "
                                             f"needs, are gone ({weights})" if run_id else ""))
            trained = train_and_evaluate(cell, out)
            stopping.STATE.note = KEPT
            if analyse:
                folder.mkdir(parents=True, exist_ok=True)
                save_weights(trained.model, weights)
                runs[cell.pos_encoding] = trained
            tracking.client(track).set_tag(trained.result.run_id, CELL_TAG, key)
            shutil.rmtree(out)
            result = trained.result
        results.append(result)
    return results, runs


def store_report(track: TrackingConfig, parent: str, task: str, seed: int, report: synthetic_grid.AttentionReport) -> None:
    stored = SeedAttention(task, seed, report.stored(seed))
    tracking.log_json(track, parent, stored.to_dict(), f"{ATTENTION_DIR}/{group_name(task, seed)}.json")


def stored_report(track: TrackingConfig, parent: str, task: str, seed: int) -> synthetic_grid.AttentionReport:
    """``store_report``'s analysis back (JSON keeps every float exactly, so the aggregate is the same)."""
    stored = SeedAttention.load(tracking.download(track, parent, f"{ATTENTION_DIR}/{group_name(task, seed)}.json"))
    return synthetic_grid.AttentionReport.from_stored(stored.attention, seed)


def run(cfg: SyntheticGridConfig) -> dict[str, Any]:
    """The ``synthetic-grid`` stage: every (task, PE, seed) as a child run, then the aggregate; resumable."""
    track = cfg.base.tracking
    grid = open_grid(cfg)
    cells = cfg.cells(grid.parent)
    done = sum(cell_key(cell) in grid.finished for cell in cells)
    grid_line(f"run {grid.parent}: {len(cells)} cells, {done} already finished")
    stopping.STATE.note = KEPT
    try:
        results: list[SyntheticCell] = []
        reports: dict[tuple[str, int], synthetic_grid.AttentionReport] = {}
        # One (task, seed) at a time, so only its PEs' models are held for the attention analysis.
        for (task, seed), group in itertools.groupby(cells, key=lambda c: (c.task, c.seed)):
            analyse = bool(cfg.attention_examples_per_length) and group_name(task, seed) not in grid.analysed
            group_results, runs = run_group(cfg, grid, list(group), analyse)
            results += group_results
            if analyse:
                reports[(task, seed)] = analyse_cell(runs, cfg, previous_nope(cfg, grid.parent, task, seed))
                store_report(track, grid.parent, task, seed, reports[(task, seed)])
                release_weights(cfg, grid.parent, task, seed)
            elif cfg.attention_examples_per_length:
                reports[(task, seed)] = stored_report(track, grid.parent, task, seed)
        summary = log_grid(cfg, grid.parent, results, reports)
    except BaseException:
        tracking.end_run(track, grid.parent, "FAILED")
        raise
    shutil.rmtree(kept_weights(cfg, grid.parent), ignore_errors=True)  # what a kill left after an analysis
    tracking.end_run(track, grid.parent)
    return summary.to_dict()
