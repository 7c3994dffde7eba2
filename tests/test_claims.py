"""Claim rules on synthetic runs. Verdicts are about seeds (a t interval of the per-seed effects): an effect in
every seed -> reproduced, in 3 of 5 with a large spread -> inconclusive, absent -> not reproduced, one seed -> no
verdict, nor do 2 to 4 seeds; a precondition missing -> untestable. The paper's own statements (inflections, Fig 5's heads, §4's
entropy) and the log law on synthetic curves, and the paired statistics against a direct computation."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from nope_lightning.analysis.lengthgen.claim_tests import head_rank, untuned_head_entropy
from nope_lightning.analysis.lengthgen.claims import evaluate_claim, judge, retrieval_by_seed
from nope_lightning.analysis.lengthgen.inflection import inflection
from nope_lightning.analysis.lengthgen.report_sections import claims_table, retrieval_line, retrieval_table
from nope_lightning.analysis.lengthgen.tables import paired_table
from nope_lightning.analysis.markdown import BIASED, BIASED_NOTE
from nope_lightning.analysis.rule_changes import changed_rules_section
from nope_lightning.analysis.verdicts import NO_SEED_VERDICT, NotMeasured, Outcome, verdict
from nope_lightning.config import pipeline as pipeline_config
from nope_lightning.config.claim_rules import RuleChange, claim_problem
from nope_lightning.config.core import load_config
from nope_lightning.config.paper import CLAIMS_BY_ID, Claim, Precondition
from nope_lightning.config.pipeline import PipelineConfig, PipelineStep
from nope_lightning.numerics.stats import Interval, t_interval
from nope_lightning.results import EvaluationResult, HeadScaleResult, ScaleSearchResult

L, S, WINDOWS = 128, 64, 400
RESAMPLES = 500
SEEDS = (1, 2, 3, 4, 5)  # the fewest a verdict is given on (claims.MIN_VERDICT_SEEDS)
EDGES = list(range(0, 8 * L + 1, L // 4))  # 32 buckets of L/4 over windows of 8L, as the small study measures


def windows(nll_per_target: dict[int, np.ndarray]) -> dict:
    """The ``windows`` section of an evaluate result: per multiple of L, (NLL sum, count) per window."""
    section = {"doc": [i // 40 for i in range(WINDOWS)], "end": list(range(WINDOWS))}
    section.update({str(m * L): np.stack([v * S, np.full(WINDOWS, float(S))], 1).tolist()
                    for m, v in nll_per_target.items()})
    return section


def evaluation(nll: dict[int, np.ndarray], passkey: dict[int, list[bool]] | None = None,
               table: list | None = None, octaves: tuple[np.ndarray, np.ndarray] | None = None,
               lengths: tuple[int, ...] = (), curves: tuple[np.ndarray, np.ndarray] | None = None) -> EvaluationResult:
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
    if curves is not None:  # (windows, 32) per-token means over the buckets EDGES -> per-window bucket sums
        logppl, entropy = curves
        widths = np.diff(EDGES)
        result["position"] = {"edges": EDGES, "octaves": [[0, L]], "octave_logppl": {"kjv": {"windows": []}},
                              "logppl": {"kjv": {"windows": (logppl * widths).tolist()}},
                              "entropy": {"windows": (entropy * widths).tolist()}}
    return EvaluationResult.from_dict(result)


def base_nll(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(3.5, 0.6, WINDOWS)


def noise(seed: int, scale: float) -> np.ndarray:
    return np.random.default_rng(100 + seed).normal(0.0, scale, WINDOWS)


def hurt_runs(shift: float | tuple[float, ...], scale: float = 0.005, seeds=(1, 2, 3)) -> dict:
    """nope and 'nope lambda=1.5' at 1x; lambda 1.5's NLL is nope's + ``shift`` (one per seed, or the same for
    all) + noise."""
    shifts = shift if isinstance(shift, tuple) else (shift,) * len(seeds)
    runs = {"nope": {}, "nope lambda=1.5": {}}
    for s, delta in zip(seeds, shifts, strict=True):
        nope = base_nll(s)
        runs["nope"][s] = evaluation({1: nope})
        runs["nope lambda=1.5"][s] = evaluation({1: nope + delta + noise(s, scale)})
    return runs


HURTS = CLAIMS_BY_ID["large_temperature_hurts_1x"]


# --- verdicts about seeds ------------------------------------------------------------------------------------


def test_an_effect_in_every_seed_is_reproduced():
    shifts = (0.10, 0.12, 0.09, 0.11, 0.10)
    outcome = evaluate_claim(HURTS, hurt_runs(shifts, seeds=SEEDS), RESAMPLES)
    assert outcome.verdict == "reproduced" and outcome.on_side == 5
    per_seed = outcome.interval.per_seed
    assert per_seed == pytest.approx([d + noise(s, 0.005).mean() for s, d in zip(SEEDS, shifts, strict=True)],
                                     abs=1e-9)
    # the verdict reads the one-sided 95 % bounds of the per-seed effects (df = 4): the 90 % t interval, by scipy
    low, high = scipy_stats.t.interval(0.90, 4, loc=np.mean(per_seed), scale=scipy_stats.sem(per_seed))
    assert (outcome.across.low, outcome.across.high) == pytest.approx((low, high))
    assert outcome.across.low > HURTS.threshold


def test_an_effect_in_three_seeds_of_five_with_a_large_spread_is_inconclusive():
    outcome = evaluate_claim(HURTS, hurt_runs((0.30, 0.25, -0.30, 0.30, -0.25), seeds=SEEDS), RESAMPLES)
    assert outcome.on_side == 3 and outcome.verdict == "inconclusive"
    assert outcome.across.low < HURTS.threshold < outcome.across.high
    # the evaluation-only interval alone would have cleared the threshold: it holds the models fixed
    assert outcome.interval.low > HURTS.threshold


def test_an_absent_effect_is_not_reproduced():
    outcome = evaluate_claim(HURTS, hurt_runs((-0.05, -0.04, -0.06, -0.05, -0.04), seeds=SEEDS), RESAMPLES)
    assert outcome.verdict == "not reproduced" and outcome.across.high <= HURTS.threshold


def test_an_effect_lost_in_evaluation_noise_is_inconclusive():
    outcome = evaluate_claim(HURTS, hurt_runs(HURTS.threshold, scale=1.0, seeds=SEEDS), RESAMPLES)
    assert outcome.verdict == "inconclusive"


def test_one_seed_reports_its_effect_with_its_evaluation_interval_and_no_verdict():
    outcome = evaluate_claim(HURTS, hurt_runs(0.1, seeds=(1,)), RESAMPLES)
    assert outcome.verdict == NO_SEED_VERDICT == "1 seed: no verdict about seeds"
    assert outcome.interval.low < 0.1 < outcome.interval.high  # the evaluation interval is still there
    assert math.isnan(outcome.across.low) and math.isnan(outcome.prediction.low)
    row = next(line for line in claims_table([outcome]).splitlines() if line.startswith(f"| {HURTS.text}"))
    cells = row.strip("| ").split(" | ")
    assert cells[5] == f"{outcome.interval.estimate:+.3f} nats (1 seed)" and cells[7] == cells[8] == "—"
    assert cells[9].startswith(f"{outcome.interval.estimate:+.3f} [") and cells[11] == f"**{NO_SEED_VERDICT}**"


def test_the_prediction_interval_for_a_new_seed():
    outcome = evaluate_claim(HURTS, hurt_runs((0.10, 0.20, 0.15)), RESAMPLES)
    x = np.asarray(outcome.interval.per_seed)
    direct = scipy_stats.t.interval(0.95, 2, loc=x.mean(), scale=x.std(ddof=1) * math.sqrt(1 + 1 / 3))
    assert (outcome.prediction.low, outcome.prediction.high) == pytest.approx(direct)
    assert outcome.prediction.low < outcome.across.low  # wider than the mean's interval


@pytest.mark.parametrize(("side", "per_seed", "expected"), [
    ("above", (0.50, 0.45, 0.55), "reproduced"),
    ("above", (0.30, 0.25, -0.30), "inconclusive"),
    ("above", (-0.20, -0.25, -0.15), "not reproduced"),
    ("below", (-0.20, -0.25, -0.15), "reproduced"),
    ("within", (0.01, -0.02, 0.00), "reproduced"),
    ("within", (0.30, 0.35, 0.32), "not reproduced"),
    ("above", (0.5, math.nan, 0.5), "inconclusive"),
    ("above", (0.5,), NO_SEED_VERDICT),
])
def test_verdict_table(side, per_seed, expected):
    claim = Claim("c", "", "", "log_ppl_difference", ("a", "b"), (1, 1), 0.1, side)
    assert verdict(claim, t_interval(per_seed)) == expected


def test_equivalence_within_ten_percent():
    claim = CLAIMS_BY_ID["nope_matches_rope_in_distribution"]
    close = {"nope": {s: evaluation({1: base_nll(s)}) for s in SEEDS},
             "rope": {s: evaluation({1: base_nll(s) + 0.01 + noise(s, 0.01)}) for s in SEEDS}}
    far = {"nope": close["nope"], "rope": {s: evaluation({1: base_nll(s) - 0.3 - 0.01 * s}) for s in SEEDS}}
    assert evaluate_claim(claim, close, RESAMPLES).verdict == "reproduced"
    assert evaluate_claim(claim, far, RESAMPLES).verdict == "not reproduced"


# --- repairs need a failure ----------------------------------------------------------------------------------


def test_gap_closed_is_the_share_of_the_one_to_two_x_rise_and_needs_a_failure():
    claim = CLAIMS_BY_ID["uniform_repairs_2x"]
    runs: dict = {"nope": {}, "nope lambda=best@2x": {}}
    rests = (0.10, 0.12, 0.08, 0.11, 0.09)
    for s, rest in zip(SEEDS, rests, strict=True):
        nope1 = base_nll(s)
        runs["nope"][s] = evaluation({1: nope1, 2: nope1 + 0.6})  # PPL x1.82 from 1x to 2x
        runs["nope lambda=best@2x"][s] = evaluation({1: nope1 + 0.02, 2: nope1 + rest})
    outcome = evaluate_claim(claim, runs, RESAMPLES)
    assert outcome.interval.per_seed == pytest.approx([(0.6 - r) / 0.6 for r in rests])
    assert outcome.verdict == "reproduced"
    # A gentle failure (PPL x1.31, the small study's): nothing a repair claim can be judged on.
    for s in SEEDS:
        runs["nope"][s] = evaluation({1: base_nll(s), 2: base_nll(s) + math.log(1.31)})
    gentle = evaluate_claim(claim, runs, RESAMPLES)
    assert gentle.verdict == "untestable" and "no failure to repair" in gentle.reason and "1.31 < 1.5" in gentle.reason


def test_retrieval_claims_need_retrieval_in_distribution():
    claim = CLAIMS_BY_ID["nope_retrieves_past_L"]
    good = [True] * 80 + [False] * 20
    runs: dict = {"nope": {}, "rope": {}}
    for s, hits in zip(SEEDS, (70, 65, 68, 72, 66), strict=True):
        runs["nope"][s] = evaluation({1: base_nll(s)}, {1: good, 2: [True] * hits + [False] * (100 - hits)})
        runs["rope"][s] = evaluation({1: base_nll(s)}, {1: good, 2: [True] * 20 + [False] * 80})
    outcome = evaluate_claim(claim, runs, RESAMPLES)
    assert outcome.verdict == "reproduced" and outcome.interval.per_seed == pytest.approx((0.5, 0.45, 0.48, 0.52, 0.46))
    runs["rope"] = {s: evaluation({1: base_nll(s)}, {1: [True] * 30 + [False] * 70, 2: [False] * 100})
                    for s in SEEDS}
    untestable = evaluate_claim(claim, runs, RESAMPLES)
    assert untestable.verdict == "untestable" and "rope retrieves 0.30 < 0.5" in untestable.reason


def passkey_by_position(share: dict[int, float]) -> EvaluationResult:
    """An evaluation with 100 prompts of each length in ``share`` (tokens, 6-token answers) right that share of the
    time, and NoPE-like perplexity at 1x."""
    samples = [[n, 0.0, str(10000 + i), i < round(100 * a)] for n, a in share.items() for i in range(100)]
    return dataclasses.replace(evaluation({1: base_nll(1)}), passkey=EvaluationResult.from_dict({
        "corpora": ["kjv"], "train_len": L, "passkey": {"samples": samples, "key_tokens": [6] * len(samples),
                                                        "by_length": {str(n): a for n, a in share.items()}}}).passkey)


def test_fig6_reads_both_models_retrieval_on_the_prompts_answered_inside_L():
    """An L-token prompt decodes its answer past L: RoPE that retrieves inside L (122 tokens + 6) but not at L
    passes the precondition under the rule of 2026-11-29; without prompts answered inside L it reads L-token ones."""
    claim = CLAIMS_BY_ID["nope_retrieves_past_L"]
    assert claim.changes[-1].date == "2026-11-29" and claim.changes[-1].seen
    runs = {"nope": {s: passkey_by_position({L - 6: 1.0, L: 0.95, 2 * L: 0.6 + 0.01 * s}) for s in SEEDS},
            "rope": {s: passkey_by_position({L - 6: 0.98, L: 0.3, 2 * L: 0.1}) for s in SEEDS}}
    outcome = evaluate_claim(claim, runs, RESAMPLES)
    assert outcome.verdict == "reproduced"
    assert outcome.interval.per_seed == pytest.approx([0.5 + 0.01 * s for s in SEEDS])
    runs["rope"] = {s: passkey_by_position({L - 6: 0.4, L: 0.3, 2 * L: 0.1}) for s in SEEDS}
    failed = evaluate_claim(claim, runs, RESAMPLES)
    assert failed.verdict == "untestable"
    assert "rope retrieves 0.40 < 0.5 of its passkeys answered inside L (0.40 / 0.40" in failed.reason
    runs["rope"] = {s: passkey_by_position({L: 0.3, 2 * L: 0.1}) for s in SEEDS}  # no prompt inside L: L-token ones
    assert "rope retrieves 0.30 < 0.5 of its passkeys at 1x L" in evaluate_claim(claim, runs, RESAMPLES).reason
    with pytest.raises(ValueError, match="only passkey_at_least at 1x"):
        Precondition("passkey_at_least", ("rope",), 0.5, 2, inside_L=True)


def test_an_ablation_that_converged_to_the_full_table_is_no_effect_here():
    claim = CLAIMS_BY_ID["no_init_loses_retrieval"]
    table = [[1.2, 1.3], [1.1, 1.0]]
    passkey = {1: [True] * 90 + [False] * 10}
    runs = {"headscale 4x": {1: evaluation({1: base_nll(1)}, passkey, table)},
            "headscale 4x w/o init": {1: evaluation({1: base_nll(1)}, {1: [False] * 100}, [[1.2, 1.3], [1.1, 1.005]])}}
    degenerate = evaluate_claim(claim, runs, RESAMPLES)
    assert degenerate.verdict == "no effect of init here" and "changed nothing" in degenerate.reason
    constraint = evaluate_claim(CLAIMS_BY_ID["no_constraint_loses_retrieval"],
                                {"headscale 4x": runs["headscale 4x"],
                                 "headscale 4x w/o constraint": runs["headscale 4x w/o init"]}, RESAMPLES)
    assert constraint.verdict == "no effect of the constraint here"
    runs["headscale 4x w/o init"][1] = dataclasses.replace(runs["headscale 4x w/o init"][1],
                                                           temperature_table=[[1.0, 1.0], [1.0, 1.0]])
    tested = evaluate_claim(claim, runs, RESAMPLES)
    assert tested.verdict == NO_SEED_VERDICT and tested.interval.estimate == pytest.approx(0.9)


# --- inflections (Fig 1-2) -----------------------------------------------------------------------------------


def step_curve(at: float | None, seed: int, level: float = 3.0, rise: float = 1.0, scale: float = 0.02) -> np.ndarray:
    """(WINDOWS, 32) per-token means over EDGES: ``level`` (higher over the first L/4: little context), plus
    ``rise`` from position ``at`` x L on (None: flat), plus per-window noise."""
    starts = np.asarray(EDGES[:-1])
    mean = level + 0.8 * (starts < L // 4) + (0.0 if at is None else rise * (starts >= at * L))
    return mean + np.random.default_rng(seed).normal(0.0, scale, (WINDOWS, len(starts)))


def curve_run(ppl_at: float | None, entropy_at: float | None, seed: int) -> EvaluationResult:
    return evaluation({1: base_nll(seed)}, curves=(step_curve(ppl_at, seed), step_curve(entropy_at, 50 + seed)))


def test_an_inflection_is_where_the_curve_leaves_its_in_distribution_level_for_good():
    starts = np.asarray(EDGES[:-1])
    flat = np.full(len(starts), 3.0)
    assert inflection(flat, EDGES, L, 0.1)[0] == 8.0  # none inside the curve: its end, a lower bound
    assert inflection(flat + (starts >= 2.5 * L), EDGES, L, 0.1)[0] == 2.5
    early = flat + 2.0 * (starts < L // 2)  # the short-context start inside L is not a failure
    assert inflection(early, EDGES, L, 0.1)[0] == 8.0
    blip = flat.copy()
    blip[starts == 1.5 * L] += 1.0  # one bucket above, then back: no inflection there
    assert inflection(blip + (starts >= 3 * L), EDGES, L, 0.1)[0] == 3.0
    small = flat + 0.05 * (starts >= 2 * L)  # a rise below the threshold
    assert inflection(small, EDGES, L, 0.1)[0] == 8.0
    both = inflection(np.stack([flat, flat + (starts >= 2 * L)]), EDGES, L, 0.1)  # many curves at once
    assert both.tolist() == [8.0, 2.0]


def test_an_entropy_inflection_is_where_the_curve_leaves_its_in_distribution_trend():
    """Entropy grows with the number of keys: a curve that keeps its in-distribution slope in ln(position) has no
    inflection (against a level it would "inflect" at L), one that departs from it at 2L does, and several curves
    with their own trends are placed at once."""
    starts, ends = np.asarray(EDGES[:-1], dtype=float), np.asarray(EDGES[1:], dtype=float)
    centre = np.log((starts + ends) / 2)
    growing = 1.0 + 0.6 * centre  # diffuse attention's ln i growth, as inside L
    assert inflection(growing, EDGES, L, 0.1)[0] == 1.0  # the level rule: at L, whatever the model does
    assert inflection(growing, EDGES, L, 0.1, trend=True)[0] == 8.0
    departs = growing + 0.5 * (starts >= 2 * L)
    assert inflection(departs, EDGES, L, 0.1, trend=True)[0] == 2.0
    steeper = growing + 0.4 * np.clip(centre - np.log(1.5 * L), 0, None)  # a bend at 1.5L, rising for good
    placed = inflection(np.stack([departs, steeper, 2.0 * growing]), EDGES, L, 0.1, trend=True)
    # the bend crosses 0.1 nats once 0.4 ln(x / 1.5L) > 0.1: x > 1.5L e^0.25, the first bucket past 1.93 L
    first = starts[(starts >= L) & (0.4 * (np.log((starts + ends) / 2) - np.log(1.5 * L)) > 0.1)][0] / L
    assert placed.tolist() == [2.0, first, 8.0]


def test_entropy_and_perplexity_inflect_together():
    claim = CLAIMS_BY_ID["inflections_coincide"]
    together = {"nope": {s: curve_run(2.0, 2.0, s) for s in SEEDS}}
    outcome = evaluate_claim(claim, together, RESAMPLES)
    assert outcome.interval.per_seed == (0.0,) * 5 and outcome.verdict == "reproduced"
    apart = {"nope": {s: curve_run(2.0, 4.0, s) for s in SEEDS}}
    outcome = evaluate_claim(claim, apart, RESAMPLES)
    assert outcome.interval.per_seed == (2.0,) * 5 and outcome.verdict == "not reproduced"
    flat = {"nope": {s: curve_run(None, 2.0, s) for s in SEEDS}}  # no failure: nothing to locate
    outcome = evaluate_claim(claim, flat, RESAMPLES)
    assert outcome.verdict == "untestable" and "does not inflect" in outcome.reason


def test_ntk_is_flat_in_both_only_where_the_file_runs_it():
    claim = CLAIMS_BY_ID["ntk_flat_in_both"]
    flat = evaluate_claim(claim, {"rope+ntk": {s: curve_run(None, None, s) for s in SEEDS}}, RESAMPLES)
    assert flat.interval.per_seed == (8.0,) * 5 and flat.verdict == "reproduced"
    rising = evaluate_claim(claim, {"rope+ntk": {s: curve_run(4.0, 1.5, s) for s in SEEDS}}, RESAMPLES)
    assert rising.interval.per_seed == (1.5,) * 5 and rising.verdict == "not reproduced"
    absent = evaluate_claim(claim, {"nope": {1: curve_run(2.0, 2.0, 1)}}, RESAMPLES)
    assert absent.verdict == "not measured" and "only where the file runs" in absent.reason
    # at load, a file without NTK may list it; a file must still run an ordinary claim's methods
    steps = [PipelineStep(id="eval_nope", stage="evaluate", label="nope")]
    assert PipelineConfig(name="x", steps=steps, claims=["ntk_flat_in_both"]).claims == ["ntk_flat_in_both"]
    with pytest.raises(ValueError, match="compares method 'rope'"):
        PipelineConfig(name="x", steps=steps, claims=["nope_degrades_later"])


def test_a_larger_temperature_moves_both_inflections_later():
    claim = CLAIMS_BY_ID["temperature_delays_inflections"]
    runs = {"nope": {s: curve_run(2.0, 1.75, s) for s in SEEDS},
            "nope lambda=1.5": {s: curve_run(4.0, 3.0, 10 + s) for s in SEEDS}}
    outcome = evaluate_claim(claim, runs, RESAMPLES)
    assert outcome.interval.per_seed == (1.25,) * 5 and outcome.verdict == "reproduced"  # min(2, 1.25)
    runs["nope lambda=1.5"] = {s: curve_run(4.0, 1.75, 10 + s) for s in SEEDS}  # entropy does not move
    outcome = evaluate_claim(claim, runs, RESAMPLES)
    assert outcome.interval.per_seed == (0.0,) * 5 and outcome.verdict == "not reproduced"


# --- HeadScale's heads (Fig 5) and entropy (§4) --------------------------------------------------------------


def headscale(table: list, entropy: list) -> HeadScaleResult:
    return HeadScaleResult("c", "f", L, 4 * L, "1/sqrt(d)", "lambda", "search", 1.2, "s", True, 1.0, 10, "text",
                           0.0, 1.0, "head_scale", table,
                           dataclasses.replace(_ENTROPY, per_head=entropy))


_ENTROPY = HeadScaleResult.parse({
    "checkpoint": "c", "model_fingerprint": "f", "train_len": L, "target_len": 4 * L, "units": "u",
    "init": {"mode": "search", "lambda": 1.2, "scale_search": "s"}, "constraint": True, "lambda_floor": 1.0,
    "steps": 1, "data_mix": {"mode": "text", "retrieval_fraction": 0.0}, "val_loss": 1.0, "head_scale": [[1.0]],
    "converged_entropy": {"unit": "nats", "per_head": [[1.0]], "positions": "last 1/8"}}).converged_entropy


def test_within_each_layer_lower_entropy_heads_learn_a_larger_lambda():
    claim = CLAIMS_BY_ID["low_entropy_heads_larger_lambda"]
    rng = np.random.default_rng(0)
    entropy = rng.uniform(1, 5, (3, 4))
    # across layers lambda rises with entropy (layer offsets), within each layer it falls: only "within" counts
    table = 3.0 - 0.3 * entropy + np.arange(3)[:, None] * 2.0
    # the verdict reads the untuned model's entropy (NoPE's evaluation over the last 1/8 of the tuning length);
    # the tuned model's (HeadScale's own, here ranked the other way) is the paper's view, shown aside
    untuned = {"nope": {s: untuned_run(entropy) for s in SEEDS}}
    runs = {"headscale_4x": {s: headscale((table + 0.01 * s).tolist(), (-entropy).tolist()) for s in SEEDS},
            **untuned}
    outcome = evaluate_claim(claim, runs, RESAMPLES)
    assert outcome.interval.per_seed == pytest.approx((-1.0,) * 5) and outcome.verdict == "reproduced"
    assert outcome.aside == pytest.approx((1.0,) * 5)
    assert math.isnan(outcome.interval.low)  # one table per seed: no evaluation units to resample
    shuffled = rng.permuted(table, axis=1)
    direct = np.mean([scipy_stats.spearmanr(e, t).statistic for e, t in zip(entropy, shuffled, strict=True)])
    assert head_rank(shuffled, entropy) == pytest.approx(direct)
    tied = np.array([[1.0, 1.0, 1.0, 1.0], *shuffled[1:]])  # a layer whose heads share one lambda has no rank
    assert head_rank(tied, entropy) == pytest.approx(np.mean([scipy_stats.spearmanr(e, t).statistic
                                                              for e, t in zip(entropy[1:], shuffled[1:], strict=True)]))
    runs = {"headscale_4x": {s: headscale((1.0 + 0.3 * entropy + 0.01 * s).tolist(), entropy.tolist())
                             for s in SEEDS}, **untuned}
    assert evaluate_claim(claim, runs, RESAMPLES).verdict == "not reproduced"


def untuned_run(entropy: np.ndarray, edges: tuple[int, ...] = (0, 3 * L, 3 * L + L // 2, 4 * L)) -> EvaluationResult:
    """NoPE's evaluation with per-head entropy ``entropy`` (n_layer, n_head) over [3.5L, 4L) and 9 nats elsewhere."""
    buckets = np.full((*entropy.shape, len(edges) - 1), 9.0)
    for i, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        if 3 * L + L // 2 <= a and b <= 4 * L:
            buckets[..., i] = entropy
    return EvaluationResult.from_dict({"corpora": ["kjv"], "train_len": L, "entropy": {
        "edges": list(edges), "unit": "nats", "per_head": buckets.tolist(), "mean": []}})


def test_the_untuned_entropy_is_the_tuning_lengths_last_eighth_or_not_measured():
    entropy = np.arange(12.0).reshape(3, 4)
    # two buckets tiling [3.5L, 4L) average by width: (3/4 of L/2 at e, 1/4 at e + 4) -> e + 1
    split = (0, 3 * L + L // 2, 3 * L + 7 * L // 8, 4 * L)
    result = EvaluationResult.from_dict({"corpora": ["kjv"], "train_len": L, "entropy": {
        "edges": list(split), "unit": "nats", "per_head": np.stack([entropy * 0 + 9, entropy, entropy + 4], -1).tolist(),
        "mean": []}})
    assert untuned_head_entropy(result, 4 * L) == pytest.approx(entropy + 1.0)
    with pytest.raises(NotMeasured, match="not measured in this bundle"):
        untuned_head_entropy(untuned_run(entropy, (0, 3 * L, 4 * L)), 4 * L)  # a bucket straddles 3.5L
    with pytest.raises(NotMeasured, match="not measured in this bundle"):
        untuned_head_entropy(EvaluationResult.from_dict({"corpora": ["kjv"], "train_len": L}), 4 * L)


def test_headscale_has_higher_entropy_and_lower_perplexity_than_uniform():
    claim = CLAIMS_BY_ID["headscale_higher_entropy_lower_ppl"]

    def run(logppl: float, entropy: float, seed: int) -> EvaluationResult:
        level = np.random.default_rng(seed).normal(size=(WINDOWS, 4)) * 0.05
        return evaluation({1: base_nll(seed)}, octaves=(logppl + level, entropy + level))

    runs = {"headscale 4x": {s: run(3.0, 2.3, s) for s in SEEDS},
            "nope lambda=best@4x": {s: run(3.2, 2.0, s) for s in SEEDS}}
    outcome = evaluate_claim(claim, runs, RESAMPLES)
    assert outcome.interval.per_seed == pytest.approx((0.2,) * 5) and outcome.verdict == "reproduced"
    runs["nope lambda=best@4x"] = {s: run(3.2, 2.5, s) for s in SEEDS}  # lower PPL but lower entropy
    outcome = evaluate_claim(claim, runs, RESAMPLES)
    assert outcome.interval.per_seed == pytest.approx((-0.2,) * 5) and outcome.verdict == "not reproduced"


# --- the uniform-scale search: best lambda and the log law ---------------------------------------------------


def search_summary(best_at: dict[int, float], grid=(0.8, 1.0, 1.2, 1.4, 1.6),
                   law=None, seed: int = 9) -> ScaleSearchResult:
    """A scale-search summary whose validation NLL is lowest at ``best_at[multiple]`` (a parabola in lambda), and
    whose per-position NLL over 16 buckets of 8L-long windows is lowest at ``law(s)`` (s = bucket centre / L)."""
    nll = base_nll(seed)
    edges = list(range(0, 8 * L + 1, L // 2))
    centres = (np.asarray(edges[:-1]) + np.asarray(edges[1:]) - 1) / 2
    best_pos = np.asarray([law(c / L) if law else 1.0 for c in centres])
    widths = np.diff(edges)
    jitter = np.random.default_rng(seed).normal(0, 0.01, (WINDOWS // 8, len(centres)))
    position = [((3.0 + (lam - best_pos) ** 2 + jitter) * widths).tolist() for lam in grid]
    samples = {"doc": [i // 40 for i in range(WINDOWS)], "edges": edges,
               "windows": {str(m * L): [np.stack([(nll + (lam - best) ** 2) * S, np.full(WINDOWS, S)], 1).tolist()
                                        for lam in grid] for m, best in best_at.items()},
               "position": position}
    return ScaleSearchResult.from_dict({"train_len": L, "best": {}, "trials": [{"lambda": lam} for lam in grid],
                                        "samples": samples})


def test_best_temperature_claims_read_each_seeds_own_search():
    above, rises = CLAIMS_BY_ID["best_temperature_above_one"], CLAIMS_BY_ID["best_temperature_rises"]
    # seed 2 searched another grid (same number of trials): its best is read on its own grid
    runs = {"search_nope": {1: search_summary({2: 1.2, 8: 1.6}),
                            2: search_summary({2: 1.3, 8: 1.7}, grid=(0.9, 1.1, 1.3, 1.5, 1.7)),
                            **{s: search_summary({2: 1.2, 8: 1.6}) for s in (3, 4, 5)}}}
    assert evaluate_claim(above, runs, RESAMPLES).interval.per_seed == pytest.approx((1.2, 1.3, 1.2, 1.2, 1.2))
    assert evaluate_claim(above, runs, RESAMPLES).verdict == "reproduced"
    assert evaluate_claim(rises, runs, RESAMPLES).verdict == "reproduced"
    runs = {"search_nope": {s: search_summary({2: 1.0, 8: 0.8 - 0.2 * (s == 2)}) for s in SEEDS}}
    assert evaluate_claim(above, runs, RESAMPLES).verdict == "not reproduced"
    assert evaluate_claim(rises, runs, RESAMPLES).verdict == "not reproduced"


GRID = tuple(np.round(np.arange(0.8, 2.01, 0.1), 2))


def test_the_log_law_is_detected_and_a_constant_lambda_is_not():
    claim = CLAIMS_BY_ID["log_law_slope"]
    law = {"search_nope": {s: search_summary({2: 1.2}, GRID, lambda x: 1 + 0.3 * math.log(x), s) for s in SEEDS}}
    outcome = evaluate_claim(claim, law, RESAMPLES)
    assert outcome.interval.estimate == pytest.approx(0.3, abs=0.03) and outcome.verdict == "reproduced"
    # a flat best lambda of 1.3: the fixed-intercept fit would call it a = 0.24 (R^2 < 0); its slope is 0
    flat = {"search_nope": {s: search_summary({2: 1.2}, GRID, lambda x: 1.3, s) for s in SEEDS}}
    outcome = evaluate_claim(claim, flat, RESAMPLES)
    assert outcome.interval.per_seed == pytest.approx((0.0,) * 5, abs=1e-12)
    assert outcome.verdict == "not reproduced" and outcome.interval.undefined == 0


def test_each_seeds_log_law_fit_uses_its_own_grid_and_data():
    claim = CLAIMS_BY_ID["log_law_slope"]
    # Seed 2 searched a grid twice as coarse (the same number of trials): read on seed 1's grid, its best lambdas
    # would be mapped to the wrong values and its slope halved.
    coarse = tuple(np.round(0.8 + 0.2 * np.arange(len(GRID)), 2))
    laws = {1: (GRID, lambda x: 1 + 0.3 * math.log(x)), 2: (coarse, lambda x: 1 + 0.6 * math.log(x))}
    runs = {"search_nope": {seed: search_summary({2: 1.2}, grid, law, seed) for seed, (grid, law) in laws.items()}}
    outcome = evaluate_claim(claim, runs, RESAMPLES)
    edges = np.arange(0, 8 * L + 1, L // 2)
    centres = (edges[:-1] + edges[1:] - 1) / 2
    s = centres[centres > L] / L
    direct = []
    for grid, law in laws.values():  # each seed's best lambda per bucket on its own grid, then scipy's slope
        best = np.asarray(grid)[np.argmin([[(g - law(x)) ** 2 for g in grid] for x in s], axis=1)]
        direct.append(scipy_stats.linregress(np.log(s), best).slope)
    assert outcome.interval.per_seed == pytest.approx(direct, abs=1e-9)
    assert direct[1] == pytest.approx(0.6, abs=0.05) and direct[0] == pytest.approx(0.3, abs=0.05)


def test_missing_runs_are_not_measured_not_a_verdict():
    outcome = evaluate_claim(HURTS, {"nope": {1: evaluation({1: base_nll(1)})}}, RESAMPLES)
    assert outcome.verdict == "not measured" and "nope lambda=1.5" in outcome.reason


# --- bad input: a claim reading a statistic the study does not produce ---------------------------------------


def test_a_claim_on_a_statistic_the_study_does_not_produce_fails_at_load_in_one_line(monkeypatch):
    steps = [PipelineStep(id="eval_nope", stage="evaluate", label="nope"),
             PipelineStep(id="eval_rope", stage="evaluate", label="rope", overrides=["passkey_keys=0"])]
    with pytest.raises(ValueError) as err:
        PipelineConfig(name="x", steps=steps, common=["passkey_keys=10"], claims=["nope_retrieves_past_L"])
    lines = str(err.value).splitlines()
    assert len(lines) == 2  # the test and the precondition both read rope's passkeys: one line each
    assert all("'eval_rope' sets passkey_keys=0: the study does not produce it" in line for line in lines)
    assert PipelineConfig(name="x", steps=steps[:1] + [PipelineStep(id="eval_rope", stage="evaluate", label="rope")],
                          claims=["nope_retrieves_past_L"]).claims
    odd = Claim("odd", "", "", "log_ppl_difference", ("nope", "rope"), (1, 1),
                preconditions=(Precondition("loss_spike_below", ("nope",)),))
    monkeypatch.setitem(pipeline_config.CLAIMS_BY_ID, "odd", odd)
    with pytest.raises(ValueError) as err:
        PipelineConfig(name="x", steps=steps, claims=["odd"])
    assert str(err.value).count("\n") == 0
    assert "precondition 'loss_spike_below' names a statistic the study does not produce" in str(err.value)


# --- the claims table ----------------------------------------------------------------------------------------


def test_the_claims_table_signs_differences_but_not_levels():
    above = CLAIMS_BY_ID["best_temperature_above_one"]
    level = evaluate_claim(above, {"search_nope": {s: search_summary({2: 1.2, 8: 1.6}) for s in (1, 2)}}, RESAMPLES)
    difference = evaluate_claim(HURTS, hurt_runs(0.05), RESAMPLES)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in claims_table([level, difference]).splitlines()}
    assert "1.200 [" in rows[above.text] and "+1.200" not in rows[above.text]
    assert f"{difference.across.estimate:+.3f} [" in rows[HURTS.text]
    assert difference.interval.estimate > 0


def test_the_claims_table_shows_seeds_a_new_seed_and_the_evaluation_interval_apart():
    outcome = evaluate_claim(HURTS, hurt_runs((0.10, 0.20, 0.15, 0.12, 0.18), seeds=SEEDS), RESAMPLES)
    table = claims_table([outcome])
    header = next(line for line in table.splitlines() if line.startswith("| claim"))
    assert header.strip("| ").split(" | ")[5:10] == ["ours: mean [90 % t across seeds]", "ours / the paper's",
                                                     "bound the verdict read",
                                                     "one new seed [95 % prediction, the claim's scale]",
                                                     "evaluation only [95 % pooled bootstrap]"]
    cells = next(line for line in table.splitlines() if line.startswith(f"| {HURTS.text}")).strip("| ").split(" | ")
    show = "{:+.3f}".format
    assert cells[2] == "one-sided t 95 % (superiority), raw scale"
    assert cells[4] == f"{show(math.log(19.0 / 14.6))} nats (ln(19.0 / 14.6), Table 2 PG19)"  # the paper's, our units
    assert cells[5].startswith(f"{show(outcome.across.estimate)} [{show(outcome.across.low)}, "
                               f"{show(outcome.across.high)}] nats (per seed: ")
    assert cells[8] == f"{show(outcome.prediction.estimate)} [{show(outcome.prediction.low)}, " \
                       f"{show(outcome.prediction.high)}]"
    assert cells[9] == f"{show(outcome.interval.estimate)} [{show(outcome.interval.low)}, {show(outcome.interval.high)}]"
    assert cells[10:] == ["5 of 5 (sign test p = 0.031)", "**reproduced**"]  # 2^-5


def test_undefined_resamples_are_counted_and_shown():
    claim = CLAIMS_BY_ID["uniform_repairs_2x"]
    shaky = Interval(0.4, 0.1, 0.7, per_seed=(0.4, 0.3, 0.5), undefined=37, resamples=500)
    outcome = Outcome(claim, "inconclusive", shaky, (1, 2, 3), across=t_interval(shaky.per_seed))
    assert "(37 of 500 resamples undefined, left out)" in claims_table([outcome])


def test_an_interval_that_misses_its_estimate_is_marked_and_explained():
    missed = Interval(-0.66, -0.59, -0.12, per_seed=(-0.2, -1.2, -0.6))
    biased = Outcome(HURTS, "inconclusive", missed, (1, 2, 3), across=t_interval(missed.per_seed))
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
    assert header == ("| method | Δ log-PPL 1x | Δ log-PPL 2x | Δ passkey 1x = 128 (answer after token 128: past L) "
                      "| Δ passkey 2x = 256 (answer after token 256: past L) |")  # no key token counts recorded
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


# --- the hybrids' claims -----------------------------------------------------------------------------------------


def test_a_hybrid_within_two_percent_of_rope_in_distribution_keeps_rope_s_perplexity():
    claim = CLAIMS_BY_ID["irope_keeps_rope_in_distribution"]
    runs: dict = {"irope": {}, "rope": {}}
    for s in SEEDS:
        runs["rope"][s] = evaluation({1: base_nll(s)})
        runs["irope"][s] = evaluation({1: base_nll(s) + 0.004 + noise(s, 0.002)})
    kept = evaluate_claim(claim, runs, RESAMPLES)
    assert kept.verdict == "reproduced" and kept.claim.rule == "|effect| <= 0.0198 nats"
    assert kept.interval.per_seed == pytest.approx([0.004 + noise(s, 0.002).mean() for s in SEEDS], abs=1e-9)
    runs["irope"] = {s: evaluation({1: base_nll(s) + 0.05 + noise(s, 0.002)}) for s in SEEDS}
    assert evaluate_claim(claim, runs, RESAMPLES).verdict == "not reproduced"  # 5 % worse than RoPE


def test_rnope_swa_flat_past_L_compares_its_own_8x_with_its_own_1x():
    claim = CLAIMS_BY_ID["rnope_swa_flat_past_L"]
    flat = {"rnope-swa": {s: evaluation({1: base_nll(s), 8: base_nll(s) + 0.03 + noise(s, 0.01)}) for s in SEEDS}}
    outcome = evaluate_claim(claim, flat, RESAMPLES)
    assert outcome.verdict == "reproduced"
    assert outcome.interval.per_seed == pytest.approx([0.03 + noise(s, 0.01).mean() for s in SEEDS], abs=1e-9)
    broken = {"rnope-swa": {s: evaluation({1: base_nll(s), 8: base_nll(s) + 0.4}) for s in SEEDS}}
    assert evaluate_claim(claim, broken, RESAMPLES).verdict == "not reproduced"  # PPL x1.5 at 8x


def test_a_hybrid_keeps_nope_s_retrieval_only_where_both_retrieve_in_distribution():
    claim = CLAIMS_BY_ID["irope_keeps_nope_retrieval"]
    assert claim.rule == "effect > -0.1 (accuracy)"
    inside = [True] * 90 + [False] * 10
    runs: dict = {"irope": {}, "nope": {}}
    for s, (hybrid, nope) in zip(SEEDS, ((60, 62), (55, 60), (58, 57), (60, 61), (59, 60)), strict=True):
        runs["irope"][s] = evaluation({1: base_nll(s)}, {1: inside, 2: [True] * hybrid + [False] * (100 - hybrid)})
        runs["nope"][s] = evaluation({1: base_nll(s)}, {1: inside, 2: [True] * nope + [False] * (100 - nope)})
    kept = evaluate_claim(claim, runs, RESAMPLES)
    assert kept.verdict == "reproduced" and kept.interval.per_seed == pytest.approx((-0.02, -0.05, 0.01, -0.01, -0.01))
    runs["irope"] = {s: evaluation({1: base_nll(s)}, {1: [True] * 40 + [False] * 60, 2: [False] * 100})
                     for s in SEEDS}
    lost = evaluate_claim(claim, runs, RESAMPLES)
    assert lost.verdict == "untestable" and "irope retrieves 0.40 < 0.5" in lost.reason


def test_the_hybrids_study_names_every_method_its_claims_compare():
    cfg = load_config(PipelineConfig, Path(__file__).parents[1] / "experiments/hybrids/hybrids.yaml")
    labels = {step.label or step.id for step in cfg.steps}
    assert {m for c in cfg.claims for m in CLAIMS_BY_ID[c].methods} <= labels
    assert cfg.reference == "nope" and cfg.more_references == ["rope"]
    with pytest.raises(ValueError, match="more_references: 'yarn' is no step's label"):
        load_config(PipelineConfig, Path(__file__).parents[1] / "experiments/hybrids/hybrids.yaml", ["more_references=[yarn]"])


def test_every_claim_declares_its_scale_test_and_margin_and_a_missing_one_fails_in_one_line():
    for claim in CLAIMS_BY_ID.values():
        assert claim_problem(claim) == "", claim.id
    # a PPL ratio is tested on the log scale; an equivalence claim by TOST; the rest one-sided
    assert CLAIMS_BY_ID["nope_breaks_past_L"].scale == "log"
    assert {c.inference for c in CLAIMS_BY_ID.values() if c.side == "within"} == {"equivalence"}
    bare = Claim("x", "", "", "log_ppl_difference", ("a", "b"), (1, 1), 0.1)
    assert claim_problem(bare) == ("claim 'x' declares no scale: scale='log' for a strictly positive multiplicative "
                                   "effect, else 'raw'")
    assert "declares no test" in claim_problem(dataclasses.replace(bare, scale="raw"))
    wrong = dataclasses.replace(bare, scale="raw", inference="superiority", threshold=-0.1)
    assert "wrong side of the null 0" in claim_problem(wrong)
    assert claim_problem(dataclasses.replace(wrong, inference="non-inferiority")) == ""
    assert "must be > 0" in claim_problem(dataclasses.replace(bare, scale="log", inference="superiority", threshold=0))
    assert "equivalence test is for a 'within' claim" in claim_problem(
        dataclasses.replace(bare, scale="raw", inference="equivalence"))


def test_the_breakdown_on_the_log_scale_is_reproduced_where_the_raw_t_interval_was_not():
    claim = CLAIMS_BY_ID["nope_breaks_past_L"]
    effects = (1.350, 3.692, 1.531, 1.750, 1.483, 2.007, 1.626, 1.786)  # the regime study's seeds, nats
    verdict_found, across = judge(claim, effects)
    logs = np.log(effects)
    low, high = np.exp(scipy_stats.t.interval(0.90, 7, loc=logs.mean(), scale=scipy_stats.sem(logs)))
    assert verdict_found == "reproduced" and (across.low, across.high) == pytest.approx((low, high))
    assert across.estimate == pytest.approx(np.exp(logs.mean()))  # the geometric mean
    assert judge(claim, (1.35, -0.2, 1.53, 1.75, 1.48))[0] == "inconclusive"  # a seed <= 0 cannot reproduce it
    assert math.isnan(judge(claim, (1.35, -0.2, 1.53, 1.75, 1.48))[1].low)


def passkey_run(inside: float, seed: int) -> EvaluationResult:
    """An evaluation whose 100 prompts at L - 6 tokens (6-token answers, inside L) are right a share ``inside``."""
    right = int(round(100 * inside))
    samples = [[L - 6, 0.0, str(10000 + i), i < right] for i in range(100)]
    return EvaluationResult.from_dict({"corpora": ["kjv"], "train_len": L, "passkey": {
        "samples": samples, "key_tokens": [6] * 100, "by_length": {str(L - 6): inside}}})


def test_a_seed_that_did_not_learn_retrieval_leaves_only_the_claims_that_presuppose_it():
    accuracy = {1: 1.0, 2: 0.18, 3: 0.97, 4: 0.0}
    runs = hurt_runs((0.10, 0.12, 0.09, 0.11), seeds=(1, 2, 3, 4))
    runs["nope"] = {s: dataclasses.replace(r, passkey=passkey_run(accuracy[s], s).passkey) for s, r in runs["nope"].items()}
    assert retrieval_by_seed(runs) == pytest.approx(accuracy)
    kept = evaluate_claim(HURTS, runs, RESAMPLES)  # presupposes nothing: every seed
    assert kept.seeds == (1, 2, 3, 4) and kept.excluded == ()
    retrieval = dataclasses.replace(HURTS, presupposes_retrieval=True)
    left = evaluate_claim(retrieval, runs, RESAMPLES)
    assert left.seeds == (1, 3) and left.excluded == ((2, 0.18), (4, 0.0))
    assert "left out, NoPE did not learn retrieval: seed 2 0.18, seed 4 0.00" in claims_table([left])
    assert retrieval_line(retrieval_by_seed(runs)).startswith("**Retrieval learned in 2 of 4 seeds**")


def test_the_retrieval_table_gives_each_method_seed_by_seed_with_its_t_interval_across_seeds():
    nope, lam = {3: 0.98, 1: 1.0, 2: 0.9}, {1: 0.2, 2: 0.9}  # lambda 1.5 ran on two of the three seeds
    runs = {"nope": {s: passkey_run(a, s) for s, a in nope.items()},  # seeds in the order run: columns sorted
            "lambda 1.5": {s: passkey_run(a, s) for s, a in lam.items()}}
    lines = retrieval_table(runs).splitlines()
    assert lines[2] == "| method | seed 1 | seed 2 | seed 3 | mean [95 % t across seeds] | seeds |"
    low, high = scipy_stats.t.interval(0.95, 2, loc=np.mean([1.0, 0.9, 0.98]), scale=scipy_stats.sem([1.0, 0.9, 0.98]))
    assert lines[4] == f"| nope | 1.00 | 0.90 | 0.98 | 0.96 [{max(low, 0):.2f}, {min(high, 1):.2f}] | 3 |"
    assert lines[5] == "| lambda 1.5 | 0.20 | 0.90 | — | 0.55 [0.00, 1.00] | 2 |"  # clipped to [0, 1]
    assert retrieval_table({"nope": {1: passkey_run(1.0, 1)}}) == ""  # one seed: no spread to show


def test_a_report_lists_the_rules_changed_on_or_after_its_run():
    old, new = RuleChange("2026-11-20", "old reason"), RuleChange("2026-11-26", "new reason")
    claims = [dataclasses.replace(HURTS, changes=(old, new)), dataclasses.replace(HURTS, id="other", changes=(new,))]
    section = changed_rules_section(claims, ["2026-11-26"])
    assert section.splitlines()[2:] == [f"* 2026-11-26: new reason ({HURTS.id}, other)"]
    assert changed_rules_section(claims, ["2026-11-27"]) == ""
    assert "2026-11-20: old reason" in changed_rules_section(claims, [])  # date unknown: every change
    inflection_rule = CLAIMS_BY_ID["inflections_coincide"].changes[0]
    assert inflection_rule.date == "2026-11-26" and "794a560" in inflection_rule.reason
