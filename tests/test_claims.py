"""Claim rules on synthetic runs: the effect present -> reproduced, absent -> not reproduced, noisy ->
inconclusive, a seed on the wrong side -> inconclusive, a precondition missing -> untestable; and the
paired statistics against a direct computation."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from nope_lightning.analysis.claims import Outcome, evaluate_claim, verdict
from nope_lightning.analysis.paper import CLAIMS_BY_ID, Claim
from nope_lightning.analysis.stats import Interval
from nope_lightning.analysis.tables import BIASED, BIASED_NOTE, claims_table, paired_table
from nope_lightning.results import Curve, EvaluationResult, ScaleSearchResult

L, S, WINDOWS = 128, 64, 400
RESAMPLES = 500


def windows(nll_per_target: dict[int, np.ndarray]) -> dict:
    """The ``windows`` section of an evaluate result: per multiple of L, (NLL sum, count) per window."""
    section = {"doc": [i // 40 for i in range(WINDOWS)], "end": list(range(WINDOWS))}
    section.update({str(m * L): np.stack([v * S, np.full(WINDOWS, float(S))], 1).tolist()
                    for m, v in nll_per_target.items()})
    return section


def evaluation(nll: dict[int, np.ndarray], passkey: dict[int, list[bool]] | None = None,
               table: list | None = None, octaves: tuple[np.ndarray, np.ndarray] | None = None,
               lengths: tuple[int, ...] = ()) -> EvaluationResult:
    """An evaluate result, read from the on-disk form written before results had a version (the legacy
    reader is what reads it)."""
    result = {"corpora": ["kjv"], "train_len": L, "setting": "test", "windows": {"kjv": windows(nll)},
              "lengths": list(lengths)}
    if passkey is not None:
        samples = [[m * L, 0.0, str(10000 + i), ok] for m, outcomes in passkey.items() for i, ok in enumerate(outcomes)]
        result["passkey"] = {"samples": samples, "by_length": {str(m * L): float(np.mean(o))
                                                               for m, o in passkey.items()}}
    if table is not None:
        result["temperature_table"] = table
    if octaves is not None:
        logppl, entropy = octaves  # (windows, 4) mean per octave [0,L), [L,2L), [2L,4L), [4L,8L)
        widths = np.array([L, L, 2 * L, 4 * L])
        result["position"] = {"octaves": [[0, L], [L, 2 * L], [2 * L, 4 * L], [4 * L, 8 * L]],
                              "octave_logppl": {"kjv": {"windows": (logppl * widths).tolist()}},
                              "octave_entropy": {"windows": (entropy * widths).tolist()}}
    return EvaluationResult.from_dict(result)


def base_nll(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(3.5, 0.6, WINDOWS)


def noise(seed: int, scale: float) -> np.ndarray:
    return np.random.default_rng(100 + seed).normal(0.0, scale, WINDOWS)


def hurt_runs(shift: float, scale: float = 0.005, seeds=(1, 2, 3), wrong_seed: int | None = None) -> dict:
    """nope and 'nope lambda=1.5' at 1x; lambda 1.5's NLL is nope's + ``shift`` (+ noise)."""
    runs = {"nope": {}, "nope lambda=1.5": {}}
    for s in seeds:
        nope = base_nll(s)
        delta = -shift if s == wrong_seed else shift
        runs["nope"][s] = evaluation({1: nope})
        runs["nope lambda=1.5"][s] = evaluation({1: nope + delta + noise(s, scale)})
    return runs


HURTS = CLAIMS_BY_ID["large_temperature_hurts_1x"]


def test_an_effect_well_past_the_threshold_is_reproduced():
    outcome = evaluate_claim(HURTS, hurt_runs(0.1), RESAMPLES)
    assert outcome.verdict == "reproduced"
    assert outcome.interval.estimate == pytest.approx(0.1, abs=0.002)
    assert outcome.interval.low > HURTS.threshold and outcome.on_side == 3


def test_the_opposite_effect_is_not_reproduced():
    outcome = evaluate_claim(HURTS, hurt_runs(-0.05), RESAMPLES)
    assert outcome.verdict == "not reproduced" and outcome.interval.high < HURTS.threshold


def test_an_effect_lost_in_noise_is_inconclusive():
    outcome = evaluate_claim(HURTS, hurt_runs(HURTS.threshold, scale=1.0), RESAMPLES)
    assert outcome.verdict == "inconclusive"
    assert outcome.interval.low < HURTS.threshold < outcome.interval.high


def test_one_seed_on_the_wrong_side_makes_a_clear_pooled_effect_inconclusive():
    outcome = evaluate_claim(HURTS, hurt_runs(0.2, wrong_seed=3), RESAMPLES)
    assert outcome.interval.low > HURTS.threshold  # the pooled mean (0.2 + 0.2 - 0.2) / 3 still clears it
    assert outcome.on_side == 2 and outcome.verdict == "inconclusive"


def test_paired_differences_are_what_is_bootstrapped():
    # The two methods' NLL differ by exactly 0.1 on every window although the windows vary a lot: the paired
    # interval is a point; an unpaired one would be wide.
    outcome = evaluate_claim(HURTS, hurt_runs(0.1, scale=0.0), RESAMPLES)
    assert outcome.interval.half_width < 1e-9


def test_equivalence_within_ten_percent():
    claim = CLAIMS_BY_ID["nope_matches_rope_in_distribution"]
    close = {"nope": {1: evaluation({1: base_nll(1)})}, "rope": {1: evaluation({1: base_nll(1) + 0.01 + noise(1, 0.01)})}}
    far = {"nope": {1: evaluation({1: base_nll(1)})}, "rope": {1: evaluation({1: base_nll(1) - 0.3})}}
    assert evaluate_claim(claim, close, RESAMPLES).verdict == "reproduced"
    assert evaluate_claim(claim, far, RESAMPLES).verdict == "not reproduced"


def test_gap_closed_is_the_share_of_the_one_to_two_x_rise():
    claim = CLAIMS_BY_ID["uniform_repairs_2x"]
    nope1 = base_nll(1)
    runs = {"nope": {1: evaluation({1: nope1, 2: nope1 + 0.3})},
            "nope lambda=best@2x": {1: evaluation({1: nope1 + 0.02, 2: nope1 + 0.1})}}
    outcome = evaluate_claim(claim, runs, RESAMPLES)
    assert outcome.interval.estimate == pytest.approx((0.3 - 0.1) / 0.3)
    assert outcome.verdict == "reproduced"
    runs["nope lambda=best@2x"][1] = evaluation({1: nope1, 2: nope1 + 0.25})  # closes 17 %
    assert evaluate_claim(claim, runs, RESAMPLES).verdict == "not reproduced"
    # Nothing to repair: NoPE does not degrade from 1x to 2x -> untestable, whatever lambda does.
    runs["nope"][1] = evaluation({1: nope1, 2: nope1 + noise(1, 0.01)})
    flat = evaluate_claim(claim, runs, RESAMPLES)
    assert flat.verdict == "untestable" and "does not rise" in flat.reason


def test_retrieval_claims_need_retrieval_in_distribution():
    claim = CLAIMS_BY_ID["nope_retrieves_past_L"]
    good = [True] * 80 + [False] * 20
    runs = {"nope": {1: evaluation({1: base_nll(1)}, {1: good, 2: [True] * 70 + [False] * 30})},
            "rope": {1: evaluation({1: base_nll(1)}, {1: good, 2: [True] * 20 + [False] * 80})}}
    outcome = evaluate_claim(claim, runs, RESAMPLES)
    assert outcome.verdict == "reproduced" and outcome.interval.estimate == pytest.approx(0.5)
    runs["rope"][1] = evaluation({1: base_nll(1)}, {1: [True] * 30 + [False] * 70, 2: [False] * 100})
    untestable = evaluate_claim(claim, runs, RESAMPLES)
    assert untestable.verdict == "untestable" and "rope retrieves 0.30 < 0.5" in untestable.reason


def test_an_ablation_that_converged_to_the_full_tables_is_untestable():
    claim = CLAIMS_BY_ID["no_init_loses_retrieval"]
    table = [[1.2, 1.3], [1.1, 1.0]]
    passkey = {1: [True] * 90 + [False] * 10}
    runs = {"headscale 4x": {1: evaluation({1: base_nll(1)}, passkey, table)},
            "headscale 4x w/o init": {1: evaluation({1: base_nll(1)}, {1: [False] * 100}, [[1.2, 1.3], [1.1, 1.005]])}}
    degenerate = evaluate_claim(claim, runs, RESAMPLES)
    assert degenerate.verdict == "untestable" and "degenerate" in degenerate.reason
    runs["headscale 4x w/o init"][1] = dataclasses.replace(runs["headscale 4x w/o init"][1],
                                                           temperature_table=[[1.0, 1.0], [1.0, 1.0]])
    assert evaluate_claim(claim, runs, RESAMPLES).verdict == "reproduced"


def test_entropy_correlation_over_the_nope_family():
    claim = CLAIMS_BY_ID["lower_entropy_lower_ppl"]
    rng = np.random.default_rng(0)
    runs = {}
    for i, method in enumerate(claim.methods[:5]):
        level = rng.normal(size=(WINDOWS, 4)) * 0.05
        entropy = 3.0 + 0.2 * i + level
        logppl = 3.5 + 0.1 * i + level  # lower entropy goes with lower log-PPL, method by method
        runs[method] = {1: evaluation({1: base_nll(1)}, octaves=(logppl, entropy))}
    outcome = evaluate_claim(claim, runs, RESAMPLES)
    assert outcome.interval.estimate == pytest.approx(1.0) and outcome.verdict == "reproduced"
    for i, method in enumerate(claim.methods[:5]):  # reversed: a distracted model is not what the claim says
        position = runs[method][1].position
        scaled = Curve([], [], [], (np.asarray(position.primary.windows) * (1 - 0.05 * i)).tolist())
        runs[method][1] = dataclasses.replace(runs[method][1], position=dataclasses.replace(
            position, octave_logppl={"kjv": scaled}))
    assert evaluate_claim(claim, runs, RESAMPLES).verdict == "not reproduced"


def search_summary(best_at: dict[int, float], grid=(0.8, 1.0, 1.2, 1.4, 1.6)) -> ScaleSearchResult:
    """A scale-search summary whose validation NLL is lowest at ``best_at[multiple]`` (a parabola in lambda)."""
    nll = base_nll(9)
    samples = {"doc": [i // 40 for i in range(WINDOWS)], "edges": [0, 128, 256],
               "windows": {str(m * L): [np.stack([(nll + (lam - best) ** 2) * S, np.full(WINDOWS, S)], 1).tolist()
                                        for lam in grid] for m, best in best_at.items()},
               "position": [np.zeros((8, 2)).tolist() for _ in grid]}
    return ScaleSearchResult.from_dict({"train_len": L, "best": {}, "trials": [{"lambda": lam} for lam in grid],
                                        "samples": samples})


def test_best_temperature_claims_read_the_search():
    above, rises = CLAIMS_BY_ID["best_temperature_above_one"], CLAIMS_BY_ID["best_temperature_rises"]
    runs = {"search_nope": {s: search_summary({2: 1.2, 8: 1.6}) for s in (1, 2)}}
    assert evaluate_claim(above, runs, RESAMPLES).interval.estimate == pytest.approx(1.2)
    assert evaluate_claim(above, runs, RESAMPLES).verdict == "reproduced"
    assert evaluate_claim(rises, runs, RESAMPLES).verdict == "reproduced"
    runs = {"search_nope": {s: search_summary({2: 1.0, 8: 0.8}) for s in (1, 2)}}
    assert evaluate_claim(above, runs, RESAMPLES).verdict == "not reproduced"
    assert evaluate_claim(rises, runs, RESAMPLES).verdict == "not reproduced"


def test_missing_runs_are_not_measured_not_a_verdict():
    outcome = evaluate_claim(HURTS, {"nope": {1: evaluation({1: base_nll(1)})}}, RESAMPLES)
    assert outcome.verdict == "not measured" and "nope lambda=1.5" in outcome.reason


@pytest.mark.parametrize(("side", "interval", "expected"), [
    ("above", Interval(0.5, 0.2, 0.8, per_seed=(0.4, 0.6)), "reproduced"),
    ("above", Interval(0.05, -0.1, 0.2, per_seed=(0.0, 0.1)), "inconclusive"),
    ("above", Interval(-0.2, -0.3, -0.1, per_seed=(-0.2,)), "not reproduced"),
    ("below", Interval(-0.2, -0.3, -0.1, per_seed=(-0.2,)), "reproduced"),
    ("within", Interval(0.01, -0.05, 0.06, per_seed=(0.01,)), "reproduced"),
    ("within", Interval(0.3, 0.2, 0.4, per_seed=(0.3,)), "not reproduced"),
    ("above", Interval(0.5, math.nan, math.nan, per_seed=(0.5,)), "inconclusive"),
    # a biased bootstrap: the interval excludes the effect but misses its own estimate, which is on the
    # claim's side -> the widened interval straddles the threshold
    ("above", Interval(0.12, -0.3, 0.05, per_seed=(0.12, 0.12)), "inconclusive"),
    ("above", Interval(-0.2, -0.1, 0.05, per_seed=(-0.2,)), "not reproduced"),
])
def test_verdict_table(side, interval, expected):
    claim = Claim("c", "", "", "log_ppl_difference", ("a", "b"), (1, 1), 0.1, side)
    assert verdict(claim, interval) == expected


def test_the_claims_table_signs_differences_but_not_levels():
    above = CLAIMS_BY_ID["best_temperature_above_one"]
    level = evaluate_claim(above, {"search_nope": {s: search_summary({2: 1.2, 8: 1.6}) for s in (1, 2)}}, RESAMPLES)
    difference = evaluate_claim(HURTS, hurt_runs(0.05), RESAMPLES)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in claims_table([level, difference]).splitlines()}
    assert "1.200 [" in rows[above.text] and "+1.200" not in rows[above.text]
    assert f"{difference.interval.estimate:+.3f} [" in rows[HURTS.text]
    assert difference.interval.estimate > 0


def test_an_interval_that_misses_its_estimate_is_marked_and_explained():
    biased = Outcome(HURTS, verdict(HURTS, Interval(-0.66, -0.59, -0.12, per_seed=(-0.2, -1.2, -0.6))),
                     Interval(-0.66, -0.59, -0.12, per_seed=(-0.2, -1.2, -0.6)), (1, 2, 3))
    table = claims_table([biased])
    assert "-0.660 [-0.590, -0.120]" + BIASED in table and BIASED_NOTE in table
    fine = evaluate_claim(HURTS, hurt_runs(0.05), RESAMPLES)
    assert BIASED not in claims_table([fine])


def test_the_paired_table_compares_every_method_with_nope_on_the_same_windows_and_prompts():
    runs: dict = {"nope": {}, "scaled": {}, "two seeds only": {}}
    for s in (1, 2, 3):
        nope = base_nll(s)
        keys = {1: [True] * 8 + [False] * 2, 2: [False] * 10}
        runs["nope"][s] = evaluation({1: nope, 2: nope + 0.3}, keys, lengths=(L, 2 * L))
        runs["scaled"][s] = evaluation({1: nope, 2: nope + 0.1 + noise(s, 0.05)},
                                       {1: keys[1], 2: [True] * 5 + [False] * 5}, lengths=(L, 2 * L))
        if s < 3:
            runs["two seeds only"][s] = evaluation({1: nope + 0.05, 2: nope + 0.3}, lengths=(L, 2 * L))
    table = paired_table(runs, RESAMPLES, "nope")
    header, _, *rows = [line for line in table.splitlines() if line.startswith("|")]
    assert header == "| method | Δ log-PPL 1x | Δ log-PPL 2x | Δ passkey 1x | Δ passkey 2x |"
    cells = {row.split(" | ")[0].lstrip("| "): row.rstrip(" |").split(" | ")[1:] for row in rows}
    assert set(cells) == {"scaled", "two seeds only"}  # the reference has no row of its own
    # the pooled estimate is the mean over seeds of the per-token NLL difference, computed directly here
    direct = np.mean([np.mean(0.1 + noise(s, 0.05) - 0.3) for s in (1, 2, 3)])
    assert cells["scaled"][0] == "+0.000 [+0.000, +0.000] (0/3)"
    assert cells["scaled"][1].startswith(f"{direct:+.3f} [") and cells["scaled"][1].endswith("(3/3)")
    assert cells["scaled"][2] == "+0.000 [+0.000, +0.000] (0/3)"
    assert cells["scaled"][3].startswith("+0.500 [") and cells["scaled"][3].endswith("(3/3)")
    low, high = map(float, cells["scaled"][3].split("[")[1].split("]")[0].split(", "))
    assert 0.1 < low < 0.5 < high < 0.9
    assert cells["two seeds only"][:2] == ["+0.050 [+0.050, +0.050] (0/2)", "+0.000 [+0.000, +0.000] (0/2)"]
    assert cells["two seeds only"][2:] == ["—", "—"]  # it ran no passkey
