"""Intervals for every number the report compares: Wilson for proportions, Student t across seeds, and a
stratified, vectorised percentile bootstrap for everything computed from sums over resampling units.

Resampling units are what make the data independent enough to resample: blocks of consecutive evaluation
windows (perplexity), whole windows (per-position curves, attention entropy), prompts (passkey). Every unit
holds a row of *sums* (e.g. NLL summed over its tokens, and its token count), so a resample is a vector of
multinomial counts ``c`` and the resampled sums are ``c @ rows``: one matrix product gives all resamples.
A statistic maps the column sums to a number (a log-PPL, a paired difference of log-PPLs, a share of a gap, a
rank correlation over methods...), so ratio statistics are bootstrapped as ratios of sums, never as means of
per-unit ratios.

Strata are seeds. Each seed's units are resampled within that seed, and the statistic sees one row of sums per
seed; "pooled" estimates average a per-seed effect over the seeds (each seed weighs the same), so the pooled
interval measures the evaluation-data noise of the seeds we ran, and the spread between seeds is reported
separately (per-seed estimates, a t interval across seeds, and a prediction interval for one more seed: what
another seed, i.e. another trained model, would show). Where seeds are themselves the units, crossed with a
second factor (paper 002's (task, seed) queries), ``crossed_bootstrap`` resamples both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import optimize
from scipy import stats as scipy_stats

from nope_lightning.config.core import MIN_RESAMPLES

LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided interval at ``level``; ``per_seed`` holds one estimate per stratum
    when the statistic was computed seed by seed (empty otherwise)."""

    estimate: float
    low: float
    high: float
    level: float = LEVEL
    per_seed: tuple[float, ...] = ()
    #: Bootstrap resamples whose statistic was undefined (NaN: e.g. a share of a gap that vanished in that
    #: resample) out of ``resamples``; the bounds are percentiles of the defined ones only, so a table must say
    #: how many were left out (0 of 0 for an interval that is not a bootstrap).
    undefined: int = 0
    resamples: int = 0

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def covers_estimate(self) -> bool:
        """Whether the point estimate lies inside its own interval (True without an interval). A percentile
        bootstrap of a non-smooth statistic (an R^2 of per-position argmax fits, a rank correlation) can be
        biased so far that the full-data value falls outside the resampled range. Bias correction does not
        repair that case: Efron's BC interval contains the estimate only when |z0| < 1.96, i.e. only when the
        percentile interval already does."""
        return math.isnan(self.low) or math.isnan(self.high) or self.low <= self.estimate <= self.high

    def hull(self) -> Interval:
        """The interval widened to include its estimate: a conservative interval for verdicts when the
        bootstrap is biased (``covers_estimate`` False); the interval itself otherwise."""
        if self.covers_estimate:
            return self
        return replace(self, low=min(self.low, self.estimate), high=max(self.high, self.estimate))


def wilson(successes: int, trials: int, level: float = LEVEL) -> Interval:
    """Wilson score interval of a proportion (Wilson 1927): well behaved at 0 and 1, unlike the normal one."""
    if trials <= 0:
        raise ValueError("a proportion needs at least one trial")
    z = scipy_stats.norm.ppf(0.5 + level / 2)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    spread = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    # the interval contains p exactly; the guard keeps rounding at p = 0 or 1 from putting a bound past p
    return Interval(p, max(0.0, min(p, centre - spread)), min(1.0, max(p, centre + spread)), level)


UNIT = (0.0, 1.0)  # the range of a proportion or a 0-1 score


def t_interval(values: Sequence[float], level: float = LEVEL,
               bounds: tuple[float, float] = (-math.inf, math.inf)) -> Interval:
    """Mean of ``values`` (one per seed) with Student's t interval, clipped to ``bounds`` (the range the
    quantity can take: ``UNIT`` for accuracies, whose t interval over 3 seeds otherwise runs below 0 or past
    1); a single value has no interval (NaN bounds): the spread between seeds cannot be estimated from one
    seed."""
    return _student(values, level, bounds, new_seed=False)


def prediction_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """Where one more seed's value should fall: ``mean +- t(level, n - 1) * s * sqrt(1 + 1/n)`` over the ``n``
    per-seed ``values`` (normal seeds, unknown variance; Student t with df = n - 1). Wider than the t interval
    of the mean by ``sqrt(n + 1)``: it carries the new seed's own spread as well as the mean's uncertainty. One
    value has no interval (NaN bounds). NaN values make NaN bounds: an undefined seed is not dropped."""
    return _student(values, level, (-math.inf, math.inf), new_seed=True)


def _student(values: Sequence[float], level: float, bounds: tuple[float, float], new_seed: bool) -> Interval:
    """The mean of ``values`` with Student's t half-width ``t(level, n - 1) * s`` times ``1 / sqrt(n)`` (the
    mean) or ``sqrt(1 + 1/n)`` (one new value), clipped to ``bounds``."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("an interval across seeds needs at least one value")
    mean = float(x.mean())
    if x.size == 1:
        return Interval(mean, math.nan, math.nan, level, (mean,))
    scale = math.sqrt(1 + 1 / x.size) if new_seed else 1 / math.sqrt(x.size)
    half = scipy_stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) * scale
    # np.clip keeps a NaN bound NaN (an undefined seed stays visible); max/min would turn it into the clip value
    low, high = (float(np.clip(v, *bounds)) for v in (mean - half, mean + half))
    return Interval(mean, low, high, level, tuple(x.tolist()))


Statistic = Callable[[np.ndarray], np.ndarray]


def bootstrap(strata: Sequence[np.ndarray], statistic: Statistic, resamples: int = 1000, seed: int = 0,
              level: float = LEVEL) -> Interval:
    """Percentile bootstrap of ``statistic`` over units resampled within each stratum.

    Args:
        strata: one ``(units, k)`` float array per stratum (seed); each row is one resampling unit's sums.
        statistic: maps column sums of shape ``(R, strata, k)`` to ``(R,)`` values (vectorised over R
            resamples); it is also called on the full data as ``(1, strata, k)`` for the point estimate.
        resamples: number of bootstrap resamples (>= ``MIN_RESAMPLES``).
        seed: the resampling generator's seed (results are deterministic).

    Returns:
        The point estimate on all units, and the ``(1 - level) / 2`` and ``(1 + level) / 2`` percentiles of
        the resampled values. Undefined resamples (NaN or infinite, e.g. a ratio with a zero denominator) are
        left out of the percentiles and counted (``Interval.undefined`` of ``Interval.resamples``); all
        undefined gives NaN bounds.
    """
    if resamples < MIN_RESAMPLES:
        raise ValueError(f"bootstrap resamples={resamples} is too few: use >= {MIN_RESAMPLES}")
    if not strata or any(s.ndim != 2 or s.shape[0] == 0 for s in strata):
        raise ValueError("bootstrap needs at least one stratum, each a non-empty (units, k) array")
    rng = np.random.default_rng(seed)
    full = np.stack([s.sum(0) for s in strata])[None]
    sums = np.stack([rng.multinomial(s.shape[0], np.full(s.shape[0], 1 / s.shape[0]), size=resamples) @ s
                     for s in strata], axis=1)
    values = np.asarray(statistic(sums), dtype=np.float64)
    values = values[np.isfinite(values)]
    undefined = resamples - int(values.size)
    estimate = float(np.asarray(statistic(full)).reshape(-1)[0])
    if values.size == 0:
        return Interval(estimate, math.nan, math.nan, level, undefined=undefined, resamples=resamples)
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return Interval(estimate, float(low), float(high), level, undefined=undefined, resamples=resamples)


def per_seed_bootstrap(strata: Sequence[np.ndarray], statistic: Statistic | Sequence[Statistic],
                       resamples: int = 1000, seed: int = 0, level: float = LEVEL) -> tuple[Interval, list[Interval]]:
    """The pooled interval (the statistic averaged over seeds, strata resampled together) and one interval per
    seed. ``statistic`` maps ``(R, 1, k)`` sums of ONE seed to ``(R,)``: one function for every seed, or one per
    seed (a statistic built from that seed's own data, e.g. its own search grid); the pooled value is the mean
    over seeds. The pooled ``Interval`` carries the per-seed point estimates in ``per_seed`` and its count of
    undefined resamples (a resample is undefined when any seed's statistic is)."""
    functions = list(statistic) if isinstance(statistic, Sequence) else [statistic] * len(strata)
    if len(functions) != len(strata):
        raise ValueError(f"{len(functions)} statistics for {len(strata)} strata: give one, or one per stratum")

    def pooled(sums: np.ndarray) -> np.ndarray:
        return np.mean([f(sums[:, i:i + 1]) for i, f in enumerate(functions)], axis=0)

    each = [bootstrap([s], f, resamples, seed + i, level) for i, (s, f) in enumerate(zip(strata, functions,
                                                                                          strict=True))]
    pool = bootstrap(strata, pooled, resamples, seed, level)
    return replace(pool, per_seed=tuple(e.estimate for e in each)), each


def crossed_bootstrap(values: np.ndarray, statistic: Statistic, resamples: int = 1000, seed: int = 0,
                      level: float = LEVEL) -> Interval:
    """Percentile bootstrap of ``statistic`` over ``values`` (seeds, tasks, k) with both factors resampled: each
    resample draws the seeds and the tasks with replacement, independently, and averages ``values`` over the drawn
    (seed, task) pairs (a pair drawn twice counts twice). For values indexed by two crossed random factors, e.g. a
    PE's reciprocal rank per (task, seed) query: resampling the pairs as if independent would hide the spread that a
    whole seed (or task) shares. ``statistic`` maps the means (R, k) to (R,); the estimate is it on all pairs."""
    if resamples < MIN_RESAMPLES:
        raise ValueError(f"bootstrap resamples={resamples} is too few: use >= {MIN_RESAMPLES}")
    n_seeds, n_tasks = values.shape[:2]
    rng = np.random.default_rng(seed)
    seed_counts = rng.multinomial(n_seeds, np.full(n_seeds, 1 / n_seeds), size=resamples)  # (R, seeds): times drawn
    task_counts = rng.multinomial(n_tasks, np.full(n_tasks, 1 / n_tasks), size=resamples)
    drawn = statistic(np.einsum("rs,rt,stk->rk", seed_counts, task_counts, values) / (n_seeds * n_tasks))
    low, high = np.quantile(drawn, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(statistic(values.mean((0, 1))[None])[0]), float(low), float(high), level,
                    resamples=resamples)


def blocks(values: np.ndarray, groups: np.ndarray, size: int) -> np.ndarray:
    """Sum consecutive rows of ``values`` (units, k) into blocks of ``size`` rows that never span two
    ``groups`` (documents): resampling blocks keeps the correlation between neighbouring windows inside a
    unit. ``groups`` (units,) must be sorted so that a group's rows are contiguous."""
    if size < 1:
        raise ValueError(f"block size {size} must be >= 1")
    starts = [i for i in range(len(groups)) if i == 0 or groups[i] != groups[i - 1]]
    edges = [e for a, b in zip(starts, [*starts[1:], len(groups)], strict=True) for e in range(a, b, size)]
    edges.append(len(groups))
    return np.stack([values[a:b].sum(0) for a, b in zip(edges[:-1], edges[1:], strict=True)])


#: About this many resampling units per bootstrap: blocks of consecutive windows (never across documents) are
#: made just long enough to leave ~128 of them, so neighbouring windows (the same passage) stay in one unit.
BLOCK_UNITS = 128


def block_size(windows: int) -> int:
    return max(1, math.ceil(windows / BLOCK_UNITS))


def spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman rank correlation along the last axis: ``x``, ``y`` (..., n) -> (...,). Ties get average ranks;
    a constant row gives NaN."""
    def ranks(a: np.ndarray) -> np.ndarray:
        return scipy_stats.rankdata(a, axis=-1)

    rx, ry = ranks(np.asarray(x, dtype=np.float64)), ranks(np.asarray(y, dtype=np.float64))
    rx = rx - rx.mean(-1, keepdims=True)
    ry = ry - ry.mean(-1, keepdims=True)
    denominator = np.sqrt((rx * rx).sum(-1) * (ry * ry).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rx * ry).sum(-1) / denominator


# --- verdicts that a stronger seed cannot weaken ---------------------------------------------------------------

#: One-sided level of a directional claim's test; an equivalence claim's TOST runs two such tests, i.e. reads the
#: two-sided 1 - 2 (1 - ONE_SIDED) = 90 % interval.
ONE_SIDED = 0.95


def student_factor(n: int, level: float = ONE_SIDED) -> float:
    """``t(level, n - 1) / sqrt(n)``: a one-sided Student bound on the mean of ``n`` values is ``mean -+ factor * s``."""
    return float(scipy_stats.t.ppf(level, n - 1) / math.sqrt(n))


def _bound(w: np.ndarray, factor: float, sign: int) -> float:
    """``mean(w) + sign * factor * s(w)`` (s: the sample standard deviation, ddof = 1)."""
    return float(w.mean() + sign * factor * w.std(ddof=1))


def path_minimum(lo: np.ndarray, hi: np.ndarray, objective: Callable[[np.ndarray], float]) -> float:
    """The smallest ``objective(clip(v, lo, hi))`` over ``v``: the values ``w`` may each lie anywhere in
    ``[lo_i, hi_i]`` (ends may be infinite; a range pinned at an infinite value is that value).

    For the one-sided Student bounds ``mean -+ factor * s`` (and the larger of two of them, TOST's), the
    objective is convex (or its negative concave) in ``w`` and depends on ``w_i`` only through ``w_i - mean``, so
    at the optimum every value not at an end of its range shares one level ``v`` (the KKT conditions of the
    box-constrained problem): the optimum lies on the path ``w = clip(v, lo, hi)``. That path is affine between
    consecutive finite ends, where the objective is convex in ``v``: each piece is a bounded scalar minimisation,
    exact to ``1e-10``. Beyond the outermost ends only the unbounded values move, with the bound monotone once
    they dominate: a piece ten spans wide on each side holds the optimum."""
    ends = np.unique(np.concatenate([lo[np.isfinite(lo)], hi[np.isfinite(hi)], [0.0]]))
    reach = 10 * (ends[-1] - ends[0] + 1)
    edges = np.concatenate([[ends[0] - reach], ends, [ends[-1] + reach]])

    def along(v: float) -> float:
        return objective(np.clip(v, lo, hi))

    best = min(along(v) for v in edges)
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        found = optimize.minimize_scalar(along, bounds=(a, b), method="bounded", options={"xatol": 1e-10})
        best = min(best, float(found.fun))
    return best


def extreme_bound(lo: np.ndarray, hi: np.ndarray, factor: float, sign: int, maximize: bool) -> float:
    """The largest (``maximize``) or smallest one-sided Student bound ``mean + sign * factor * s`` of values ``w``
    in the boxes ``[lo_i, hi_i]`` (``path_minimum``); a box pinned at -inf makes it -inf."""
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    if ((lo == hi) & np.isinf(lo)).any():
        return float(lo[(lo == hi) & np.isinf(lo)].sum())
    sense = -1.0 if maximize else 1.0
    return sense * path_minimum(lo, hi, lambda w: sense * _bound(w, factor, sign))


def monotone_verdict(values: Sequence[float], margin: float, side: str, level: float = ONE_SIDED) -> str:
    """``reproduced`` / ``not reproduced`` / ``inconclusive`` for effects ``values`` (one per seed, >= 2, on the
    scale the test reads) against ``margin`` on ``side`` (``above``, ``below``: one-sided Student tests at
    ``level``; ``within``: TOST, |mean| <= margin by two one-sided tests at ``level``), such that moving any seed's
    effect further onto the claim's side (up for ``above``, down for ``below``, toward 0 for ``within``) never
    weakens the verdict.

    The t test alone is not monotone: a seed far beyond the others widens the interval (seeds +1.35 / +3.69 /
    +1.53 / +1.75 vs 0.405 fail its one-sided bound; +1.35 / +1.75 / +1.53 / +1.75 pass). This is the smallest
    monotone rule containing it (its monotone hull): *reproduced* when some set of effects, each no further on
    the claim's side than ours, passes the t test; *not reproduced* when some set, each no less far on it,
    fails it the other way (the interval wholly on the other side). Choice and cost: no monotone rule with an
    unknown spread can hold a one-sided level below ``2 ** -n`` (any rule that never penalises a stronger seed and
    reproduces some effects all on the claim's side reproduces every such set once the spread is large), so
    with 4 seeds "every seed on the claim's side" is itself *reproduced*, a 1/16 = 6.25 % chance under no
    effect; with 8 seeds 1/256. ``NaN`` values give *inconclusive*.
    """
    z = np.asarray(values, dtype=np.float64)
    if z.size < 2:
        raise ValueError("a verdict about seeds needs at least two seeds")
    if np.isnan(z).any():
        return "inconclusive"
    factor, infinite = student_factor(z.size, level), np.full_like(z, np.inf)
    if side == "below":
        return monotone_verdict(-z, -margin, "above", level)
    if side == "above":
        clears = extreme_bound(-infinite, z, factor, -1, maximize=True) > margin
        excludes = extreme_bound(z, infinite, factor, +1, maximize=False) <= margin
    elif side == "within":
        away = (np.where(z < 0, -np.inf, z), np.where(z > 0, np.inf, z))   # further from 0: less favourable
        away = (np.where(z == 0, -np.inf, away[0]), np.where(z == 0, np.inf, away[1]))
        toward = (np.minimum(z, 0), np.maximum(z, 0))                      # nearer 0: more favourable
        clears = _tost_passes(*away, factor, margin)
        excludes = (extreme_bound(*toward, factor, -1, maximize=True) > margin
                    or extreme_bound(*toward, factor, +1, maximize=False) < -margin)
    else:
        raise ValueError(f"unknown side {side!r}: use above, below or within")
    return "reproduced" if clears else "not reproduced" if excludes else "inconclusive"


def _tost_passes(lo: np.ndarray, hi: np.ndarray, factor: float, margin: float) -> bool:
    """Whether some ``w`` in the boxes ``[lo, hi]`` has both one-sided bounds inside ``[-margin, margin]``: the
    smallest ``max(upper - margin, -margin - lower)`` (convex: ``path_minimum``) is <= 0."""
    return path_minimum(lo, hi, lambda w: max(_bound(w, factor, +1) - margin, -margin - _bound(w, factor, -1))) <= 0
