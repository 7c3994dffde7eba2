"""HeadScale past L's claims on synthetic runs: its retrieval just past L on the difference scale (a seed that
retrieves none is a number, not an undefined log), its repair of NoPE at 4x, and paper 001's remark that a scale
applied only past L does not beat the best uniform lambda nor HeadScale at every position (non-inferiority, the
effect the mean over seeds of each seed's paired log-PPL difference, checked against numpy); every rule dated."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from nope_lightning.analysis.lengthgen.claims import evaluate_claim
from nope_lightning.analysis.rule_changes import exploratory_note
from nope_lightning.config.paper import CLAIMS_BY_ID, PPL_EFFECT
from tests.test_claims import RESAMPLES, SEEDS, base_nll, evaluation, noise

PAST, UNIFORM, HEADSCALE = "headscale past 4x", "nope lambda=best@4x", "headscale 4x"
KEEPS, BEATS = CLAIMS_BY_ID["headscale_past_keeps_retrieval"], CLAIMS_BY_ID["headscale_past_beats_nope_4x"]
NOT_BETTER = {UNIFORM: CLAIMS_BY_ID["headscale_past_no_better_than_uniform_4x"],
              HEADSCALE: CLAIMS_BY_ID["headscale_past_no_better_than_headscale_4x"]}


def answers(right: int) -> dict[int, list[bool]]:
    """100 L-token passkey prompts, the first ``right`` answered."""
    return {1: [True] * right + [False] * (100 - right)}


def past_runs(retrieved: tuple[int, ...], nope_retrieved: int = 95, drop: tuple[float, ...] = (0.5, 0.4, 0.6, 0.45, 0.55),
              failure: float = 1.0, seeds=SEEDS) -> dict:
    """NoPE and HeadScale past L: NoPE's NLL at 4x is its 1x NLL + ``failure`` nats, the method's 4x NLL is
    ``drop`` (per seed) below NoPE's, plus noise; of 100 L-token passkey prompts NoPE answers ``nope_retrieved``
    and the method ``retrieved`` (per seed)."""
    runs: dict = {"nope": {}, PAST: {}}
    for s, right, d in zip(seeds, retrieved, drop, strict=True):
        nll = base_nll(s)
        runs["nope"][s] = evaluation({1: nll, 4: nll + failure}, answers(nope_retrieved))
        runs[PAST][s] = evaluation({1: nll, 4: nll + failure - d + noise(s, 0.01)}, answers(right))
    return runs


def test_retrieval_just_past_l_is_the_difference_of_accuracies_on_l_token_prompts():
    assert (KEEPS.scale, KEEPS.inference, KEEPS.null, KEEPS.multiples, KEEPS.threshold) == (
        "raw", "non-inferiority", 0.0, (1,), -0.1)
    assert "just past L" in KEEPS.text and "answer tokens 2-6 decoded past L" in KEEPS.text
    assert KEEPS.rule == "effect > -0.1 (accuracy)" and KEEPS.presupposes_retrieval and KEEPS.signed
    retrieved = (93, 95, 90, 94, 92)
    kept = evaluate_claim(KEEPS, past_runs(retrieved), RESAMPLES)
    direct = (np.array(retrieved) - 95) / 100  # numpy: each seed's accuracy minus NoPE's on the same prompts
    assert kept.interval.per_seed == pytest.approx(direct)
    assert kept.across.estimate == pytest.approx(direct.mean())
    bound = direct.mean() - scipy_stats.t.ppf(0.95, 4) * scipy_stats.sem(direct)  # one-sided 95 %, df = 4
    assert bound > -0.1 and kept.across.low == pytest.approx(bound) and kept.verdict == "reproduced"
    # the difference holds a seed that retrieves none (the ratio's log scale could not)
    lost = evaluate_claim(KEEPS, past_runs((0, 50, 45, 42, 48)), RESAMPLES)
    assert lost.interval.per_seed == pytest.approx((np.array([0, 50, 45, 42, 48]) - 95) / 100)
    assert np.isfinite(lost.across.low) and lost.verdict == "not reproduced"
    assert evaluate_claim(KEEPS, past_runs((60, 95, 95, 95, 95)), RESAMPLES).verdict == "inconclusive"
    none = evaluate_claim(KEEPS, past_runs((10,) * 5, nope_retrieved=20), RESAMPLES)
    assert none.verdict == "untestable" and "nope retrieves 0.20 < 0.5" in none.reason


def test_the_relabelled_rule_is_dated_and_exploratory_on_the_seeds_seen_before_it():
    (change,) = KEEPS.changes
    assert (change.date, change.seen) == ("2026-11-28", True) and "just past L" in change.reason
    kept = evaluate_claim(KEEPS, past_runs((93, 95, 90, 94, 92)), RESAMPLES)
    assert "after all 5 seeds it judges ran" in exploratory_note(kept, {s: "2026-11-27" for s in SEEDS})
    assert "were seen" in exploratory_note(kept, {s: "2026-11-28" for s in SEEDS})  # seen: its own day is before it
    assert exploratory_note(kept, {s: "2026-11-29" for s in SEEDS}) == ""  # seeds run after it judge it


def test_headscale_past_beats_nope_at_4x_only_where_nope_fails():
    assert (BEATS.scale, BEATS.inference, BEATS.multiples) == ("raw", "superiority", (4, 4))
    better = evaluate_claim(BEATS, past_runs((95,) * 5), RESAMPLES)
    assert better.verdict == "reproduced"
    assert better.interval.per_seed == pytest.approx([d - noise(s, 0.01).mean() for s, d in
                                                      zip(SEEDS, (0.5, 0.4, 0.6, 0.45, 0.55), strict=True)], abs=1e-9)
    worse = evaluate_claim(BEATS, past_runs((95,) * 5, drop=(-0.1, -0.05, -0.08, -0.07, -0.06)), RESAMPLES)
    assert worse.verdict == "not reproduced"
    gentle = evaluate_claim(BEATS, past_runs((95,) * 5, failure=0.1), RESAMPLES)  # PPL x1.1 at 4x
    assert gentle.verdict == "untestable" and "no failure to repair" in gentle.reason


def comparison_runs(gap: tuple[float, ...], failure: float = 1.0) -> tuple[dict, dict[int, np.ndarray]]:
    """NoPE failing at 4x, the best uniform lambda and HeadScale at 4x, and HeadScale past L whose 4x NLL is
    ``gap`` (per seed) above both, with noise; and per seed the per-window NLLs of HeadScale past L at 4x."""
    runs: dict = {"nope": {}, UNIFORM: {}, HEADSCALE: {}, PAST: {}}
    past_nll = {}
    for s, g in zip(SEEDS, gap, strict=True):
        nll = base_nll(s)
        runs["nope"][s] = evaluation({1: nll, 4: nll + failure})
        repaired = nll + 0.5 * failure
        runs[UNIFORM][s] = runs[HEADSCALE][s] = evaluation({1: nll, 4: repaired})
        past_nll[s] = repaired + g + noise(s, 0.02)
        runs[PAST][s] = evaluation({1: nll, 4: past_nll[s]})
    return runs, past_nll


@pytest.mark.parametrize("other", [UNIFORM, HEADSCALE])
def test_a_scale_past_l_does_not_beat_scaling_every_position_as_the_paper_remarks(other):
    claim = NOT_BETTER[other]
    assert claim.methods == (PAST, other) and claim.multiples == (4, 4)
    assert (claim.scale, claim.inference, claim.side, claim.threshold) == ("raw", "non-inferiority", "above",
                                                                          pytest.approx(-PPL_EFFECT))
    gap = (0.10, 0.05, 0.12, 0.08, 0.02)
    runs, past_nll = comparison_runs(gap)
    outcome = evaluate_claim(claim, runs, RESAMPLES)
    other_nll = {s: base_nll(s) + 0.5 for s in SEEDS}
    # numpy: each seed's paired difference of mean NLL per target at 4x (every window scores the same count)
    direct = np.array([np.mean(past_nll[s] - other_nll[s]) for s in SEEDS])
    assert outcome.interval.per_seed == pytest.approx(direct, abs=1e-9)
    assert outcome.across.estimate == pytest.approx(direct.mean())  # the effect: the mean over seeds
    assert outcome.verdict == "reproduced"
    beaten = evaluate_claim(claim, comparison_runs((-0.2, -0.25, -0.15, -0.3, -0.22))[0], RESAMPLES)
    assert beaten.verdict == "not reproduced" and max(beaten.interval.per_seed) < -PPL_EFFECT
    gentle = evaluate_claim(claim, comparison_runs(gap, failure=0.1)[0], RESAMPLES)
    assert gentle.verdict == "untestable" and "no failure to repair" in gentle.reason
    (change,) = claim.changes
    assert (change.date, change.seen) == ("2026-11-28", True)
    assert "after all 5 seeds it judges ran" in exploratory_note(outcome, {s: "2026-11-27" for s in SEEDS})


def test_headscale_past_claims_are_not_measured_without_the_method():
    runs = comparison_runs((0.1,) * 5)[0]
    runs["nope"] = past_runs((95,) * 5)["nope"]  # with its passkey, which the retrieval claim's precondition reads
    del runs[PAST]
    for claim in (KEEPS, BEATS, *NOT_BETTER.values()):
        outcome = evaluate_claim(claim, runs, RESAMPLES)
        assert outcome.verdict == "not measured" and outcome.reason == f"no run of {PAST!r}"

