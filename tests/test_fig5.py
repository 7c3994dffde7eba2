"""Fig 5 per layer and its within-layer permutation test: the p value against a brute-force enumeration of every
permutation (itertools and scipy's Spearman, layer by layer), exactly where the test enumerates them and within
Monte Carlo error where it draws them; seeds combined through the mean statistic; the three views read from a
HeadScale run and NoPE's evaluation, the section's table and its dated rule."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats as scipy_stats

from nope_lightning.analysis.lengthgen.fig5 import (
    PERMUTATION_CLAIM,
    RULE,
    fig5_figures,
    fig5_section,
    permutation_test,
    views,
)
from nope_lightning.analysis.lengthgen.plots import plt
from tests.test_claims import SEEDS, L, headscale, untuned_run

TINY_TABLE = np.array([[1.0, 1.0, 1.6, 2.2], [1.3, 2.0, 1.0, 1.1]])  # ties at the floor, as HeadScale's tables have
TINY_ENTROPY = np.array([[3.1, 2.2, 2.9, 1.5], [4.0, 3.2, 4.4, 3.9]])


def layer_rhos(table: np.ndarray, entropy: np.ndarray) -> list[list[float]]:
    """Per layer, scipy's Spearman rho of every permutation of that layer's lambdas (itertools order)."""
    return [[scipy_stats.spearmanr(e, np.asarray(order)).statistic for order in itertools.permutations(t)]
            for t, e in zip(table, entropy, strict=True)]


def brute_force_p(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float]:
    """(statistic, p): the mean over seeds of the mean over layers of rho, and the share of every within-layer
    permutation of every seed whose statistic is as low or lower."""
    per_seed = [layer_rhos(t, e) for t, e in pairs]
    observed = np.mean([np.mean([scipy_stats.spearmanr(e, t).statistic for t, e in zip(*pair, strict=True)])
                        for pair in pairs])
    layers = [rho for seed in per_seed for rho in seed]
    count = total = 0
    for combo in itertools.product(*layers):
        values = iter(combo)
        statistic = np.mean([np.mean([next(values) for _ in seed]) for seed in per_seed])
        count += statistic <= observed + 1e-12
        total += 1
    return float(observed), count / total


def test_the_p_value_is_the_share_of_every_within_layer_permutation_as_extreme():
    """4 heads x 2 layers: 4!^2 = 576 permutations, all enumerated (fewer than 10,000): the exact p."""
    statistic, p = brute_force_p([(TINY_TABLE, TINY_ENTROPY)])
    test = permutation_test({1: (TINY_TABLE, TINY_ENTROPY)})
    assert test.exact and test.draws == 576
    assert test.statistic == pytest.approx(statistic) and test.p == pytest.approx(p, abs=1e-12)
    assert test.per_seed == ((1, pytest.approx(statistic), pytest.approx(p, abs=1e-12)),)
    assert 0 < p < 1 and test.p + test.p_upper >= 1  # ties and the observed table count in both tails


def test_random_permutations_estimate_the_exact_p():
    """The same case forced onto random permutations: within a few Monte Carlo standard errors of the exact p,
    and seeded (the same p twice)."""
    _, p = brute_force_p([(TINY_TABLE, TINY_ENTROPY)])
    drawn = permutation_test({1: (TINY_TABLE, TINY_ENTROPY)}, permutations=500)
    assert not drawn.exact and drawn.draws == 500
    assert abs(drawn.p - p) < 4 * np.sqrt(p * (1 - p) / 500)
    assert permutation_test({1: (TINY_TABLE, TINY_ENTROPY)}, permutations=500).p == drawn.p


def test_seeds_are_combined_through_the_mean_statistic_over_every_permutation_of_each():
    """Two seeds of 3 heads x 2 layers: 36 permutations each, 1,296 pairs, all enumerated."""
    rng = np.random.default_rng(3)
    pairs = [(rng.uniform(1, 2, (2, 3)), rng.uniform(2, 5, (2, 3))) for _ in range(2)]
    statistic, p = brute_force_p(pairs)
    test = permutation_test(dict(enumerate(pairs)))
    assert test.exact and test.draws == 36 ** 2
    assert test.statistic == pytest.approx(statistic) and test.p == pytest.approx(p, abs=1e-12)


def test_a_table_ranked_against_entropy_in_every_layer_is_reproduced_and_a_random_one_is_not():
    rng = np.random.default_rng(0)
    pairs = {}
    for s in SEEDS:
        entropy = rng.uniform(2, 6, (12, 4))
        pairs[s] = (8.0 - entropy, entropy)
    strong = permutation_test(pairs)
    assert strong.statistic == pytest.approx(-1.0) and strong.p == pytest.approx(1 / 10_001)
    assert strong.verdict == "reproduced" and strong.draws == 10_000
    upside = permutation_test({s: (-t, e) for s, (t, e) in pairs.items()})
    assert upside.verdict == "not reproduced" and upside.p_upper == pytest.approx(1 / 10_001)
    few = permutation_test({s: pairs[s] for s in SEEDS[:3]})
    assert few.verdict == "3 seeds: no verdict (fewer than 5)"


def fig5_runs(entropy: np.ndarray, table: np.ndarray) -> dict:
    """The Fig 5 claim's two methods per seed: HeadScale (tuned entropy = -entropy, the other way round) and
    NoPE's evaluation, whose per-head entropy over [3.5L, 4L) is ``entropy`` and 9 nats elsewhere."""
    tuned_method, untuned_method = PERMUTATION_CLAIM.methods
    return {tuned_method: {s: headscale(table.tolist(), (-entropy).tolist()) for s in SEEDS},
            untuned_method: {s: untuned_run(entropy, (0, 3 * L // 4, L, 3 * L, 3 * L + L // 2, 4 * L))
                             for s in SEEDS}}


def test_the_three_views_the_section_and_the_figures():
    rng = np.random.default_rng(1)
    entropy = rng.uniform(1, 5, (3, 4))
    table = 4.0 - 0.5 * entropy
    found = views(fig5_runs(entropy, table))
    assert list(found) == ["tuned", "untuned at T", "untuned inside L"]
    np.testing.assert_allclose(found["tuned"][1][1], -entropy)
    np.testing.assert_allclose(found["untuned at T"][1][1], entropy)  # the last 1/8 of T = 4L
    np.testing.assert_allclose(found["untuned inside L"][1][1], 9.0)  # the last quarter of L
    text = fig5_section(fig5_runs(entropy, table), {s: "2026-11-27" for s in SEEDS})
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert len({line.count("|") - line.count("\\|") for line in rows}) == 1  # a well-formed table
    untuned = next(line for line in rows if line.startswith("| untuned at T"))
    assert "-1.000" in untuned and "**reproduced**: *exploratory*: its rule was set on 2026-11-28" in untuned
    assert not any(line.startswith("| untuned inside L") for line in rows)  # 9 nats in every head: no rank
    assert RULE.date == "2026-11-28" and RULE.seen and PERMUTATION_CLAIM.changes == (RULE,)
    assert "exploratory" not in fig5_section(fig5_runs(entropy, table), {s: "2026-11-29" for s in SEEDS})
    figures = fig5_figures(fig5_runs(entropy, table))
    assert sorted(figures) == ["fig5_tuned_by_layer.png", "fig5_untuned_at_T_by_layer.png",
                               "fig5_untuned_inside_L_by_layer.png"]
    assert all("seed 1" in plot.caption for plot in figures.values())
    assert "not at the last position alone" in figures["fig5_tuned_by_layer.png"].caption
    for plot in figures.values():
        assert len([ax for ax in plot.figure.axes if ax.get_visible()]) == 3  # one panel per layer
        plt.close(plot.figure)
    assert fig5_section({}) == "" and fig5_figures({}) == {}
