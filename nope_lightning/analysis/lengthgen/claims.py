"""The claims (paper 001's ``paper.CLAIMS``, the hybrids' ``paper.HYBRID_CLAIMS``) tested on a pipeline's runs: per-seed effects (``claim_tests``), a
verdict about seeds that can go either way, and the evaluation-only interval beside it.

Each seed's effect is computed on that seed's own runs (paired: the compared methods scored on the same windows,
position windows or prompts), so it already carries that seed's evaluation noise. Three intervals come out:

- *across seeds* (``Outcome.across``): the mean of the per-seed effects with a Student t interval, df = n - 1.
  This is what the verdict reads: another seed is another trained model, and a claim about NoPE is a claim
  about what training gives, not about the n models we happened to train;
- *one new seed* (``Outcome.prediction``): mean +- t s sqrt(1 + 1/n), where one more seed's effect should fall;
- *evaluation only* (``Outcome.interval``): the pooled bootstrap over the seeds' evaluation units
  (``stats.per_seed_bootstrap``), the noise of the text the models are scored on, with the models held fixed.
  It is reported as its own column, never used for a verdict: it is narrow however far apart the seeds are.

Verdicts (``judge``) read the test each claim declares before any run (``paper.Claim``: its scale, one-sided
95 % or TOST at 90 %, its margin) through ``stats.monotone_verdict``, so that moving a seed's effect further onto
the claim's side never weakens it: *reproduced*, *not reproduced* or *inconclusive* (also when a seed's effect is
undefined). ``Outcome.across`` is then the 90 % t interval on the claim's scale (one-sided 95 % bounds; on the log
scale the geometric mean with its back-transformed bounds). One seed has no spread to estimate: it gets
``NO_SEED_VERDICT`` and still reports its effect with the evaluation interval. Before any of that: *untestable*
when a precondition fails (the claim means nothing here), *not measured* when the runs it needs are missing. A
claim that presupposes retrieval (``Claim.presupposes_retrieval``) leaves out the seeds whose NoPE did not learn
it (``retrieval_by_seed``); every other claim keeps them. ``Outcome``, ``NotMeasured`` and the two-sided
``verdict`` that paper 002's claims read are both papers' (``analysis/verdicts.py``).
"""

from __future__ import annotations

import math

import numpy as np

from nope_lightning.analysis.lengthgen.claim_tests import (
    TESTS,
    Evidence,
    Result,
    Runs,
    common_seeds,
    logppl_inflection,
    run_result,
)
from nope_lightning.analysis.lengthgen.inflection import inflected
from nope_lightning.analysis.verdicts import NO_SEED_VERDICT, NotMeasured, Outcome
from nope_lightning.config.paper import RETRIEVAL_LEARNED, Claim, Precondition
from nope_lightning.numerics.stats import (
    ONE_SIDED,
    Interval,
    monotone_verdict,
    per_seed_bootstrap,
    prediction_interval,
    t_interval,
)

# --- verdicts ----------------------------------------------------------------------------------------------


#: The fewest seeds a verdict is given on: the rule never penalises a stronger seed, so with n seeds "every seed on
#: the claim's side" is reproduced, a chance of at least 2^-n under no effect (``rule_size.null_size``: 12.5 % with
#: 3 seeds, 7.6 % with 4), above the test's 5 % until n = 5 (6.3 %, 2^-5 = 3.1 %).
MIN_VERDICT_SEEDS = 5


def few_seeds_verdict(seeds: int) -> str:
    """What a claim with 2 to ``MIN_VERDICT_SEEDS - 1`` seeds says instead of a verdict."""
    return f"{seeds} seeds: no verdict (fewer than {MIN_VERDICT_SEEDS})"


def on_scale(claim: Claim, effects: tuple[float, ...]) -> np.ndarray:
    """The per-seed ``effects`` on the scale ``claim``'s test reads (log scale: ln, -inf or NaN for a seed's effect
    <= 0, which the log scale cannot hold and which then fails the claim)."""
    values = np.asarray(effects, dtype=np.float64)
    if claim.scale != "log":
        return values
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(values)


def margin_on_scale(claim: Claim, margin: float) -> float:
    return math.log(margin) if claim.scale == "log" else margin


def back(claim: Claim, interval: Interval, effects: tuple[float, ...]) -> Interval:
    """An interval computed on the claim's scale, in the effect's own units (log scale: exponentiated)."""
    if claim.scale != "log":
        return interval
    return Interval(math.exp(interval.estimate), math.exp(interval.low), math.exp(interval.high), interval.level,
                    tuple(effects))


def judge(claim: Claim, effects: tuple[float, ...]) -> tuple[str, Interval]:
    """The verdict of ``claim``'s declared test on its per-seed ``effects`` (``stats.monotone_verdict``) and the
    interval that test reads: the two-sided ``2 ONE_SIDED - 1`` (90 %) t interval on the claim's scale, back on
    the effect's own units (log scale: the geometric mean and exponentiated bounds; NaN bounds when a seed's
    effect is <= 0, which the log scale cannot hold and which then fails the claim). *partial* when the claim
    declares a weaker margin (``Claim.partial``) that the test clears while the claim's own margin is not cleared.
    One seed: ``NO_SEED_VERDICT``; fewer than ``MIN_VERDICT_SEEDS``: ``few_seeds_verdict``."""
    level = 2 * ONE_SIDED - 1
    scaled = on_scale(claim, effects)
    across = (back(claim, t_interval(scaled, level), effects) if np.isfinite(scaled).all()
              else Interval(float(np.mean(effects)), math.nan, math.nan, level, tuple(effects)))
    if len(effects) < 2:
        return NO_SEED_VERDICT, across
    if len(effects) < MIN_VERDICT_SEEDS:
        return few_seeds_verdict(len(effects)), across
    found = monotone_verdict(scaled, margin_on_scale(claim, claim.threshold), claim.side)
    if found != "reproduced" and claim.partial is not None and monotone_verdict(
            scaled, margin_on_scale(claim, claim.partial), claim.side) == "reproduced":
        return "partial", across
    return found, across


def new_seed_interval(claim: Claim, effects: tuple[float, ...]) -> Interval:
    """The 95 % prediction interval for one new seed's effect on the claim's scale, in the effect's units (log
    scale: exponentiated, a geometric interval; NaN bounds when a seed's effect is <= 0)."""
    scaled = on_scale(claim, effects)
    if not np.isfinite(scaled).all():
        return Interval(float(np.mean(effects)), math.nan, math.nan, per_seed=tuple(effects))
    return back(claim, prediction_interval(scaled), effects)


def measure(test: str, claim: Claim, runs: Runs, resamples: int, seed: int = 0) -> tuple[Interval, tuple]:
    """The evaluation-only interval of ``test`` applied to ``claim``'s methods and multiples (pooled bootstrap;
    ``per_seed``: each seed's effect), and the seeds used. A test without resampling units gets NaN bounds."""
    return summarise(TESTS[test](claim, runs), resamples, seed)


def summarise(evidence: Evidence, resamples: int, seed: int = 0) -> tuple[Interval, tuple]:
    """``measure`` of a test's ``evidence``."""
    if not evidence.tables:
        values = tuple(float(v) for v in evidence.values)
        return Interval(float(np.mean(values)), math.nan, math.nan, per_seed=values), evidence.seeds
    pooled, _ = per_seed_bootstrap(list(evidence.tables), evidence.statistic, resamples, seed)
    return pooled, evidence.seeds


# --- preconditions -------------------------------------------------------------------------------------------


def _passkey_problem(condition: Precondition, runs: Runs) -> str:
    for method in condition.methods:
        accuracies, inside = [], []
        for seed in common_seeds(runs, (method,)):
            result = run_result(runs, method, seed)
            accuracy = inside_accuracy(result) if condition.inside_L else None
            inside.append(accuracy is not None)
            if accuracy is None and result.passkey:
                accuracy = result.passkey.by_length.get(condition.multiple * result.train_len)
            if accuracy is None:
                raise NotMeasured(f"no passkey of {method!r} at {condition.multiple}x L")
            accuracies.append(accuracy)
        if np.mean(accuracies) < condition.value:
            where = ("answered inside L" if all(inside) else f"at {condition.multiple}x L" if not any(inside)
                     else f"answered inside L, or at {condition.multiple}x L where no prompt is")
            return (f"{method} retrieves {np.mean(accuracies):.2f} < {condition.value:g} of its passkeys {where} ("
                    + " / ".join(f"{a:.2f}" for a in accuracies) + " per seed)")
    return ""


def _tables_problem(condition: Precondition, runs: Runs) -> str:
    m0, m1 = condition.methods
    for seed in common_seeds(runs, condition.methods):
        tables = [np.asarray(np.nan if (t := run_result(runs, m, seed).temperature_table) is None else t)
                  for m in (m0, m1)]
        gap = float(np.nanmax(np.abs(tables[0] - tables[1]))) if tables[0].shape == tables[1].shape else math.inf
        if not gap >= condition.value:
            return (f"{m1}'s temperature table is within {condition.value:g} of {m0}'s (max difference "
                    f"{gap:.4f}" + (f", seed {seed}" if seed is not None else "") + "): the ablated part changed nothing here")
    return ""


def _ratio_problem(condition: Precondition, runs: Runs, resamples: int) -> str:
    method, multiple = condition.methods[0], condition.multiple
    probe = Claim("failure", "", "", "log_ppl_difference", (method, method), (multiple, 1))
    interval, _ = measure("log_ppl_difference", probe, runs, resamples)
    ratio = math.exp(interval.estimate)
    if ratio >= condition.value:
        return ""
    return (f"no failure to repair: {method}'s PPL({multiple}L) / PPL(L) is {ratio:.2f} < {condition.value:g} ("
            + " / ".join(f"{math.exp(e):.2f}" for e in interval.per_seed) + " per seed)")


def _inflection_problem(condition: Precondition, runs: Runs) -> str:
    for method in condition.methods:
        for seed in common_seeds(runs, (method,)):
            position, edges, train_len = logppl_inflection(runs, method, seed)
            if not inflected(position, edges, train_len):
                return (f"{method}'s per-position log-PPL does not inflect inside its curve (to "
                        f"{edges[-1] / train_len:g}L" + (f", seed {seed}" if seed is not None else "")
                        + "): there is no failure to locate")
    return ""


def retrieval_by_seed(runs: Runs, method: str = "nope") -> dict[int | None, float]:
    """Per seed, ``method``'s passkey accuracy over the prompts whose answer lies wholly inside L (prompt length
    + answer tokens <= L); seeds without such prompts (or without a passkey) are absent."""
    return {seed: accuracy for seed, result in runs.get(method, {}).items()
            if (accuracy := inside_accuracy(result)) is not None}


def inside_accuracy(result: Result) -> float | None:
    """An evaluation's passkey accuracy over its prompts answered wholly inside L (prompt length + answer tokens
    <= L), or None when it has none (or no passkey)."""
    passkey = getattr(result, "passkey", None)
    inside = [s.correct for s in (passkey.samples if passkey else ())
              if s.key_tokens is not None and s.length + s.key_tokens <= result.train_len]
    return float(np.mean(inside)) if inside else None


def unlearned(runs: Runs) -> tuple[tuple[int | None, float], ...]:
    """(seed, accuracy) of the seeds whose NoPE retrieves < ``RETRIEVAL_LEARNED`` of its passkeys inside L."""
    return tuple((seed, a) for seed, a in retrieval_by_seed(runs).items() if a < RETRIEVAL_LEARNED)


def precondition_problem(condition: Precondition, runs: Runs, resamples: int) -> str:
    """Why ``condition`` fails, or '' when it holds."""
    if condition.kind == "passkey_at_least":
        return _passkey_problem(condition, runs)
    if condition.kind == "tables_differ":
        return _tables_problem(condition, runs)
    if condition.kind == "ppl_ratio_at_least":
        return _ratio_problem(condition, runs, resamples)
    if condition.kind == "inflection_inside":
        return _inflection_problem(condition, runs)
    raise ValueError(f"unknown precondition {condition.kind!r}")


def evaluate_claim(claim: Claim, runs: Runs, resamples: int) -> Outcome:
    """The claim's outcome on ``runs`` (one matrix point: method -> seed -> results)."""
    excluded = unlearned(runs) if claim.presupposes_retrieval else ()
    if excluded:
        runs = {m: {s: r for s, r in by_seed.items() if s not in dict(excluded)} for m, by_seed in runs.items()}
    try:
        for condition in claim.preconditions:
            problem = precondition_problem(condition, runs, resamples)
            if problem:
                return Outcome(claim, condition.fails_as, reason=problem, excluded=excluded)
        evidence = TESTS[claim.test](claim, runs)
        interval, seeds = summarise(evidence, resamples)
    except NotMeasured as missing:
        reason = str(missing)
        if claim.conditional:
            reason += " (this claim is tested only where the file runs its methods)"
        return Outcome(claim, "not measured", reason=reason, excluded=excluded)
    found, across = judge(claim, interval.per_seed)
    return Outcome(claim, found, interval, seeds, across=across, prediction=new_seed_interval(claim, interval.per_seed),
                   excluded=excluded, aside=evidence.aside)
