"""Paper 001's claims (``paper.CLAIMS``) tested on a pipeline's runs: an effect with a 95 % interval, pooled over
seeds, and a verdict that can go either way.

Every effect is a statistic of sums over resampling units that all compared methods share (the same blocks of
evaluation windows, the same position windows, the same passkey prompts), so comparisons are paired: the
noise of the text the methods are scored on cancels. Per seed, the units are resampled together; the pooled
effect is the mean of the per-seed effects and its interval comes from resampling every seed's units
(``stats.per_seed_bootstrap``).

Verdicts (``verdict``): *untestable* when a precondition fails (the claim means nothing here); *reproduced*
when the pooled interval lies on the claim's side of its threshold and so does every seed's own estimate;
*not reproduced* when the pooled interval lies wholly on the other side (the interval excludes the effect);
*inconclusive* otherwise; *not measured* when the runs it needs are missing. When the pooled estimate lies
outside its own bootstrap interval (a biased bootstrap of a non-smooth statistic: ``Interval.covers_estimate``),
the verdict uses the interval widened to include the estimate, which can only move a verdict toward
*inconclusive*; the tables mark such an interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from nope_lightning.analysis.log_law import best_on_grid, position_fit_units
from nope_lightning.analysis.paper import Claim, Precondition
from nope_lightning.analysis.stats import Interval, blocks, per_seed_bootstrap, spearman
from nope_lightning.eval.summary import block_size
from nope_lightning.results.evaluation import EvaluationResult
from nope_lightning.results.search import ScaleSearchResult

#: method -> seed (None without seeds) -> that run's result (an evaluation or a scale-search)
Result = EvaluationResult | ScaleSearchResult
Runs = Mapping[str, Mapping[int | None, Result]]
Statistic = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Evidence:
    """What a test needs: one ``(units, k)`` table per seed (rows resampled together) and the statistic of one
    seed's column sums ``(R, 1, k) -> (R,)``."""

    seeds: tuple[int | None, ...]
    tables: tuple[np.ndarray, ...]
    statistic: Statistic


class NotMeasured(Exception):
    """A run or a figure a test needs is missing; the message says which."""


@dataclass(frozen=True)
class Outcome:
    """A claim's result: the pooled effect (``interval.per_seed``: each seed's estimate), the verdict, and a
    reason when there is no effect (untestable, not measured)."""

    claim: Claim
    verdict: str
    interval: Interval | None = None
    seeds: tuple[int | None, ...] = ()
    reason: str = ""

    @property
    def on_side(self) -> int:
        """How many seeds' own estimates lie on the claim's side of its threshold."""
        return sum(on_side(self.claim, e) for e in self.interval.per_seed) if self.interval else 0


# --- what each test reads from a run ---------------------------------------------------------------------


def _result(runs: Runs, method: str, seed: int | None) -> Result:
    try:
        return runs[method][seed]
    except KeyError:
        raise NotMeasured(f"no run of {method!r}" + (f" for seed {seed}" if seed is not None else "")) from None


def _common_seeds(runs: Runs, methods: tuple[str, ...]) -> tuple[int | None, ...]:
    missing = [m for m in methods if m not in runs]
    if missing:
        raise NotMeasured(f"no run of {', '.join(map(repr, missing))}")
    seeds = sorted(set.intersection(*(set(runs[m]) for m in methods)), key=lambda s: (s is None, s))
    if not seeds:
        raise NotMeasured(f"no seed has runs of all of {', '.join(methods)}")
    return tuple(seeds)


def ppl_windows(result: EvaluationResult, multiple: int) -> tuple[np.ndarray, list, list]:
    """``(rows (windows, 2), docs, ends)``: a run's per-window NLL sums and counts at ``multiple`` x L."""
    n = multiple * result.train_len
    windows = (result.windows or {}).get(result.corpora[0])
    if windows is None or n not in windows.rows:
        raise NotMeasured(f"no perplexity at {n} tokens in setting {result.setting!r}")
    return np.asarray(windows.rows[n], dtype=np.float64), windows.doc, windows.end


def ppl_units(pairs: list[tuple[EvaluationResult, int]]) -> np.ndarray:
    """Blocks of windows with the (NLL sum, count) columns of every ``(run, multiple)``, side by side; the runs
    must have scored the same windows (else the comparison would not be paired)."""
    columns, docs, ends = [], None, None
    for result, multiple in pairs:
        rows, doc, end = ppl_windows(result, multiple)
        if docs is not None and (doc, end) != (docs, ends):
            raise NotMeasured("the compared runs scored different windows (another ppl_tokens, stride or split)")
        columns.append(rows)
        docs, ends = doc, end
    return blocks(np.concatenate(columns, axis=1), np.asarray(docs), block_size(len(docs)))


def position_units(result: EvaluationResult, ranges: list[tuple[int, int]], kind: str = "logppl") -> np.ndarray:
    """Per position window, the (sum, token count) of the per-position ``kind`` (``logppl`` or ``entropy``)
    over each position range ``[a, b)`` (multiples of L), side by side: (windows, 2 * len(ranges))."""
    position = result.position
    if position is None or (kind == "entropy" and position.octave_entropy is None):
        raise NotMeasured(f"no per-position {kind} in setting {result.setting!r}")
    L, octaves = result.train_len, position.octaves
    table = np.asarray(position.octave_entropy.windows if kind == "entropy"
                       else position.octave_logppl[result.corpora[0]].windows)
    columns = []
    for lo, hi in ranges:
        inside = [i for i, (a, b) in enumerate(octaves) if lo * L <= a and b <= hi * L]
        if not inside or sum(octaves[i][1] - octaves[i][0] for i in inside) != (hi - lo) * L:
            raise NotMeasured(f"positions [{lo}L, {hi}L) were not measured (longest window {octaves[-1][1]})")
        width = sum(octaves[i][1] - octaves[i][0] for i in inside)
        columns += [table[:, inside].sum(1), np.full(len(table), float(width))]
    return np.stack(columns, 1)


def passkey_units(results: list[EvaluationResult], multiple: int | None) -> np.ndarray:
    """(prompts, 2 * len(results)): per prompt and run, (correct 1/0, 1), at ``multiple`` x L (None: every
    length); the runs must have answered the same prompts."""
    columns, prompts = [], None
    for result in results:
        if result.passkey is None:
            raise NotMeasured(f"no passkey in setting {result.setting!r}")
        samples = result.passkey.at(None if multiple is None else multiple * result.train_len)
        keys = [s.prompt for s in samples]
        if not samples or (prompts is not None and keys != prompts):
            raise NotMeasured("the compared runs answered different passkey prompts" if samples
                              else f"no passkey prompts at {multiple}x L")
        prompts = keys
        columns += [[float(s.correct) for s in samples], [1.0] * len(samples)]
    return np.asarray(columns).T


def search_units(summary: ScaleSearchResult, multiples: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``(units, lambdas)``: blocks of validation windows with every trial's (NLL sum, count) at each target
    ``multiple`` x L, trials in grid order, targets side by side."""
    samples, lambdas = summary.samples, np.asarray(summary.temperatures)
    columns = []
    for multiple in multiples:
        n = multiple * summary.train_len
        if n not in samples.windows:
            raise NotMeasured(f"the search has no target {n}")
        columns += [np.asarray(rows) for rows in samples.windows[n]]
    table = np.concatenate(columns, axis=1)
    return blocks(table, np.asarray(samples.doc), block_size(len(table))), lambdas


def _mean(sums: np.ndarray, column: int) -> np.ndarray:
    """The mean of pair ``column`` (sum, count) of one seed's sums (R, 1, k): (R,)."""
    return sums[:, 0, 2 * column] / sums[:, 0, 2 * column + 1]


# --- the tests ---------------------------------------------------------------------------------------------


def _log_ppl_difference(claim: Claim, runs: Runs) -> Evidence:
    (m0, m1), (x0, x1) = claim.methods, claim.multiples
    seeds = _common_seeds(runs, claim.methods)
    tables = [ppl_units([(_result(runs, m0, s), x0), (_result(runs, m1, s), x1)]) for s in seeds]
    return Evidence(seeds, tuple(tables), lambda sums: _mean(sums, 0) - _mean(sums, 1))


def _log_ppl_rise_difference(claim: Claim, runs: Runs) -> Evidence:
    (m0, m1), (x0, x1) = claim.methods, claim.multiples
    seeds = _common_seeds(runs, claim.methods)
    tables = [ppl_units([(_result(runs, m, s), x) for m in (m0, m1) for x in (x0, x1)]) for s in seeds]
    return Evidence(seeds, tuple(tables),
                    lambda sums: (_mean(sums, 3) - _mean(sums, 2)) - (_mean(sums, 1) - _mean(sums, 0)))


def _gap_closed(claim: Claim, runs: Runs) -> Evidence:
    (m0, m1), (x0, x1) = claim.methods, claim.multiples
    seeds = _common_seeds(runs, claim.methods)
    tables = [ppl_units([(_result(runs, m0, s), x0), (_result(runs, m0, s), x1), (_result(runs, m1, s), x1)])
              for s in seeds]

    def share(sums: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return (_mean(sums, 1) - _mean(sums, 2)) / (_mean(sums, 1) - _mean(sums, 0))

    return Evidence(seeds, tuple(tables), share)


def _position_difference(claim: Claim, runs: Runs) -> Evidence:
    """Mean per-position log-PPL (``position_ratio``) or attention entropy (``entropy_rise``) over positions
    [lo L, hi L) minus over [0, L), on the same position windows."""
    (method,), (lo, hi) = claim.methods, claim.multiples
    kind = "entropy" if claim.test == "entropy_rise" else "logppl"
    seeds = _common_seeds(runs, claim.methods)
    tables = [position_units(_result(runs, method, s), [(lo, hi), (0, 1)], kind) for s in seeds]
    return Evidence(seeds, tuple(tables), lambda sums: _mean(sums, 0) - _mean(sums, 1))


def _entropy_correlation(claim: Claim, runs: Runs) -> Evidence:
    """Spearman's rho over the methods of (entropy past L, log-PPL past L), positions [L, hi L) of the same
    position windows; methods without runs are left out (at least three are needed)."""
    methods = tuple(m for m in claim.methods if m in runs)
    if len(methods) < max(3, claim.min_methods):
        raise NotMeasured(f"a rank correlation needs >= {max(3, claim.min_methods)} of {', '.join(claim.methods)} "
                          f"({len(methods)} ran)")
    seeds = _common_seeds(runs, methods)
    lo, hi = claim.multiples
    tables = [np.concatenate([np.concatenate([position_units(_result(runs, m, s), [(lo, hi)], "entropy"),
                                              position_units(_result(runs, m, s), [(lo, hi)])], 1)
                              for m in methods], 1) for s in seeds]
    count = len(methods)

    def rho(sums: np.ndarray) -> np.ndarray:
        entropy = np.stack([_mean(sums, 2 * i) for i in range(count)], -1)
        nll = np.stack([_mean(sums, 2 * i + 1) for i in range(count)], -1)
        return spearman(entropy, nll)

    return Evidence(seeds, tuple(tables), rho)


def _passkey_difference(claim: Claim, runs: Runs) -> Evidence:
    m0, m1 = claim.methods
    multiple = claim.multiples[0] if claim.multiples else None
    seeds = _common_seeds(runs, claim.methods)
    tables = [passkey_units([_result(runs, m0, s), _result(runs, m1, s)], multiple) for s in seeds]
    return Evidence(seeds, tuple(tables), lambda sums: _mean(sums, 0) - _mean(sums, 1))


def _best_temperature(claim: Claim, runs: Runs) -> Evidence:
    seeds = _common_seeds(runs, claim.methods)
    found = [search_units(_result(runs, claim.methods[0], s), claim.multiples) for s in seeds]
    lambdas = found[0][1]
    trials = len(lambdas)

    def best(sums: np.ndarray, target: int) -> np.ndarray:
        part = sums[:, 0, 2 * trials * target:2 * trials * (target + 1)]
        return best_on_grid(part[:, 0::2] / part[:, 1::2], lambdas)

    if claim.test == "best_temperature":
        return Evidence(seeds, tuple(t for t, _ in found), lambda sums: best(sums, 0))
    return Evidence(seeds, tuple(t for t, _ in found), lambda sums: best(sums, 1) - best(sums, 0))


def _log_fit_r2(claim: Claim, runs: Runs) -> Evidence:
    seeds = _common_seeds(runs, claim.methods)
    tables, fits = [], []
    for seed in seeds:
        summary = _result(runs, claim.methods[0], seed)
        samples = summary.samples
        try:
            units, fit = position_fit_units(samples.edges, samples.position, np.asarray(summary.temperatures),
                                            summary.train_len)
        except ValueError as err:
            raise NotMeasured(str(err)) from None
        tables.append(units)
        fits.append(fit)
    if any(t.shape[1] != tables[0].shape[1] for t in tables):
        raise NotMeasured("the seeds' searches used different grids or buckets")
    return Evidence(seeds, tuple(tables), lambda sums: fits[0](sums)[1])


TESTS: dict[str, Callable[[Claim, Runs], Evidence]] = {
    "log_ppl_difference": _log_ppl_difference, "log_ppl_rise_difference": _log_ppl_rise_difference,
    "gap_closed": _gap_closed, "position_ratio": _position_difference, "entropy_rise": _position_difference,
    "entropy_correlation": _entropy_correlation,
    "passkey_difference": _passkey_difference, "best_temperature": _best_temperature,
    "best_temperature_rise": _best_temperature, "log_fit_r2": _log_fit_r2}


# --- verdicts ----------------------------------------------------------------------------------------------


def on_side(claim: Claim, value: float) -> bool:
    if math.isnan(value):
        return False
    if claim.side == "within":
        return abs(value) <= claim.threshold
    return value > claim.threshold if claim.side == "above" else value < claim.threshold


def verdict(claim: Claim, interval: Interval) -> str:
    """reproduced / not reproduced / inconclusive from the pooled interval (widened to include its estimate:
    ``Interval.hull``) and the per-seed estimates."""
    hull = interval.hull()
    low, high, t = hull.low, hull.high, claim.threshold
    if math.isnan(low) or math.isnan(high):
        return "inconclusive"
    if claim.side == "within":
        clears, excludes = -t <= low and high <= t, high < -t or low > t
    elif claim.side == "above":
        clears, excludes = low > t, high <= t
    else:
        clears, excludes = high < t, low >= t
    if clears and all(on_side(claim, e) for e in interval.per_seed):
        return "reproduced"
    return "not reproduced" if excludes else "inconclusive"


def measure(test: str, claim: Claim, runs: Runs, resamples: int, seed: int = 0) -> tuple[Interval, tuple]:
    """The pooled interval of ``test`` applied to ``claim``'s methods and multiples, and the seeds used."""
    evidence = TESTS[test](claim, runs)
    pooled, _ = per_seed_bootstrap(list(evidence.tables), evidence.statistic, resamples, seed)
    return pooled, evidence.seeds


def precondition_problem(condition: Precondition, runs: Runs, resamples: int) -> str:
    """Why ``condition`` fails, or '' when it holds."""
    if condition.kind == "passkey_at_least":
        for method in condition.methods:
            accuracies = []
            for seed in _common_seeds(runs, (method,)):
                result = _result(runs, method, seed)
                passkey = result.passkey
                accuracy = passkey.by_length.get(condition.multiple * result.train_len) if passkey else None
                if accuracy is None:
                    raise NotMeasured(f"no passkey of {method!r} at {condition.multiple}x L")
                accuracies.append(accuracy)
            if np.mean(accuracies) < condition.value:
                return (f"{method} retrieves {np.mean(accuracies):.2f} < {condition.value:g} of its passkeys at "
                        f"{condition.multiple}x L (" + " / ".join(f"{a:.2f}" for a in accuracies) + " per seed)")
        return ""
    if condition.kind == "tables_differ":
        m0, m1 = condition.methods
        for seed in _common_seeds(runs, condition.methods):
            tables = [np.asarray(np.nan if (t := _result(runs, m, seed).temperature_table) is None else t)
                      for m in (m0, m1)]
            gap = float(np.nanmax(np.abs(tables[0] - tables[1]))) if tables[0].shape == tables[1].shape else math.inf
            if not gap >= condition.value:
                return (f"{m1}'s temperature table is within {condition.value:g} of {m0}'s (max difference "
                        f"{gap:.4f}" + (f", seed {seed}" if seed is not None else "") + "): the ablation is degenerate")
        return ""
    if condition.kind == "gap_positive":
        probe = Claim("gap", "", "", "log_ppl_difference", (condition.methods[0],) * 2, (condition.multiple, 1))
        interval, _ = measure("log_ppl_difference", probe, runs, resamples)
        return "" if interval.low > 0 else (f"{condition.methods[0]}'s log-PPL does not rise from 1x to "
                                            f"{condition.multiple}x (interval [{interval.low:.3f}, {interval.high:.3f}])")
    raise ValueError(f"unknown precondition {condition.kind!r}")


def evaluate_claim(claim: Claim, runs: Runs, resamples: int) -> Outcome:
    """The claim's outcome on ``runs`` (one matrix point: method -> seed -> results)."""
    try:
        for condition in claim.preconditions:
            problem = precondition_problem(condition, runs, resamples)
            if problem:
                return Outcome(claim, "untestable", reason=problem)
        interval, seeds = measure(claim.test, claim, runs, resamples)
    except NotMeasured as missing:
        return Outcome(claim, "not measured", reason=str(missing))
    return Outcome(claim, verdict(claim, interval), interval, seeds)
