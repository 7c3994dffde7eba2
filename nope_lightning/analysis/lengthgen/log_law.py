"""Paper 001's position-dependent temperature, lambda(s) = 1 + a ln s (s = position / L, lambda in units of
1/sqrt(d)): the least-squares fit of ``a`` through the best lambda per position, for one curve or for
bootstrap resamples of many at once; and the slope of a free-intercept line ``lambda = c + b ln s``
(``log_slope_batch``), the statistic that tells a log law from a constant lambda: a constant lambda, whatever its
value, has slope 0, while the paper's law has slope a. The fixed-intercept fit cannot tell them apart: a flat
best lambda of 1.3 gets a > 0 and an R^2 far below 0 (its R^2 is about the mean, which the fit is not
allowed to reach)."""

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


def line_r2(x: Sequence[float], y: Sequence[float]) -> float:
    """R^2 of the least-squares line ``y = c + b x`` (free intercept; NaN for a flat ``y`` or fewer than three
    points, which a line always fits)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 3 or np.ptp(y) == 0 or np.ptp(x) == 0:
        return float("nan")
    slope, intercept = np.polyfit(x, y, 1)
    return float(1 - ((y - intercept - slope * x) ** 2).sum() / ((y - y.mean()) ** 2).sum())


def log_or_linear(ratios: Sequence[float], lambdas: Sequence[float]) -> tuple[float, float]:
    """``(R^2 of lambda = c + b ln s, R^2 of lambda = c + b s)`` through the best lambda per position past L
    (``ratios``: s > 1): two lines with one slope each, so the larger R^2 is the smaller residual. A rise in s
    also has a positive slope in ln s; this tells the paper's law from it."""
    return line_r2(np.log(np.asarray(ratios, dtype=np.float64)), lambdas), line_r2(ratios, lambdas)


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


def log_slope_batch(best: np.ndarray, ratios: np.ndarray) -> np.ndarray:
    """The least-squares slope ``b`` of ``lambda = c + b ln s`` (free intercept ``c``) for many curves at once:
    ``best`` (R, points) lambdas at ``ratios`` (points,) s > 0 -> (R,), in lambda per unit of ln s. Always
    defined when the ratios differ (a flat curve has slope 0, never NaN)."""
    x = np.log(np.asarray(ratios, dtype=np.float64))
    centred = x - x.mean()
    denominator = (centred * centred).sum()
    if denominator == 0:
        raise ValueError("a slope in ln s needs points at two or more positions")
    return (np.asarray(best, dtype=np.float64) * centred).sum(-1) / denominator


def position_buckets_past(edges: Sequence[int], position: Sequence,
                          train_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A scale-search's per-position data past L as bootstrap input: ``(units, widths, ratios)``. ``units``
    (windows, trials * buckets) holds, per validation position window, every trial's NLL sum over each bucket
    past L (trials in grid order; ``position``: (trials, windows, buckets) NLL sums over the buckets ``edges``);
    ``widths`` the buckets' token counts and ``ratios`` their centres / L (s). ``ValueError`` when fewer than two
    buckets lie past L."""
    edges = np.asarray(edges)
    centers = (edges[:-1] + edges[1:] - 1) / 2
    past = centers > train_len
    if past.sum() < 2:
        raise ValueError("the search measured fewer than two position buckets past L")
    position = np.asarray(position)[:, :, past]  # (trials, windows, buckets past L)
    units = position.transpose(1, 0, 2).reshape(position.shape[1], -1)
    return units, np.diff(edges)[past], centers[past] / train_len


def bucket_best(sums: np.ndarray, grid: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """The best lambda of each bucket from one seed's resampled sums ``(R, 1, trials * buckets)`` (the layout of
    ``position_buckets_past``): (R, buckets)."""
    nll = sums[:, 0].reshape(len(sums), len(grid), len(widths)) / widths
    return best_on_grid(nll, np.asarray(grid))


def position_fit_units(edges: Sequence[int], position: Sequence, grid: np.ndarray,
                       train_len: int) -> tuple[np.ndarray, Callable]:
    """A scale-search's per-position data as bootstrap input: ``(units, fit)`` where ``units`` (windows,
    trials * buckets) holds, per validation position window, every trial's NLL sum over each bucket past L
    (trials in ``grid`` order; ``position``: (trials, windows, buckets) NLL sums over the buckets ``edges``),
    and ``fit(sums (R, 1, k)) -> (a, R^2)`` refits lambda = 1 + a ln s through each bucket's best lambda.
    ``ValueError`` when fewer than two buckets lie past L."""
    units, widths, ratios = position_buckets_past(edges, position, train_len)

    def fit(sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return fit_log_scale_batch(bucket_best(sums, grid, widths), ratios)

    return units, fit
