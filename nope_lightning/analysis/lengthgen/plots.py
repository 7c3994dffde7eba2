"""Matplotlib figures in the papers' styles (the evaluate stage and the report both draw with these).

Each function returns a ``Figure``; ``tracking.log_figure`` saves it as a PNG artifact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib
import matplotlib.ticker

from nope_lightning.results.search import ScaleSearchResult

matplotlib.use("Agg")  # headless: figures are only ever written to files
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

# Fixed colours for the position encodings most figures share, so nope and rope never swap or share a hue.
FIXED_SLOTS = {"nope": 0, "rope": 1, "alibi": 2}
PALETTE = plt.get_cmap("tab10").colors  # qualitative: ten distinct hues, no light/dark pairs
LIGHT = plt.get_cmap("tab20").colors[1::2]  # each tab10 hue's lighter partner, in the same order
FREE = [i for i in range(len(PALETTE)) if i not in FIXED_SLOTS.values()]
MARKERS = "osD^vP*Xh<>p"
LINESTYLES = ("-", "--", ":")
_slots: dict[str, int] = {}  # other methods, numbered in first-drawn order: one style per label per process


def method_style(label: str) -> dict:
    """Line style of a method, the same in every figure of a process (a report draws several).

    Colour from tab10; each method also gets its own hollow marker, so a curve hidden under another
    still shows, and methods beyond the free colours repeat a hue with another line style, the second time in
    its lighter shade (tab20's partner), so two methods of one figure never share both colour and style.
    """
    if label in FIXED_SLOTS:
        color, marker, linestyle = PALETTE[FIXED_SLOTS[label]], MARKERS[FIXED_SLOTS[label]], "-"
    else:
        slot = _slots.setdefault(label, len(_slots))
        color = (PALETTE, LIGHT)[slot // len(FREE) % 2][FREE[slot % len(FREE)]]
        marker = MARKERS[(len(FIXED_SLOTS) + slot) % len(MARKERS)]
        linestyle = LINESTYLES[slot // len(FREE) % len(LINESTYLES)]
    return {"color": color, "marker": marker, "linestyle": linestyle, "markerfacecolor": "none",
            "markersize": 5}


Curve = tuple[Sequence[float], ...]


def position_curves(logppl: Mapping[str, Curve], entropy: Mapping[str, Curve], train_len: int,
                    bound: tuple[Sequence[float], Sequence[float]] | None = None, title: str = ""):
    """Fig 1 style: log-PPL (top) and mean attention entropy in nats (bottom) vs position, per method.

    Each mapping is ``label -> (positions, values)`` or ``(positions, values, low, high)``, whose interval is
    drawn as a shaded band; the training length is marked by a dashed line and ``bound`` (positions, log i) is
    drawn as the entropy upper bound.
    """
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for ax, curves in ((top, logppl), (bottom, entropy)):
        for label, (x, y, *band) in curves.items():
            style = method_style(label)
            ax.plot(x, y, label=label, linewidth=1.2, alpha=0.9, **style)
            if band:
                ax.fill_between(x, band[0], band[1], color=style["color"], alpha=0.15, linewidth=0)
    if bound is not None:
        bottom.plot(*bound, color="gray", linestyle=":", label="log i (uniform attention)")
    for ax, ylabel in ((top, "log-PPL (nats/token)"), (bottom, "attention entropy (nats)")):
        ax.axvline(train_len, color="black", linestyle="--", linewidth=1)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    bottom.set_xlabel(f"position (train length {train_len} dashed)")
    top.set_title(title)
    fig.tight_layout()
    return fig


def entropy_heatmap(entropy: np.ndarray, edges: Sequence[int], train_len: int, title: str = ""):
    """Fig 3/10 style: entropy (nats) per (layer, head) row x position bucket, with log i per bucket.

    ``entropy`` is (n_layer, n_head, n_buckets); ``edges`` the bucket edges (n_buckets + 1).
    """
    n_layer, n_head, n_buckets = entropy.shape
    fig, (ax, bound_ax) = plt.subplots(2, 1, figsize=(8, 2 + 0.25 * n_layer * n_head),
                                       gridspec_kw={"height_ratios": [n_layer * n_head, 3]}, sharex=True)
    image = ax.imshow(entropy.reshape(n_layer * n_head, n_buckets), aspect="auto", cmap="viridis",
                      interpolation="nearest")
    fig.colorbar(image, ax=[ax, bound_ax], label="entropy (nats)")
    ax.set_yticks(range(0, n_layer * n_head, n_head), [f"layer {layer}" for layer in range(n_layer)])
    ax.set_ylabel("layer / head")
    centers = [(a + b - 1) / 2 for a, b in zip(edges[:-1], edges[1:], strict=True)]
    bound_ax.plot(range(n_buckets), [math.log(c + 1) for c in centers], color="gray", label="log i")
    bound_ax.plot(range(n_buckets), np.nanmean(entropy, axis=(0, 1)), color="C1", label="mean")
    bound_ax.legend(fontsize=8)
    past = [b for b, c in enumerate(centers) if c >= train_len]
    if past:
        for a in (ax, bound_ax):
            a.axvline(past[0] - 0.5, color="white" if a is ax else "black", linestyle="--", linewidth=1)
    labels = [f"{int(a)}" for a in edges[:-1]]
    step = max(1, n_buckets // 8)
    bound_ax.set_xticks(range(0, n_buckets, step), labels[::step])
    bound_ax.set_xlabel("position bucket start")
    ax.set_title(title)
    return fig


def passkey_heatmap(accuracy: Mapping[tuple[int, float], float], title: str = ""):
    """Fig 6 style: passkey accuracy per (length, depth) cell, depth on y, length on x."""
    return passkey_heatmaps({title: accuracy})


def passkey_heatmaps(panels: Mapping[str, Mapping[tuple[int, float], float]], columns: int = 4):
    """One passkey heat map per ``title -> {(length, depth): accuracy}``, side by side, sharing one colour
    bar (0-1); each cell shows its accuracy, and a cell no prompt was scored in stays blank."""
    cols = min(columns, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(1.4 + 2.6 * cols, 0.8 + 2.6 * rows), squeeze=False,
                             layout="constrained")
    cmap = plt.get_cmap("RdYlGn")
    for ax, (title, accuracy) in zip(axes.flat, panels.items(), strict=False):
        lengths = sorted({length for length, _ in accuracy})
        depths = sorted({depth for _, depth in accuracy})
        grid = np.array([[accuracy.get((length, depth), np.nan) for length in lengths] for depth in depths])
        image = ax.imshow(grid, vmin=0, vmax=1, cmap=cmap, aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(length) for length in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{round(100 * d)}%" for d in depths], fontsize=7)
        for (row, col), value in np.ndenumerate(grid):
            if not np.isnan(value):
                red, green, blue, _ = cmap(value)
                dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5  # white text on dark cells
                ax.text(col, row, f"{value:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if dark else "black")
        ax.set_title(title, fontsize=9)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.supxlabel("prompt length (tokens)", fontsize=9)
    fig.supylabel("key depth", fontsize=9)
    fig.colorbar(image, ax=axes, label="passkey accuracy", shrink=0.9)
    return fig


def lambda_fit(summary: ScaleSearchResult, title: str = "uniform temperature search"):
    """Fig 7 style: best uniform lambda per position (s = i / L) with the fit lambda = 1 + a ln s, and the
    best lambda per target length (a report titles each search and seed apart)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    points = summary.per_position_best
    if points:
        s = np.array([p.s for p in points])
        ax.scatter(s, [p.temperature for p in points], s=14, label="best lambda per position bucket")
        a, r2 = summary.fit.a, summary.fit.r2
        if not math.isnan(a):
            grid = np.linspace(1, s.max(), 100)
            ax.plot(grid, 1 + a * np.log(grid), color="C1", label=f"1 + {a:.3f} ln s  (R^2 = {r2:.2f})")
    for length, lam in summary.best.items():
        ax.scatter([length / summary.train_len], [lam], marker="*", s=90, color="C3")
    ax.scatter([], [], marker="*", color="C3", label="best lambda per target length")
    ax.set_xlabel("s = position / train length")
    ax.set_ylabel("lambda (units of 1/sqrt(d))")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def learned_vs_entropy(entropy: np.ndarray, table: np.ndarray, target_len: int, what: str, floor: float,
                       title: str = ""):
    """Fig 5 style: HeadScale's learned per-head ``what`` (y: lambda in units of 1/sqrt(d), or HeadScale-log's
    slope a) against converged attention entropy (x, nats), one colour per layer, a dotted line at ``floor``.
    ``entropy`` and ``table`` are (n_layer, n_head); ``title`` (the report's names the method and
    seed) defaults to what and where."""
    n_layer = table.shape[0]
    colours = plt.get_cmap("viridis")(np.linspace(0, 1, n_layer))
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for layer in range(n_layer):
        ax.scatter(entropy[layer], table[layer], color=colours[layer], label=f"layer {layer}", s=18)
    ax.axhline(floor, color="gray", linestyle=":", linewidth=1)
    ax.set_xlabel(f"converged attention entropy at {target_len} (nats)")
    ax.set_ylabel(f"learned {what}")
    ax.set_title(title or f"HeadScale at {target_len}: per-head {what.split(' (')[0]} vs entropy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=max(1, n_layer // 8))
    fig.tight_layout()
    return fig


def head_grids(panels: Mapping[str, np.ndarray], columns: int = 4):
    """Fig 3 style: one (layer x head) heat map of attention entropy (nats) per ``title -> (n_layer, n_head)``
    matrix, side by side on one shared colour scale, each cell printed."""
    cols = min(columns, len(panels))
    rows = math.ceil(len(panels) / cols)
    n_layer, n_head = next(iter(panels.values())).shape
    fig, axes = plt.subplots(rows, cols, figsize=(1.2 + 0.65 * n_head * cols, 0.8 + 0.3 * n_layer * rows),
                             squeeze=False, layout="constrained")
    low = min(float(np.nanmin(m)) for m in panels.values())
    high = max(float(np.nanmax(m)) for m in panels.values())
    for ax, (title, matrix) in zip(axes.flat, panels.items(), strict=False):
        image = ax.imshow(matrix, aspect="auto", cmap="viridis", vmin=low, vmax=high, interpolation="nearest")
        for (layer, head), value in np.ndenumerate(matrix):
            ax.text(head, layer, f"{value:.1f}", ha="center", va="center", fontsize=6,
                    color="black" if value > (low + high) / 2 else "white")
        ax.set_xticks(range(n_head))
        ax.set_yticks(range(n_layer))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(title, fontsize=8)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    fig.colorbar(image, ax=axes, label="entropy (nats)")
    return fig


#: One line of ``seed_lines``: per seed ``(x, y)``, and the mean over seeds ``(x, y)``.
SeedLines = tuple[Sequence[tuple[Sequence[float], Sequence[float]]], tuple[Sequence[float], Sequence[float]]]


def seed_lines(panels: Mapping[str, Mapping[str, SeedLines]], xlabel: str, ylabel: str, title: str = "",
               vline: float | None = None, ranked_x: bool = False, logy: bool = False):
    """Side-by-side panels (``title -> label -> SeedLines``), one colour per label (``method_style``): each seed a
    thin line, the mean over seeds a thick one with markers; ``vline``: a dashed vertical line (the training length,
    or lambda 1). ``ranked_x``: every x drawn at its rank among all the panels' x, evenly spaced and labelled with
    its value (prompt lengths 122 and 128 beside 256 and 512 stay apart), ``vline`` placed between ranks by
    interpolation in log x."""
    fig, axes = plt.subplots(1, len(panels), figsize=(1.5 + 3.6 * len(panels), 4), squeeze=False, sharey=True)
    legend = {}  # every panel's labels, once, beside the last panel
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")  # 40, not 4 x 10^1
    ticks = sorted({v for lines in panels.values() for per_seed, _ in lines.values() for x, _ in per_seed for v in x}
                   if ranked_x else ())
    rank = {v: i for i, v in enumerate(ticks)}
    place = (lambda xs: [rank[v] for v in xs]) if ranked_x else (lambda xs: xs)
    for ax, (panel, lines) in zip(axes.flat, panels.items(), strict=True):
        for label, (per_seed, (mean_x, mean_y)) in lines.items():
            style = method_style(label)
            for x, y in per_seed:
                ax.plot(place(x), y, color=style["color"], linestyle=style["linestyle"], linewidth=0.7, alpha=0.35)
            legend[label], = ax.plot(place(mean_x), mean_y, label=label, linewidth=2.2, **style)
        if vline is not None:
            at = float(np.interp(np.log(vline), np.log(ticks), range(len(ticks)))) if ranked_x else vline
            ax.axvline(at, color="black", linestyle="--", linewidth=1)
        if ranked_x:
            ax.set_xticks(range(len(ticks)), [f"{v:g}" for v in ticks], fontsize=7)
        if logy:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
            ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes.flat[0].set_ylabel(ylabel)
    axes.flat[-1].legend(legend.values(), legend.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
