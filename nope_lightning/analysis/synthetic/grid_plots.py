"""The synthetic grid's own tables and plots, logged on its parent run (``stages.synthetic_grid``): OOD and ID exact
match (task x PE, mean ± std over seeds) with the MRR row, per-length curves, and the attention analysis's JSD to NoPE
(beside the NoPE-vs-NoPE floor) and attended-distance histograms. A report's figures over many grids are
``figures.py``'s; they reuse the drawing helpers here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from nope_lightning.analysis.markdown import render as render_table
from nope_lightning.results.synthetic import TaskAttention


def mean_std(values: Sequence[float]) -> str:
    """``0.99`` for one value, ``0.99 ± 0.01`` (population std) for several."""
    return f"{np.mean(values):.2f}" + (f" ± {np.std(values):.2f}" if len(values) > 1 else "")


def markdown_table(values: Mapping[str, Mapping[str, Sequence[float]]], columns: Sequence[str],
                   labels: Mapping[str, str], mrr: Mapping[str, float] | None = None) -> str:
    """Rows ``values[row][column]`` (a value per seed) as ``mean ± std``, with an optional MRR row."""
    rows = [[row, *(mean_std(cells[c]) for c in columns)] for row, cells in values.items()]
    if mrr is not None:
        rows.append(["**MRR**", *(f"{mrr[c]:.2f}" for c in columns)])
    return render_table(["task", *(labels.get(c, c) for c in columns)], rows) + "\n"


def _figure(width: float = 6.0, height: float = 4.0, ncols: int = 1, sharey: bool = False):
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(1, ncols, sharey=sharey)


def plot_curves(curves: Mapping[str, Mapping[int, float]], train_max: int, title: str, ylabel: str):
    """One line per name of ``curves[name][x]``, with the training maximum marked; returns a Figure."""
    fig, ax = _figure()
    draw_curves(ax, curves, train_max, title, ylabel)
    return fig


def plot_layer_curves(curves: Mapping[str, Mapping[int, Sequence[float]]], train_max: int, title: str,
                      ylabel: str):
    """One panel per layer of ``curves[name][x][layer]`` (layer 1 first), shared y axis; returns a Figure."""
    layers = len(next(iter(next(iter(curves.values())).values())))
    fig, axes = _figure(3.2 * layers, 3.2, ncols=layers, sharey=True)
    for layer, ax in enumerate(np.atleast_1d(axes)):
        draw_curves(ax, {name: {x: v[layer] for x, v in points.items()} for name, points in curves.items()},
                     train_max, f"layer {layer + 1}", ylabel if layer == 0 else "")
    fig.suptitle(title)
    return fig


def draw_curves(ax, curves: Mapping[str, Mapping[int, float]], train_max: int, title: str, ylabel: str) -> None:
    """One line per name of ``curves[name][x]`` on ``ax``, the training maximum dashed."""
    for name, points in curves.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", markersize=3, label=name)
    ax.axvline(train_max + 0.5, color="grey", linestyle="--", linewidth=1, label="train max")
    ax.set(title=title, xlabel="length", ylabel=ylabel)
    ax.legend(fontsize=8)


#: The NoPE-vs-NoPE floor's name in the attention plots and table.
FLOOR = "floor: NoPE, previous seed"


def attention_figures(task: str, a: TaskAttention, train_max: int) -> dict:
    """One task's attention plots of a grid, by artifact name: each PE's min-head JSD to NoPE per length (mean over
    layers) and per layer, beside the NoPE-vs-NoPE floor where a seed has one (the floor's seeds only; a grid of NoPE
    alone has nothing else, and a grid of NoPE alone without a floor no JSD plot), and the attended-distance
    histograms. Values are means over seeds (``task_attention``)."""
    floor = {FLOOR: a.floor_by_layer} if a.floor_by_layer else {}
    by_layer = {**a.jsd_by_layer, **floor}
    figures = {}
    if by_layer:
        mean = {**a.jsd, **{name: {n: float(np.mean(v)) for n, v in curve.items()} for name, curve in floor.items()}}
        figures[f"attention/jsd_{task}.png"] = plot_curves(
            mean, train_max, f"{task}: min-head JSD to NoPE (nats, mean over layers)", "JSD (nats)")
        figures[f"attention/jsd_by_layer_{task}.png"] = plot_layer_curves(
            by_layer, train_max, f"{task}: min-head JSD to NoPE per layer (nats)", "JSD (nats)")
    figures[f"attention/distance_{task}.png"] = plot_distance_hist(
        a.hist, a.edges, f"{task}: attended distance, OOD output queries")
    return figures


def plot_ood_table(table: Mapping[str, Mapping[str, float]], columns: Sequence[str],
                   labels: Mapping[str, str], mrr: Mapping[str, float]):
    """Heatmap of mean OOD accuracy (task x PE) beside a bar chart of the MRR; returns a Figure."""
    rows = list(table)
    grid = np.array([[table[r][c] for c in columns] for r in rows])
    names = [labels.get(c, c) for c in columns]
    fig, (heat, bars) = _figure(11.0, 1.2 + 0.5 * len(rows), ncols=2)
    heat.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    heat.set_xticks(range(len(columns)), names)
    heat.set_yticks(range(len(rows)), rows)
    for (i, j), value in np.ndenumerate(grid):
        heat.text(j, i, f"{value:.2f}", ha="center", va="center", color="white" if value < 0.5 else "black")
    heat.set_title("OOD exact match (mean over seeds)")
    bars.bar(names, [mrr[c] for c in columns])
    bars.set(title="MRR (ties averaged)", ylim=(0, 1))
    return fig


def plot_distance_hist(hist: Mapping[str, Sequence[int]], edges: Sequence[float], title: str):
    """Normalised attended-distance histograms, one panel per PE (fractions of queries); a Figure."""
    fig, axes = _figure(2.6 * len(hist), 2.8, ncols=len(hist), sharey=True)
    edges = np.asarray(edges)
    for ax, (name, counts) in zip(np.atleast_1d(axes), hist.items(), strict=True):
        counts = np.asarray(counts)
        ax.bar(edges[:-1], counts / max(1, counts.sum()), width=np.diff(edges), align="edge")
        ax.set(title=name, xlabel="(i - argmax j) / (i + 1)", xlim=(0, 1))
    fig.suptitle(title)
    return fig
