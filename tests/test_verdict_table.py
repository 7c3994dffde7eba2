"""The claims table says what its verdicts read: the bound the rule compared with the margin (equal to a direct
search over the sets of seeds the rule allows, also when one seed is far stronger than the others and the printed
interval crosses the margin), the prediction interval on a log-scale claim's scale (against numpy / scipy), no
verdict below five seeds, the rule's size under no effect by simulation against a reviewer's independent numbers,
the exact sign test, a partial repair, the day a rule took its form against the days its seeds ran, and the log law
against a linear rise."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from nope_lightning.analysis.lengthgen.claims import MIN_VERDICT_SEEDS, judge, new_seed_interval
from nope_lightning.analysis.lengthgen.log_law import log_or_linear
from nope_lightning.analysis.lengthgen.report_sections import claims_table
from nope_lightning.analysis.lengthgen.rule_size import bound_read, hull_lower_bounds, null_size, sign_test
from nope_lightning.analysis.lengthgen.verdict_cells import declared_note, magnitude_cell
from nope_lightning.analysis.rule_changes import exploratory_note
from nope_lightning.analysis.verdicts import Outcome
from nope_lightning.config.claim_rules import RuleChange
from nope_lightning.config.paper import CLAIMS_BY_ID
from nope_lightning.numerics.stats import Interval, extreme_bound, monotone_verdict, student_factor
from nope_lightning.results.studies import verdict_counts

HURTS = CLAIMS_BY_ID["large_temperature_hurts_1x"]
BREAKS = CLAIMS_BY_ID["nope_breaks_past_L"]
REPAIRS = CLAIMS_BY_ID["uniform_repairs_2x"]


def outcome(claim, effects, seeds=None) -> Outcome:
    found, across = judge(claim, effects)
    seeds = seeds or tuple(range(1, len(effects) + 1))
    return Outcome(claim, found, Interval(float(np.mean(effects)), math.nan, math.nan, per_seed=tuple(effects)),
                   seeds, across=across, prediction=new_seed_interval(claim, effects))


def row(table: str, claim) -> list[str]:
    return next(line for line in table.splitlines() if line.startswith(f"| {claim.text}")).strip("| ").split(" | ")


def direct_lower_hull(z: np.ndarray) -> float:
    """The largest one-sided 95 % Student lower bound over the sets min(z, v), v on a fine grid (numpy)."""
    factor = scipy_stats.t.ppf(0.95, len(z) - 1) / math.sqrt(len(z))
    levels = np.concatenate([np.linspace(z.min(), z.max(), 200_001), z])
    w = np.minimum(z[None, :], levels[:, None])
    return float((w.mean(1) - factor * w.std(1, ddof=1)).max())


def test_the_printed_bound_is_the_one_the_verdict_read_when_one_seed_is_made_much_stronger():
    # The regime study's 1x harm of lambda 1.5, with its first seed edited to ten times the others.
    effects = (1.42, 0.143, 0.102, 0.091, 0.117, 0.129, 0.124, 0.164)
    o = outcome(HURTS, effects)
    assert o.verdict == "reproduced" and o.across.low <= HURTS.threshold  # the printed interval crosses 0.0198
    bound = direct_lower_hull(np.asarray(effects))
    assert bound > HURTS.threshold and bound == pytest.approx(bound_read(np.asarray(effects), 0.0198, "above")[0],
                                                              abs=1e-6)
    cells = row(claims_table([o]), HURTS)
    assert cells[7] == (f"lower {bound:+.3f} > 0.0198 (the printed 90 % interval crosses the margin: the rule read "
                        f"the seeds pulled back to the others)")
    assert cells[11] == "**reproduced**"


def test_the_hull_bound_is_the_rules_own_on_random_draws():
    rng = np.random.default_rng(3)
    for _ in range(40):
        n = int(rng.integers(3, 9))
        z = rng.standard_normal(n) * rng.uniform(0.1, 3) + rng.uniform(-1, 2)
        z[0] *= 1 + 9 * (rng.random() < 0.4)
        assert hull_lower_bounds(z[None], student_factor(n))[0] == pytest.approx(
            extreme_bound(np.full(n, -np.inf), z, student_factor(n), -1, maximize=True), abs=1e-7)
        margin = float(rng.uniform(-0.5, 1.5))
        clearing, excluding = bound_read(z, margin, "above")
        expected = "reproduced" if clearing > margin else "not reproduced" if excluding <= margin else "inconclusive"
        assert monotone_verdict(z, margin, "above") == expected


def test_the_prediction_interval_of_a_log_scale_claim_is_geometric():
    effects = (1.350, 3.692, 1.531, 1.750, 1.483, 2.007, 1.626, 1.786)  # the regime study's breakdown, nats
    logs, n = np.log(effects), len(effects)
    half = scipy_stats.t.ppf(0.975, n - 1) * logs.std(ddof=1) * math.sqrt(1 + 1 / n)
    direct = np.exp([logs.mean(), logs.mean() - half, logs.mean() + half])
    o = outcome(BREAKS, effects)
    assert (o.prediction.estimate, o.prediction.low, o.prediction.high) == pytest.approx(tuple(direct))
    assert row(claims_table([o]), BREAKS)[8] == f"{direct[0]:+.3f} [{direct[1]:+.3f}, {direct[2]:+.3f}]"
    assert o.prediction.low > 0  # the raw-scale interval ran down to +0.020 nats
    assert math.isnan(new_seed_interval(BREAKS, (*effects[:-1], -0.2)).low)


def test_no_verdict_below_five_seeds():
    assert MIN_VERDICT_SEEDS == 5
    for n in (2, 3, 4):
        found, _ = judge(HURTS, (0.3,) * n)
        assert found == f"{n} seeds: no verdict (fewer than 5)"
    assert judge(HURTS, (0.3,) * 5)[0] == "reproduced"
    cells = row(claims_table([outcome(HURTS, (0.3, 0.25, 0.28, 0.31))]), HURTS)
    assert cells[7] == "—" and cells[10] == "4 of 4" and cells[11] == "**4 seeds: no verdict (fewer than 5)**"


@pytest.mark.parametrize(("seeds", "reviewer"), [(3, 0.125), (4, 0.074), (8, 0.055)])
def test_the_rules_size_under_no_effect_matches_an_independent_simulation(seeds, reviewer):
    # The reviewer's figures, taken as estimates from 10 000 draws each; ours from 100 000: 3 joint standard errors.
    ours = null_size(seeds)
    error = math.sqrt(reviewer * (1 - reviewer) / 10_000 + ours * (1 - ours) / 100_000)
    assert abs(ours - reviewer) < 3 * error
    # every seed on the claim's side is reproduced: at least 2^-n, up to the simulation's own error
    assert ours >= 2.0 ** -seeds - 3 * math.sqrt(ours * (1 - ours) / 100_000)


def test_the_sign_test_is_the_exact_binomial_tail():
    assert sign_test(8, 8) == pytest.approx(2.0 ** -8)
    assert sign_test(6, 8) == pytest.approx(scipy_stats.binom.sf(5, 8, 0.5))
    assert row(claims_table([outcome(HURTS, (0.3, 0.25, 0.28, 0.31, 0.29))]), HURTS)[10] == \
        "5 of 5 (sign test p = 0.031)"


def test_a_repair_that_closes_part_of_the_gap_is_partial():
    effects = (0.578, 0.578, 0.498, 0.659, 0.367, 0.550, 0.568, 0.597)  # the regime study's shares of the gap
    o = outcome(REPAIRS, effects)
    assert o.verdict == "partial" and monotone_verdict(effects, 0.5, "above") == "inconclusive"
    cells = row(claims_table([o]), REPAIRS)
    assert cells[11] == f"**partial**: {np.mean(effects):+.3f} of the gap, paper +0.971"
    assert cells[6] == (f"{np.mean(effects) / REPAIRS.paper_effect.value:.2f} x the paper's; the paper's value: "
                        f"outside our interval (above it)")
    assert judge(REPAIRS, (0.1, 0.05, 0.12, 0.08, 0.11))[0] == "not reproduced"  # not even a quarter


def test_a_paper_lower_bound_is_reached_or_not():
    cell = magnitude_cell(outcome(BREAKS, (1.35, 3.69, 1.53, 1.75, 1.48)))
    assert cell.startswith("<= ") and cell.endswith("the paper's value: our interval lies below it")


def test_a_rule_fixed_after_some_seeds_ran_says_so():
    claim = dataclasses.replace(HURTS, changes=(RuleChange("2026-11-27", "r"),))
    days = {1234: "2026-11-26", 2345: "2026-11-26", 5678: "2026-11-27"}
    note = declared_note(outcome(claim, (0.1, 0.2, 0.1), (1234, 2345, 5678)), days)
    assert note == "; rule as of 2026-11-27: after seeds 1234, 2345 ran, and on the day seeds 5678 ran"
    assert declared_note(outcome(claim, (0.1, 0.2), (1234, 2345)), {1234: "2026-11-28", 2345: "2026-11-28"}) == ""


def test_a_verdict_whose_rule_came_after_all_its_seeds_is_exploratory():
    """Exploratory until a seed run on or after the rule's day judges it; the cards still count the verdict."""
    claim = dataclasses.replace(HURTS, changes=(RuleChange("2026-11-28", "r"),))
    effects, seeds = (0.1, 0.2, 0.1, 0.15, 0.12), (1, 2, 3, 4, 5)
    before = {s: "2026-11-27" for s in seeds}
    assert exploratory_note(outcome(claim, effects, seeds), before) == (
        "*exploratory*: its rule was set on 2026-11-28, after all 5 seeds it judges ran")
    assert exploratory_note(outcome(claim, effects, seeds), {**before, 5: "2026-11-28"}) == ""
    cells = row(claims_table([outcome(claim, effects, seeds)], before), claim)
    assert cells[-1].startswith("**reproduced**: *exploratory*")
    assert verdict_counts(f"| x | {cells[-1]} |") == {"reproduced": 1}


def test_the_log_law_is_told_from_a_linear_rise():
    s = np.linspace(1.25, 7.75, 14)
    in_log, in_s = log_or_linear(s, 1 + 0.3 * np.log(s))
    assert in_log == pytest.approx(1.0) and in_s < in_log
    in_log, in_s = log_or_linear(s, 1 + 0.1 * s)
    assert in_s == pytest.approx(1.0) and in_log < in_s
    assert scipy_stats.linregress(np.log(s), 1 + 0.1 * s).rvalue ** 2 == pytest.approx(in_log)
