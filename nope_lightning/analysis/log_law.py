"""Paper 001's position-dependent temperature, lambda(s) = 1 + a ln s (s = position / L, lambda in units of
1/sqrt(d)): the least-squares fit of ``a`` through the best lambda per position, for one curve or for
bootstrap resamples of many at once."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np


def fit_log_scale(ratios: list[float], lambdas: list[float]) -> tuple[float, float]:
    """Least-squares ``a`` of ``lambda = 1 + a ln s`` (lambda in units of 1/sqrt(d), s = i / L > 0) and R^2.

    The intercept is fixed at 1 as in the paper (at s = 1 the default scale is right), so
    ``a = sum(ln s (lambda - 1)) / sum(ln s ^ 2)`` and ``R^2 = 1 - SS_res / SS_tot`` about the mean lambda.
    """
    if len(ratios) != len(lambdas) or len(ratios) < 2:
        raise ValueError("need at least two (s, lambda) points of equal count to fit lambda = 1 + a ln s")
    logs = [math.log(s) for s in ratios]
    denominator = sum(x * x for x in logs)
    if denominator == 0:
        raise ValueError("all points are at s = 1: nothing to fit")
    a = sum(x * (y - 1) for x, y in zip(logs, lambdas, strict=True)) / denominator
    mean = sum(lambdas) / len(lambdas)
    ss_res = sum((y - 1 - a * x) ** 2 for x, y in zip(logs, lambdas, strict=True))
    ss_tot = sum((y - mean) ** 2 for y in lambdas)
    return a, (1 - ss_res / ss_tot) if ss_tot > 0 else float("nan")


def best_on_grid(nll: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The grid value with the lowest NLL along axis 1: ``nll`` (R, grid, ...) -> (R, ...)."""
    return grid[np.argmin(nll, axis=1)]


def fit_log_scale_batch(best: np.ndarray, ratios: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``fit_log_scale`` for many curves at once: ``best`` (R, points) lambdas at ``ratios`` (points,) ->
    ``(a (R,), R^2 (R,))``, NaN R^2 where a curve is flat."""
    x = np.log(ratios)
    a = ((best - 1) * x).sum(1) / (x * x).sum()
    residual = ((best - 1 - a[:, None] * x) ** 2).sum(1)
    total = ((best - best.mean(1, keepdims=True)) ** 2).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return a, np.where(total > 0, 1 - residual / total, np.nan)


def position_fit_units(edges: Sequence[int], position: Sequence, grid: np.ndarray,
                       train_len: int) -> tuple[np.ndarray, Callable]:
    """A scale-search's per-position data as bootstrap input: ``(units, fit)`` where ``units`` (windows,
    trials * buckets) holds, per validation position window, every trial's NLL sum over each bucket past L
    (trials in ``grid`` order; ``position``: (trials, windows, buckets) NLL sums over the buckets ``edges``),
    and ``fit(sums (R, 1, k)) -> (a, R^2)`` refits lambda = 1 + a ln s through each bucket's best lambda.
    ``ValueError`` when fewer than two buckets lie past L."""
    edges = np.asarray(edges)
    centers = (edges[:-1] + edges[1:] - 1) / 2
    past = centers > train_len
    if past.sum() < 2:
        raise ValueError("the search measured fewer than two position buckets past L")
    position = np.asarray(position)[:, :, past]  # (trials, windows, buckets past L)
    units = position.transpose(1, 0, 2).reshape(position.shape[1], -1)
    widths, ratios = np.diff(edges)[past], centers[past] / train_len

    def fit(sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        nll = sums[:, 0].reshape(len(sums), len(grid), len(ratios)) / widths
        return fit_log_scale_batch(best_on_grid(nll, grid), ratios)

    return units, fit
