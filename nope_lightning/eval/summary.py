"""From the evaluator's per-window tables to ``results.json`` and the run's metrics, with intervals.

Every number keeps the data behind it: perplexity as one (NLL sum, token count) row per window and length, the
per-position curves and attention entropy as one row of bucket sums per window, so the report can pair methods
on the same windows and pool seeds. The intervals stored here are each run's own (95 % percentile bootstrap
over blocks of consecutive windows, ``stats.bootstrap``); the report recomputes paired and pooled ones.

Position buckets: ``edges`` are equal-width buckets over the longest window (the curves), ``octaves`` the
ranges [0, L), [L, 2L), [2L, 4L), ... of the training length L (what "past L" means in every claim).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from nope_lightning.data.corpus import corpus_label
from nope_lightning.numerics.metrics import AttentionEntropy, position_buckets
from nope_lightning.numerics.stats import Interval, block_size, blocks, bootstrap
from nope_lightning.results.evaluation import Curve, HeadEntropy, Perplexity, PositionCurves, ScoredWindows


def mean_interval(rows: np.ndarray, groups: np.ndarray, resamples: int, seed: int) -> Interval:
    """Token-weighted mean of ``rows`` (windows, 2: value sum, count) with its block-bootstrap interval."""
    units = blocks(rows, groups, block_size(len(rows)))
    return bootstrap([units], lambda s: s[:, 0, 0] / s[:, 0, 1], resamples, seed)


def octaves(train_len: int, longest: int) -> list[tuple[int, int]]:
    """[0, L), [L, 2L), [2L, 4L), ... up to ``longest`` (the last range cut at ``longest``)."""
    edges = [0, train_len]
    while edges[-1] < longest:
        edges.append(min(2 * edges[-1], longest))
    return list(zip(edges[:-1], edges[1:], strict=True))


def bucket_sums(table: torch.Tensor, ranges: list[tuple[int, int]]) -> np.ndarray:
    """(windows, T) per-position sums -> (windows, len(ranges)) sums over each position range."""
    return np.stack([table[:, a:b].sum(1).numpy() for a, b in ranges], 1)


def perplexity(res: dict, corpora: list[str], lengths: list[int], windows: dict[str, list], split: str,
               resamples: int, seed: int) -> tuple[dict[str, dict[int, Perplexity]], dict[str, ScoredWindows],
                                                   dict[str, float]]:
    """``(perplexity, scored windows, metrics)``: per corpus and length the PPL, mean NLL (nats/token), tokens,
    and the NLL interval; per corpus the windows' document and end and their (NLL sum, count) rows."""
    section, per_window, metrics = {}, {}, {}
    for corpus in corpora:
        # The first corpus is the primary one (``{split}/len{L}/...``); the others are named by their label.
        prefix = split if corpus == corpora[0] else f"{split}/{corpus_label(corpus)}"
        docs = np.array([doc for doc, _ in windows[corpus]])
        section[corpus], rows_by_length = {}, {}
        for length in lengths:
            rows = res["ppl", corpus, length].numpy()
            interval = mean_interval(rows, docs, resamples, seed)
            nll = float(rows[:, 0].sum() / rows[:, 1].sum())
            section[corpus][length] = Perplexity(math.exp(nll), nll, int(rows[:, 1].sum()), interval.low,
                                                 interval.high)
            rows_by_length[length] = rows.tolist()
            metrics[f"{prefix}/len{length}/ppl"] = math.exp(nll)
            metrics[f"{prefix}/len{length}/loss"] = nll
        per_window[corpus] = ScoredWindows(docs.tolist(), [e for _, e in windows[corpus]], rows_by_length)
    return section, per_window, metrics


def curve(table: torch.Tensor, ranges: list[tuple[int, int]], resamples: int, seed: int) -> Curve:
    """A per-position curve over ``ranges`` from (windows, T) sums: the mean per range with a bootstrap interval
    over windows (each window a unit), and the per-window range sums behind it."""
    sums = bucket_sums(table, ranges)
    widths = np.array([b - a for a, b in ranges], dtype=np.float64)
    mean, low, high = [], [], []
    for j in range(len(ranges)):
        rows = np.stack([sums[:, j], np.full(len(sums), widths[j])], 1)
        interval = bootstrap([rows], lambda s: s[:, 0, 0] / s[:, 0, 1], resamples, seed + j)
        mean.append(interval.estimate)
        low.append(interval.low)
        high.append(interval.high)
    return Curve(mean, low, high, sums.tolist())


def position(res: dict, corpora: list[str], longest: int, train_len: int, buckets: int, entropy: bool,
             resamples: int, seed: int) -> PositionCurves:
    """Per-position log-PPL (and attention entropy, nats) of the tiled windows: linear buckets (``edges``)
    for the curves, octaves of L for the "past L" figures, each with intervals and per-window sums."""
    edges = position_buckets(longest, buckets, "linear").tolist()
    linear = list(zip(edges[:-1], edges[1:], strict=True))
    ranges = octaves(train_len, longest)
    tables = {corpus: res["position", corpus, longest] for corpus in corpora}
    logppl = {corpus: curve(table, linear, resamples, seed) for corpus, table in tables.items()}
    octave_logppl = {corpus: curve(table, ranges, resamples, seed) for corpus, table in tables.items()}
    if not entropy:
        return PositionCurves(edges, ranges, logppl, octave_logppl)
    table = res["entropy", corpora[0], longest]
    return PositionCurves(edges, ranges, logppl, octave_logppl, curve(table, linear, resamples, seed),
                          curve(table, ranges, resamples, seed))


def entropy_section(res: dict, corpus: str, longest: int, lengths: list[int], buckets: int,
                    split: str) -> tuple[HeadEntropy, dict[int, float], dict[str, float]]:
    """Per-head entropy (Fig 3 heat map) and the mean entropy over positions [0, n) of each length n (the
    prefix of a causal window is the shorter window), with their metrics ``{split}/len{n}/entropy``."""
    heads: AttentionEntropy = res["entropy_heads", corpus, longest]
    per_window = res["entropy", corpus, longest]
    edges = position_buckets(longest, buckets, "linear")
    per_head = heads.bucketed(edges)
    by_length = {n: float(per_window[:, :n].mean()) for n in lengths if n <= longest}
    section = HeadEntropy(edges.tolist(), "nats", per_head.tolist(), np.nanmean(per_head.numpy(), axis=(0, 1)).tolist())
    return section, by_length, {f"{split}/len{n}/entropy": v for n, v in by_length.items()}
