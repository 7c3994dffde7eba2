"""Paper 001's Figs 3 and 10 drawn by the report from the evaluations' per-head attention entropy
(``EvaluationResult.entropy``: (n_layer, n_head, position bucket) nats, measured on the position windows of the
longest evaluation length): Fig 3, each method's entropy per (layer, head) averaged over the buckets past the
training length L; Fig 10, the reference's entropy per head across every bucket. Both are means over the seeds
that measured them."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from nope_lightning.analysis.lengthgen import plots
from nope_lightning.analysis.report_frame import Plot, over_seeds
from nope_lightning.results.evaluation import EvaluationResult

Evals = Mapping[str, Mapping[int | None, EvaluationResult]]


def seed_mean(by_seed: Mapping[int | None, EvaluationResult]) -> tuple[np.ndarray, list[int | None]] | None:
    """The per-head entropy averaged over the seeds that measured it: ((n_layer, n_head, buckets) nats, those
    seeds); None when no seed did."""
    measured = {s: np.asarray(r.entropy.per_head, dtype=float) for s, r in by_seed.items() if r.entropy}
    if not measured:
        return None
    return np.mean(list(measured.values()), axis=0), list(measured)


def past_buckets(edges: list[int], train_len: int) -> list[int]:
    """The indices of the position buckets (``edges``: their n + 1 position edges) that start at or past
    ``train_len``."""
    return [b for b, start in enumerate(edges[:-1]) if start >= train_len]


def fig3_plot(evals: Evals) -> Plot | None:
    """Fig 3: per method, the (layer x head) entropy averaged over the buckets past L, mean over its seeds; None
    without per-head entropy or without a bucket past L."""
    panels, drawn = {}, {}
    for method, by_seed in evals.items():
        if (found := seed_mean(by_seed)) is None:
            continue
        first = next(r for r in by_seed.values() if r.entropy)
        edges, past = first.entropy.edges, past_buckets(first.entropy.edges, first.train_len)
        if not past:
            continue
        per_head, drawn[method] = found
        matrix = per_head[..., past].mean(-1)
        panels[f"{method}\n(mean {matrix.mean():.2f})"] = matrix
    if not panels:
        return None
    return Plot(plots.head_grids(panels), (
        f"Attention entropy (nats) per layer and head of each method (Fig 3), averaged over the positions "
        f"{edges[past[0]]}-{edges[-1]} (past the training length {first.train_len}) of the {edges[-1]}-token "
        f"position windows, {over_seeds(drawn)}; each panel's title gives its mean over layers and heads."))


def fig10_plot(evals: Evals, reference: str) -> Plot | None:
    """Fig 10: the ``reference`` method's entropy per (layer, head) row across position buckets, mean over its
    seeds; None when the reference is not evaluated or measured no per-head entropy."""
    found = seed_mean(evals.get(reference, {}))
    if found is None:
        return None
    per_head, measured = found
    first = next(r for r in evals[reference].values() if r.entropy)
    edges = first.entropy.edges
    title = f"{reference}: attention entropy per head by position ({len(measured)} seed{'s' * (len(measured) > 1)})"
    return Plot(plots.entropy_heatmap(per_head, edges, first.train_len, title=title), (
        f"Attention entropy (nats) of `{reference}` per head (Fig 10): one row per layer and head, one column per "
        f"{edges[1] - edges[0]}-token position bucket of the {edges[-1]}-token position windows, "
        f"{over_seeds({reference: measured})}; below, the mean over heads beside log i (uniform attention); "
        f"dashed: the training length {first.train_len}."))
