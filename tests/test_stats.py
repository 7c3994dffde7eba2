"""Intervals against analytic references: the bootstrap of a mean against the normal-theory interval, Wilson
and Student t against their formulas (scipy), the prediction interval for a new seed against scipy, blocks,
Spearman against scipy, and the pooled per-seed bootstrap (one statistic per seed, undefined resamples counted)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from nope_lightning.numerics.stats import (
    MIN_RESAMPLES,
    UNIT,
    Interval,
    blocks,
    bootstrap,
    monotone_verdict,
    per_seed_bootstrap,
    prediction_interval,
    spearman,
    t_interval,
    wilson,
)


def ratio(sums: np.ndarray) -> np.ndarray:
    return sums[:, 0, 0] / sums[:, 0, 1]


def test_bootstrap_of_a_mean_matches_the_normal_theory_interval():
    # 4,000 iid normal values: the percentile bootstrap of the mean converges to mean +- 1.96 s / sqrt(n).
    x = np.random.default_rng(1).normal(3.0, 2.0, 4000)
    units = np.stack([x, np.ones_like(x)], 1)
    interval = bootstrap([units], ratio, resamples=4000, seed=2)
    half = 1.959964 * x.std(ddof=1) / math.sqrt(len(x))
    assert interval.estimate == pytest.approx(x.mean())
    assert interval.low == pytest.approx(x.mean() - half, abs=0.1 * half)
    assert interval.high == pytest.approx(x.mean() + half, abs=0.1 * half)


def test_bootstrap_of_a_proportion_matches_wilson():
    correct = np.r_[np.ones(120), np.zeros(280)]
    units = np.stack([correct, np.ones_like(correct)], 1)
    boot = bootstrap([units], ratio, resamples=4000, seed=0)
    exact = wilson(120, 400)
    assert boot.estimate == exact.estimate == 0.3
    assert boot.low == pytest.approx(exact.low, abs=0.01) and boot.high == pytest.approx(exact.high, abs=0.01)


def test_wilson_matches_its_formula_and_stays_inside_zero_one():
    z = scipy_stats.norm.ppf(0.975)
    n, k = 20, 17
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    spread = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    interval = wilson(k, n)
    assert (interval.low, interval.high) == pytest.approx((centre - spread, centre + spread))
    assert wilson(0, 10).low == 0.0 and 0.0 < wilson(0, 10).high < 0.35
    assert wilson(10, 10).high == pytest.approx(1.0)
    with pytest.raises(ValueError):
        wilson(0, 0)


def test_t_interval_matches_scipy_and_one_seed_has_no_interval():
    values = [3.51, 3.47, 3.60]
    low, high = scipy_stats.t.interval(0.95, 2, loc=np.mean(values), scale=scipy_stats.sem(values))
    interval = t_interval(values)
    assert (interval.estimate, interval.low, interval.high) == pytest.approx((np.mean(values), low, high))
    assert interval.per_seed == tuple(values)
    single = t_interval([3.5])
    assert single.estimate == 3.5 and math.isnan(single.low) and math.isnan(single.high)


def test_the_prediction_interval_for_one_new_seed_matches_scipy():
    values = [0.121, 0.003, -0.010, 0.05]
    n, mean, sd = len(values), np.mean(values), np.std(values, ddof=1)
    expected = scipy_stats.t.interval(0.95, n - 1, loc=mean, scale=sd * math.sqrt(1 + 1 / n))
    interval = prediction_interval(values)
    assert (interval.estimate, interval.low, interval.high) == pytest.approx((mean, *expected))
    # sqrt(n + 1) times the t interval of the mean
    assert interval.half_width == pytest.approx(t_interval(values).half_width * math.sqrt(n + 1))
    single = prediction_interval([0.1])
    assert single.estimate == 0.1 and math.isnan(single.low) and math.isnan(single.high)


def test_an_accuracy_interval_stays_inside_zero_and_one():
    # Passkey accuracies of three seeds (the small study's NoPE at 2x): the raw t interval runs past both ends.
    values = [0.85, 0.80, 0.20]
    low, high = scipy_stats.t.interval(0.95, 2, loc=np.mean(values), scale=scipy_stats.sem(values))
    assert low < 0 and high > 1
    clipped = t_interval(values, bounds=UNIT)
    assert (clipped.estimate, clipped.low, clipped.high) == pytest.approx((np.mean(values), 0.0, 1.0))
    inside = t_interval([0.50, 0.52, 0.54], bounds=UNIT)
    expected = scipy_stats.t.interval(0.95, 2, loc=0.52, scale=scipy_stats.sem([0.50, 0.52, 0.54]))
    assert (inside.low, inside.high) == pytest.approx(expected)


def test_blocks_never_span_two_documents():
    values = np.arange(10, dtype=float)[:, None]
    docs = np.array([0, 0, 0, 0, 0, 1, 1, 2, 2, 2])
    assert blocks(values, docs, 2)[:, 0].tolist() == [0 + 1, 2 + 3, 4, 5 + 6, 7 + 8, 9]
    assert blocks(values, docs, 1)[:, 0].tolist() == values[:, 0].tolist()


def test_spearman_matches_scipy_including_ties():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(5, 9)), rng.normal(size=(5, 9))
    x[0, :3] = 1.0  # ties
    expected = [scipy_stats.spearmanr(a, b).statistic for a, b in zip(x, y, strict=True)]
    assert spearman(x, y) == pytest.approx(expected)


def test_pooled_bootstrap_averages_seeds_and_keeps_each_estimate():
    rng = np.random.default_rng(3)
    strata = [np.stack([rng.normal(mu, 1.0, 500), np.ones(500)], 1) for mu in (1.0, 2.0, 3.0)]
    pooled, each = per_seed_bootstrap(strata, ratio, resamples=1000)
    means = [s[:, 0].mean() for s in strata]
    assert pooled.per_seed == pytest.approx(means)
    assert pooled.estimate == pytest.approx(np.mean(means))
    # the mean of three independent means: its half-width is 1/sqrt(3) of one seed's
    assert pooled.half_width == pytest.approx(np.mean([e.half_width for e in each]) / math.sqrt(3), rel=0.2)
    assert all(e.low < m < e.high for e, m in zip(each, means, strict=True))


def test_each_seed_may_have_its_own_statistic():
    rng = np.random.default_rng(4)
    strata = [np.stack([rng.normal(1.0, 1.0, 300), np.ones(300)], 1) for _ in range(2)]
    pooled, each = per_seed_bootstrap(strata, (ratio, lambda sums: 2 * ratio(sums)), resamples=500)
    means = [s[:, 0].mean() for s in strata]
    assert pooled.per_seed == pytest.approx([means[0], 2 * means[1]])
    assert pooled.estimate == pytest.approx((means[0] + 2 * means[1]) / 2)
    with pytest.raises(ValueError, match="one per stratum"):
        per_seed_bootstrap(strata, (ratio,), resamples=500)


def test_undefined_resamples_are_counted_not_silently_dropped():
    # a ratio whose denominator is 0 in the resamples that draw only the first (zero-count) unit of two
    rows = np.array([[1.0, 0.0], [1.0, 1.0]])
    with np.errstate(divide="ignore", invalid="ignore"):
        interval = bootstrap([rows], ratio, resamples=1000, seed=1)
    assert interval.resamples == 1000
    # P(both draws hit the zero-count unit) = 1/4: about 250 undefined resamples, counted
    assert 180 < interval.undefined < 320
    assert bootstrap([np.ones((5, 2))], ratio, resamples=200).undefined == 0


def test_bootstrap_refuses_too_few_resamples():
    with pytest.raises(ValueError, match=f">= {MIN_RESAMPLES}"):
        bootstrap([np.ones((3, 2))], ratio, resamples=MIN_RESAMPLES - 1)


def test_an_interval_widens_to_its_estimate_only_when_it_misses_it():
    inside = Interval(0.5, 0.2, 0.8)
    assert inside.covers_estimate and inside.hull() is inside
    below = Interval(-0.66, -0.59, -0.12, per_seed=(-0.2, -1.2))
    assert not below.covers_estimate
    assert (below.hull().low, below.hull().high, below.hull().per_seed) == (-0.66, -0.12, (-0.2, -1.2))
    above = Interval(0.9, 0.2, 0.8).hull()
    assert (above.low, above.high) == (0.2, 0.9)
    assert Interval(0.5, math.nan, math.nan).covers_estimate


@pytest.mark.parametrize("trials", [7, 100, 1000])
def test_wilson_contains_its_proportion_at_zero_and_one(trials):
    for successes in (0, trials):
        assert wilson(successes, trials).covers_estimate


RANK = {"not reproduced": 0, "inconclusive": 1, "reproduced": 2}


def t_test_verdict(values: np.ndarray, margin: float) -> str:
    """The plain one-sided 95 % t test against ``margin`` (above), by scipy: the reference the hull extends."""
    low, high = scipy_stats.t.interval(0.90, len(values) - 1, loc=values.mean(), scale=scipy_stats.sem(values))
    return "reproduced" if low > margin else "not reproduced" if high <= margin else "inconclusive"


def test_a_seed_moved_further_onto_the_claims_side_never_weakens_the_verdict():
    rng = np.random.default_rng(0)
    for trial in range(300):
        n, side = int(rng.integers(2, 9)), ("above", "below", "within")[trial % 3]
        values = rng.normal(rng.normal(0, 1), rng.uniform(0.05, 2.0), n)
        margin = abs(rng.normal(0, 1)) + 0.05 if side == "within" else rng.normal(0, 1)
        before = RANK[monotone_verdict(values, margin, side)]
        k, moved = int(rng.integers(n)), values.copy()
        if side == "within":
            moved[k] *= rng.uniform(0, 1)  # toward 0
        else:
            moved[k] += (1 if side == "above" else -1) * rng.exponential(rng.choice([0.1, 1.0, 10.0]))
        assert RANK[monotone_verdict(moved, margin, side)] >= before, (side, values, margin, k, moved)


def test_the_monotone_verdict_contains_the_t_test_and_fixes_its_strongest_seed_problem():
    strong = np.array([1.35, 8.0, 1.53, 1.75])
    assert t_test_verdict(strong, 0.405) == "inconclusive"  # the t test alone: widened by the strongest seed
    assert t_test_verdict(np.array([1.35, 1.75, 1.53, 1.75]), 0.405) == "reproduced"
    assert monotone_verdict(strong, 0.405, "above") == "reproduced"
    rng = np.random.default_rng(1)
    for _ in range(200):  # wherever the t test decides, the hull agrees
        values, margin = rng.normal(0.3, rng.uniform(0.05, 1), int(rng.integers(3, 9))), rng.normal(0, 0.5)
        if (plain := t_test_verdict(values, margin)) != "inconclusive":
            assert monotone_verdict(values, margin, "above") == plain
    # mirrored: "below" is "above" on the negated effects
    assert monotone_verdict(-strong, -0.405, "below") == "reproduced"


def test_tost_on_synthetic_inputs():
    # equivalent: the 90 % interval (mean -+ t(0.95, 4) s / sqrt 5) lies inside +-0.5
    tight = np.array([0.05, -0.1, 0.0, 0.1, -0.05])
    low, high = scipy_stats.t.interval(0.90, 4, loc=tight.mean(), scale=scipy_stats.sem(tight))
    assert -0.5 < low and high < 0.5 and monotone_verdict(tight, 0.5, "within") == "reproduced"
    # not equivalent: the whole interval lies past the margin
    assert monotone_verdict(np.array([0.9, 1.0, 1.1, 0.95, 1.05]), 0.5, "within") == "not reproduced"
    # too noisy: centred on 0 but the interval runs past both ends of the margin
    noisy = np.array([1.2, -1.1, 0.9, -1.0, 0.0])
    low, high = scipy_stats.t.interval(0.90, 4, loc=noisy.mean(), scale=scipy_stats.sem(noisy))
    assert low < -0.5 and high > 0.5 and monotone_verdict(noisy, 0.5, "within") == "inconclusive"
    # every seed inside the margin on one side of 0 is equivalence (each further out and equal would pass)
    assert monotone_verdict(np.array([0.1, 0.45, 0.3]), 0.5, "within") == "reproduced"


def test_with_n_seeds_all_on_the_claims_side_is_reproduced_the_price_of_monotonicity():
    # no monotone rule with an unknown spread can do better than 2^-n under no effect: the hull reproduces these
    assert monotone_verdict(np.array([0.01, 5.0, 0.02, 9.0]), 0.0, "above") == "reproduced"
    assert monotone_verdict(np.array([-0.01, 5.0, 0.02, 9.0]), 0.0, "above") == "inconclusive"
