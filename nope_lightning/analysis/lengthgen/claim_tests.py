"""What each of paper 001's claims measures (``TESTS``: a claim's ``test`` -> its ``Evidence``), read from a
pipeline's runs through their result types.

Every effect is computed seed by seed. Most are a statistic of sums over resampling units that all compared
methods share (the same blocks of evaluation windows, the same position windows, the same passkey prompts), so
comparisons are paired: the noise of the text the methods are scored on cancels, and each seed's estimate comes
with its own bootstrap over those units. A claim about a HeadScale table has no such units: its per-seed values
are given directly (``Evidence.values``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from nope_lightning.analysis.lengthgen.inflection import inflection
from nope_lightning.analysis.lengthgen.log_law import (
    best_on_grid,
    bucket_best,
    log_slope_batch,
    position_buckets_past,
)
from nope_lightning.analysis.verdicts import NotMeasured
from nope_lightning.config.paper import INFLECTION_ENTROPY, INFLECTION_LOGPPL, Claim
from nope_lightning.numerics.stats import block_size, blocks, spearman
from nope_lightning.results.evaluation import EvaluationResult
from nope_lightning.results.headscale import CONVERGED_TAIL, HeadScaleResult
from nope_lightning.results.search import ScaleSearchResult

#: method -> seed (None without seeds) -> that run's result (an evaluation, a scale-search or a HeadScale run)
Result = EvaluationResult | ScaleSearchResult | HeadScaleResult
Runs = Mapping[str, Mapping[int | None, Result]]
Statistic = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Evidence:
    """What a test needs: one ``(units, k)`` table per seed (rows resampled together) and the statistic of one
    seed's column sums ``(R, 1, k) -> (R,)``, the same for every seed or one per seed (built from that seed's own
    data: its own search grid); or, for a test without resampling units, the per-seed ``values`` themselves.
    ``aside``: per seed, the effect as the paper measured it where the test reads a sounder view (Fig 5)."""

    seeds: tuple[int | None, ...]
    tables: tuple[np.ndarray, ...] = ()
    statistic: Statistic | tuple[Statistic, ...] | None = None
    values: tuple[float, ...] = ()
    aside: tuple[float, ...] = ()


# --- what each test reads from a run ---------------------------------------------------------------------


def run_result(runs: Runs, method: str, seed: int | None) -> Result:
    try:
        return runs[method][seed]
    except KeyError:
        raise NotMeasured(f"no run of {method!r}" + (f" for seed {seed}" if seed is not None else "")) from None


def common_seeds(runs: Runs, methods: tuple[str, ...]) -> tuple[int | None, ...]:
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
    seeds = common_seeds(runs, claim.methods)
    tables = [ppl_units([(run_result(runs, m0, s), x0), (run_result(runs, m1, s), x1)]) for s in seeds]
    return Evidence(seeds, tuple(tables), lambda sums: _mean(sums, 0) - _mean(sums, 1))


def _log_ppl_rise_difference(claim: Claim, runs: Runs) -> Evidence:
    (m0, m1), (x0, x1) = claim.methods, claim.multiples
    seeds = common_seeds(runs, claim.methods)
    tables = [ppl_units([(run_result(runs, m, s), x) for m in (m0, m1) for x in (x0, x1)]) for s in seeds]
    return Evidence(seeds, tuple(tables),
                    lambda sums: (_mean(sums, 3) - _mean(sums, 2)) - (_mean(sums, 1) - _mean(sums, 0)))


def _gap_closed(claim: Claim, runs: Runs) -> Evidence:
    (m0, m1), (x0, x1) = claim.methods, claim.multiples
    seeds = common_seeds(runs, claim.methods)
    tables = [ppl_units([(run_result(runs, m0, s), x0), (run_result(runs, m0, s), x1), (run_result(runs, m1, s), x1)])
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
    seeds = common_seeds(runs, claim.methods)
    tables = [position_units(run_result(runs, method, s), [(lo, hi), (0, 1)], kind) for s in seeds]
    return Evidence(seeds, tuple(tables), lambda sums: _mean(sums, 0) - _mean(sums, 1))


def _passkey_comparison(claim: Claim, runs: Runs) -> Evidence:
    """The first method's passkey accuracy minus the second's (``passkey_difference``), on the same prompts at
    ``multiples[0]`` x L (without multiples: every length)."""
    m0, m1 = claim.methods
    multiple = claim.multiples[0] if claim.multiples else None
    seeds = common_seeds(runs, claim.methods)
    tables = [passkey_units([run_result(runs, m0, s), run_result(runs, m1, s)], multiple) for s in seeds]
    return Evidence(seeds, tuple(tables), lambda sums: _mean(sums, 0) - _mean(sums, 1))


def _best_temperature(claim: Claim, runs: Runs) -> Evidence:
    """The best uniform lambda at the first target (``best_temperature``) or the best at the second minus the
    first (``best_temperature_rise``), each seed on its own search's grid."""
    seeds = common_seeds(runs, claim.methods)
    found = [search_units(run_result(runs, claim.methods[0], s), claim.multiples) for s in seeds]

    def statistic(lambdas: np.ndarray) -> Statistic:
        trials = len(lambdas)

        def best(sums: np.ndarray, target: int) -> np.ndarray:
            part = sums[:, 0, 2 * trials * target:2 * trials * (target + 1)]
            return best_on_grid(part[:, 0::2] / part[:, 1::2], lambdas)

        if claim.test == "best_temperature":
            return lambda sums: best(sums, 0)
        return lambda sums: best(sums, 1) - best(sums, 0)

    return Evidence(seeds, tuple(t for t, _ in found), tuple(statistic(lambdas) for _, lambdas in found))


def _log_law_slope(claim: Claim, runs: Runs) -> Evidence:
    """The slope b of ``lambda = c + b ln s`` through each position bucket's best lambda past L
    (``log_law.log_slope_batch``): each seed's fit from its own search (its grid, its buckets, its windows)."""
    seeds = common_seeds(runs, claim.methods)
    tables, statistics = [], []
    for seed in seeds:
        summary = run_result(runs, claim.methods[0], seed)
        if summary.samples is None:
            raise NotMeasured(f"the search of seed {seed} kept no per-window samples")
        try:
            units, widths, ratios = position_buckets_past(summary.samples.edges, summary.samples.position,
                                                          summary.train_len)
        except ValueError as err:
            raise NotMeasured(str(err)) from None
        grid = np.asarray(summary.temperatures)
        tables.append(units)
        statistics.append(lambda sums, g=grid, w=widths, r=ratios: log_slope_batch(bucket_best(sums, g, w), r))
    return Evidence(seeds, tuple(tables), tuple(statistics))


# --- inflections (Fig 1-2) and HeadScale's heads (Fig 4-5) ---------------------------------------------------


def curve_units(result: EvaluationResult) -> tuple[np.ndarray, list[int]]:
    """``(units, edges)``: per position window its log-PPL sums over the equal-width buckets ``edges``, then its
    entropy sums over the same buckets, then a 1 (the window count): (windows, 2 * buckets + 1)."""
    position = result.position
    if position is None or not position.edges or result.corpora[0] not in position.logppl:
        raise NotMeasured(f"no per-position curves in setting {result.setting!r}")
    if position.entropy is None:
        raise NotMeasured(f"no per-position attention entropy in setting {result.setting!r}")
    logppl = np.asarray(position.logppl[result.corpora[0]].windows, dtype=np.float64)
    entropy = np.asarray(position.entropy.windows, dtype=np.float64)
    return np.concatenate([logppl, entropy, np.ones((len(logppl), 1))], 1), list(position.edges)


def _inflections(edges: list[int], train_len: int, offset: int = 0) -> Callable[[np.ndarray], tuple]:
    """From one seed's sums, the (log-PPL, entropy) inflections of the curves starting at column ``offset`` of a
    ``curve_units`` table (x L)."""
    widths = np.diff(np.asarray(edges, dtype=np.float64))
    count = len(widths)

    def both(sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        windows = sums[:, 0, offset + 2 * count:offset + 2 * count + 1]
        logppl = sums[:, 0, offset:offset + count] / (windows * widths)
        entropy = sums[:, 0, offset + count:offset + 2 * count] / (windows * widths)
        return (inflection(logppl, edges, train_len, INFLECTION_LOGPPL),
                inflection(entropy, edges, train_len, INFLECTION_ENTROPY, trend=True))

    return both


def seed_curves(runs: Runs, method: str, seed: int | None) -> tuple[np.ndarray, list[int], int]:
    """``curve_units`` of one run and its L; ``NotMeasured`` when its buckets cannot place an inflection."""
    result = run_result(runs, method, seed)
    units, edges = curve_units(result)
    try:
        inflection(np.zeros(len(edges) - 1), edges, result.train_len, 0.0)
    except ValueError as err:
        raise NotMeasured(str(err)) from None
    return units, edges, result.train_len


def logppl_inflection(runs: Runs, method: str, seed: int | None) -> tuple[float, list[int], int]:
    """``(inflection x L, edges, L)`` of one run's per-position log-PPL on all its windows."""
    units, edges, train_len = seed_curves(runs, method, seed)
    ppl, _ = _inflections(edges, train_len)(units.sum(0)[None, None])
    return float(ppl[0]), edges, train_len


def _inflection_gap(claim: Claim, runs: Runs) -> Evidence:
    """Entropy inflection minus log-PPL inflection (``inflection_gap``, x L), or the earlier of the two
    (``earliest_inflection``), on one method's per-position curves."""
    seeds = common_seeds(runs, claim.methods)
    tables, statistics = [], []
    for seed in seeds:
        units, edges, train_len = seed_curves(runs, claim.methods[0], seed)
        both = _inflections(edges, train_len)
        tables.append(units)
        if claim.test == "inflection_gap":
            statistics.append(lambda sums, f=both: np.subtract(*f(sums)[::-1]))
        else:
            statistics.append(lambda sums, f=both: np.minimum(*f(sums)))
    return Evidence(seeds, tuple(tables), tuple(statistics))


def _inflection_shift(claim: Claim, runs: Runs) -> Evidence:
    """How far the second method (a larger lambda) moves both inflections past the first method's: the smaller
    of the log-PPL shift and the entropy shift (x L), on the same position windows."""
    (m0, m1), seeds = claim.methods, common_seeds(runs, claim.methods)
    tables, statistics = [], []
    for seed in seeds:
        (u0, e0, train_len), (u1, e1, _) = (seed_curves(runs, m, seed) for m in (m0, m1))
        if e0 != e1 or len(u0) != len(u1):
            raise NotMeasured(f"{m0} and {m1} measured different position windows or buckets")
        before, after = _inflections(e0, train_len), _inflections(e0, train_len, u0.shape[1])
        tables.append(np.concatenate([u0, u1], 1))
        statistics.append(lambda sums, b=before, a=after: np.minimum(*(np.subtract(x1, x0) for x0, x1
                                                                       in zip(b(sums), a(sums), strict=True))))
    return Evidence(seeds, tuple(tables), tuple(statistics))


def _entropy_and_ppl(claim: Claim, runs: Runs) -> Evidence:
    """The first method's mean entropy minus the second's, and the second's mean log-PPL minus the first's, over
    positions [lo L, hi L) of the same position windows: the smaller of the two (nats; > 0: both hold)."""
    (m0, m1), (lo, hi) = claim.methods, claim.multiples
    seeds = common_seeds(runs, claim.methods)
    tables = [np.concatenate([position_units(run_result(runs, m, s), [(lo, hi)], kind)
                              for m in (m0, m1) for kind in ("entropy", "logppl")], 1) for s in seeds]
    return Evidence(seeds, tuple(tables), lambda sums: np.minimum(_mean(sums, 0) - _mean(sums, 2),
                                                                  _mean(sums, 3) - _mean(sums, 1)))


def head_rank(table: np.ndarray, entropy: np.ndarray) -> float:
    """Spearman's rho of (converged entropy, lambda) over each layer's heads, averaged over the layers where it
    is defined (a layer whose heads all share one lambda or one entropy has none); NaN when no layer has one."""
    rho = spearman(np.asarray(entropy, dtype=np.float64), np.asarray(table, dtype=np.float64))
    return float(np.nanmean(rho)) if np.isfinite(rho).any() else float("nan")


def untuned_head_entropy(result: EvaluationResult, target_len: int) -> np.ndarray:
    """(n_layer, n_head) attention entropy (nats) of an untuned model over positions ``[T - T/CONVERGED_TAIL, T)``
    of ``T = target_len``, the positions HeadScale's converged entropy averages (``eval.entropy``)."""
    return head_entropy_over(result, target_len - max(1, target_len // CONVERGED_TAIL), target_len)


def head_entropy_over(result: EvaluationResult, start: int, stop: int) -> np.ndarray:
    """(n_layer, n_head) attention entropy (nats) of an evaluated model averaged over positions ``[start, stop)``,
    from its evaluation's per-head entropy buckets (causal attention: a position's entropy does not depend on the
    window continuing past it). ``NotMeasured`` when the buckets do not tile those positions."""
    entropy = result.entropy
    if entropy is None:
        raise NotMeasured(f"no per-head attention entropy in setting {result.setting!r}: not measured in this "
                          f"bundle")
    edges = entropy.edges
    inside = [i for i, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True)) if start <= a and b <= stop]
    if not inside or edges[inside[0]] != start or edges[inside[-1] + 1] != stop:
        raise NotMeasured(f"the untuned model's per-head entropy buckets do not tile positions [{start}, "
                          f"{stop}): not measured in this bundle")
    widths = np.diff(np.asarray(edges, dtype=np.float64))[inside]
    return np.asarray(entropy.per_head, dtype=np.float64)[..., inside] @ widths / widths.sum()


def _head_entropy_rank(claim: Claim, runs: Runs) -> Evidence:
    """Per seed, ``head_rank`` of the HeadScale run's table (first method) against the untuned model's entropy
    per head at the tuning length (the second method's evaluation: ``untuned_head_entropy``); ``aside``: against
    the tuned model's converged entropy, as the paper's Fig 5 plots it (a larger lambda lowers a head's entropy by
    construction, so that view cannot tell cause from effect)."""
    seeds = common_seeds(runs, claim.methods)
    values, aside = [], []
    for seed in seeds:
        tuned, untuned = (run_result(runs, m, seed) for m in claim.methods)
        if not isinstance(tuned, HeadScaleResult) or tuned.converged_entropy is None:
            raise NotMeasured(f"{claim.methods[0]!r} has no HeadScale table with converged entropies")
        before = untuned_head_entropy(untuned, tuned.target_len)
        if np.shape(tuned.table) != np.shape(tuned.converged_entropy.per_head) or np.shape(tuned.table) != before.shape:
            raise NotMeasured(f"{claim.methods[0]!r}: its table and its entropies have different shapes")
        values.append(head_rank(tuned.table, before))
        aside.append(head_rank(tuned.table, tuned.converged_entropy.per_head))
    return Evidence(seeds, values=tuple(values), aside=tuple(aside))


TESTS: dict[str, Callable[[Claim, Runs], Evidence]] = {
    "log_ppl_difference": _log_ppl_difference, "log_ppl_rise_difference": _log_ppl_rise_difference,
    "gap_closed": _gap_closed, "position_ratio": _position_difference, "entropy_rise": _position_difference,
    "inflection_gap": _inflection_gap, "earliest_inflection": _inflection_gap,
    "inflection_shift": _inflection_shift, "entropy_and_ppl": _entropy_and_ppl,
    "head_entropy_rank": _head_entropy_rank, "passkey_difference": _passkey_comparison,
    "best_temperature": _best_temperature, "best_temperature_rise": _best_temperature,
    "log_law_slope": _log_law_slope}
