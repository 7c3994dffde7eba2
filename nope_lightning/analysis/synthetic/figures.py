"""Paper 002's figures over every grid a report reads (a study may span several files, seeds and stores): exact
match per length, per-layer JSD to NoPE against the NoPE-vs-NoPE floor, and attended-distance histograms.

Each figure pools grids as the claims do: a (task, scratchpad) panel averages its cells over seeds, a histogram sums
its grids' counts (every grid analyses the same number of examples per length). The grids' own per-grid figures
are not shown: with one grid per (task, seed) they would each show one seed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np
from matplotlib.figure import Figure  # no pyplot: no global state

from nope_lightning.analysis.report_frame import Plot, over_seeds, seeds
from nope_lightning.analysis.synthetic import grid_plots
from nope_lightning.analysis.synthetic.attention_claims import T5_CLOSEST, attention_index, claim_tasks
from nope_lightning.analysis.synthetic.cells import panel_rank
from nope_lightning.analysis.synthetic.grid import bucket_start
from nope_lightning.analysis.verdicts import NotMeasured
from nope_lightning.config.synthetic import PAPER_NAMES, PAPER_PES
from nope_lightning.results.synthetic import SyntheticGridResult


def _panel_name(task: str, scratchpad: str) -> str:
    return task if scratchpad == "none" else f"{task} ({scratchpad})"


def accuracy_by_length(grids: Iterable[SyntheticGridResult]) -> Plot | None:
    """Exact match per length (ID and OOD buckets) per PE, mean over the panel's seeds (named in its title), one
    panel per (task, scratchpad); the training maximum dashed. None without cells."""
    per_panel: dict[tuple[str, str], dict[str, dict[int, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    train_max: dict[tuple[str, str], int] = {}  # the cells' own (a config may set train_max_len)
    panel_seeds: dict[str, set[int]] = defaultdict(set)
    for grid in grids:
        for cell in grid.runs:
            train_max[(cell.task, cell.scratchpad)] = cell.train_max_len
            panel_seeds[_panel_name(cell.task, cell.scratchpad)].add(cell.seed)
            for bucket in cell.buckets:
                x = bucket_start(bucket.bucket)
                per_panel[(cell.task, cell.scratchpad)][cell.pos_encoding][x].append(bucket.acc)
    if not per_panel:
        return None
    order = sorted(per_panel, key=lambda k: panel_rank(*k))  # the tables' task order
    columns = min(4, len(order))
    rows = -(-len(order) // columns)
    fig = Figure(figsize=(4.0 * columns, 3.2 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, columns, sharey=True)).ravel()
    for ax, (task, scratchpad) in zip(axes, order, strict=False):  # a last row may have empty panels
        pes = per_panel[(task, scratchpad)]
        named = {PAPER_NAMES.get(pe, pe): {x: float(np.mean(v)) for x, v in pes[pe].items()}
                 for pe in sorted(pes, key=lambda p: PAPER_PES.index(p) if p in PAPER_PES else len(PAPER_PES))}
        name = _panel_name(task, scratchpad)  # a panel names its seeds: panels of one figure may hold different ones
        grid_plots.draw_curves(ax, named, train_max[(task, scratchpad)], f"{name}, {seeds(panel_seeds[name])}",
                               "exact match")
    for ax in axes[len(order):]:
        ax.set_visible(False)
    fig.suptitle("Exact match per length, mean over each panel's seeds (left of the dashed line: training lengths)")
    return Plot(fig, "Exact match per length of each PE, one panel per task (a scratchpad format in "
                     f"brackets), {over_seeds(panel_seeds)}; left of the dashed line: the training lengths.")


def jsd_by_layer(grids: Iterable[SyntheticGridResult]) -> dict[str, Plot]:
    """Per task the attention claim reads (SCAN, else every analysed task): each PE's min-head JSD to NoPE per
    layer, mean over seeds, beside the NoPE-vs-NoPE floor (dashed). ``{file name: Plot}``; empty without
    values."""
    index = attention_index(grids)
    try:
        tasks, _ = claim_tasks(T5_CLOSEST, index)
    except NotMeasured:
        return {}
    figures = {}
    for task in tasks:
        by_seed = index[task]
        pes = list(dict.fromkeys(pe for s in by_seed.values() for pe in s.pes))
        floors = [s.floor for s in by_seed.values() if s.floor]
        if not (curves := [*(s.pes[pe] for s in by_seed.values() for pe in s.pes), *floors]):
            continue
        layers = np.arange(1, len(curves[0]) + 1)  # one model: one layer count (a grid of NoPE alone: its floor's)
        fig = Figure(figsize=(5.5, 3.6), layout="constrained")
        ax = fig.subplots()
        for pe in pes:
            values = np.asarray([s.pes[pe] for s in by_seed.values() if pe in s.pes])
            ax.plot(layers, values.mean(0), marker="o", label=f"{pe} ({len(values)})")
        if floors:
            ax.plot(layers, np.asarray(floors).mean(0), "k--", label=f"{grid_plots.FLOOR} ({len(floors)})")
        ax.set(title=f"{task}: JSD of each PE's attention to NoPE's (seeds)", xlabel="layer",
               ylabel="min-head JSD (nats)", xticks=layers)
        ax.legend(fontsize=8)
        figures[f"synthetic_jsd_{task}.png"] = Plot(fig, (
            f"{task}: each PE's attention against NoPE's (min-head JSD per layer, the PE's seed count in "
            f"brackets), {over_seeds({task: by_seed})}; dashed: NoPE against NoPE of the grid's previous seed, "
            "the floor."))
    return figures


def distance_histograms(grids: Iterable[SyntheticGridResult]) -> dict[str, Plot]:
    """Attended-distance histograms per PE, summed over the grids (seeds) of each (task, scratchpad) analysed.
    ``{file name: Plot}``."""
    pooled: dict[tuple[str, str], dict[str, np.ndarray]] = defaultdict(dict)
    edges: dict[tuple[str, str], list[float]] = {}
    grid_seeds: dict[tuple[str, str], set[int]] = defaultdict(set)
    for grid in grids:
        scratchpads = {c.task: c.scratchpad for c in grid.runs}
        for task, attention in grid.attention.items():
            key = (task, scratchpads.get(task, "none"))
            edges[key] = attention.edges
            grid_seeds[key] |= {c.seed for c in grid.runs if c.task == task}
            for pe, counts in attention.hist.items():
                pooled[key][pe] = pooled[key].get(pe, 0) + np.asarray(counts)
    return {f"synthetic_distance_{task}{'' if s == 'none' else '_' + s}.png": Plot(
        grid_plots.plot_distance_hist(pooled[(task, s)], edges[(task, s)],
                                      f"{_panel_name(task, s)}: attended distance, OOD output queries "
                                      f"(all layers and heads, {_seeds(len(grid_seeds[(task, s)]))})"),
        f"{_panel_name(task, s)}: how far back each PE's attention reaches from the OOD output queries (all "
        f"layers and heads), summed over {seeds(grid_seeds[(task, s)])}.") for task, s in sorted(pooled)}


def _seeds(n: int) -> str:
    """How many seeds a pooled histogram sums (a grid may hold several): a figure of one seed does not say it sums
    seeds."""
    return "one seed" if n == 1 else f"summed over {n} seeds"


def study_figures(grids: list[SyntheticGridResult]) -> dict[str, Plot | None]:
    """Every paper-002 figure of ``grids`` with its caption: ``{file name: Plot}`` (None: no cells to
    draw)."""
    figures = {"synthetic_accuracy_by_length.png": accuracy_by_length(grids)}
    return {**figures, **jsd_by_layer(grids), **distance_histograms(grids)}
