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
it (``retrieval_by_seed``); every other claim keeps them. ``verdict`` (the two-sided t interval against the
threshold) stays for paper 002's claims, which declare no test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nope_lightning.analysis.claim_tests import (
    TESTS,
    Evidence,
    NotMeasured,
    Runs,
    common_seeds,
    logppl_inflection,
    run_result,
)
from nope_lightning.analysis.inflection import inflected
from nope_lightning.config.paper import RETRIEVAL_LEARNED, Claim, Precondition
from nope_lightning.numerics.stats import (
    ONE_SIDED,
    Interval,
    monotone_verdict,
    per_seed_bootstrap,
    prediction_interval,
    t_interval,
)

#: What a one-seed run says instead of a verdict.
NO_SEED_VERDICT = "1 seed: no verdict about seeds"


@dataclass(frozen=True)
class Outcome:
    """A claim's result: the evaluation-only interval (``interval``, pooled bootstrap; ``interval.per_seed``:
    each seed's effect), the t interval across seeds its test reads (``across``) and the prediction interval for
    one new seed (``prediction``), both NaN-bounded with one seed; the verdict, and a reason when there is no
    effect (untestable, not measured); ``excluded``: (seed, NoPE's passkey accuracy inside L) of the seeds left
    out because their NoPE did not learn retrieval; ``aside``: per seed, the effect of the view the paper plotted
    where the verdict reads another (Fig 5: the tuned model's entropy)."""

    claim: Claim
    verdict: str
    interval: Interval | None = None
    seeds: tuple[int | None, ...] = ()
    reason: str = ""
    across: Interval | None = None
    prediction: Interval | None = None
    excluded: tuple[tuple[int | None, float], ...] = ()
    aside: tuple[float, ...] = ()

    @property
    def on_side(self) -> int:
        """How many seeds' own estimates lie on the claim's side of its threshold."""
        return sum(on_side(self.claim, e) for e in self.interval.per_seed) if self.interval else 0


# --- verdicts ----------------------------------------------------------------------------------------------


def on_side(claim: Claim, value: float) -> bool:
    if math.isnan(value):
        return False
    if claim.side == "within":
        return abs(value) <= claim.threshold
    return value > claim.threshold if claim.side == "above" else value < claim.threshold


def verdict(claim: Claim, across: Interval) -> str:
    """reproduced / not reproduced / inconclusive from the t interval across seeds ``across`` (``per_seed``: the
    seeds' effects); ``NO_SEED_VERDICT`` with fewer than two seeds."""
    if len(across.per_seed) < 2:
        return NO_SEED_VERDICT
    low, high, t = across.low, across.high, claim.threshold
    if math.isnan(low) or math.isnan(high):
        return "inconclusive"
    if claim.side == "within":
        clears, excludes = -t <= low and high <= t, high < -t or low > t
    elif claim.side == "above":
        clears, excludes = low > t, high <= t
    else:
        clears, excludes = high < t, low >= t
    return "reproduced" if clears else "not reproduced" if excludes else "inconclusive"


def judge(claim: Claim, effects: tuple[float, ...]) -> tuple[str, Interval]:
    """The verdict of ``claim``'s declared test on its per-seed ``effects`` (``stats.monotone_verdict``) and the
    interval that test reads: the two-sided ``2 ONE_SIDED - 1`` (90 %) t interval on the claim's scale, back on
    the effect's own units (log scale: the geometric mean and exponentiated bounds; NaN bounds when a seed's
    effect is <= 0, which the log scale cannot hold and which then fails the claim). One seed:
    ``NO_SEED_VERDICT``."""
    level = 2 * ONE_SIDED - 1
    if claim.scale != "log":
        across = t_interval(effects, level)
        if len(effects) < 2:
            return NO_SEED_VERDICT, across
        return monotone_verdict(effects, claim.threshold, claim.side), across
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(np.asarray(effects, dtype=np.float64))
    finite = bool(np.isfinite(logs).all())
    scaled = t_interval(logs if finite else np.zeros_like(logs), level)
    across = Interval(math.exp(scaled.estimate), math.exp(scaled.low), math.exp(scaled.high), level,
                      tuple(effects)) if finite else Interval(float(np.mean(effects)), math.nan, math.nan, level,
                                                              tuple(effects))
    if len(effects) < 2:
        return NO_SEED_VERDICT, across
    return monotone_verdict(logs, math.log(claim.threshold), claim.side), across


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
        accuracies = []
        for seed in common_seeds(runs, (method,)):
            result = run_result(runs, method, seed)
            passkey = result.passkey
            accuracy = passkey.by_length.get(condition.multiple * result.train_len) if passkey else None
            if accuracy is None:
                raise NotMeasured(f"no passkey of {method!r} at {condition.multiple}x L")
            accuracies.append(accuracy)
        if np.mean(accuracies) < condition.value:
            return (f"{method} retrieves {np.mean(accuracies):.2f} < {condition.value:g} of its passkeys at "
                    f"{condition.multiple}x L (" + " / ".join(f"{a:.2f}" for a in accuracies) + " per seed)")
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
    out = {}
    for seed, result in runs.get(method, {}).items():
        passkey = getattr(result, "passkey", None)
        inside = [s.correct for s in (passkey.samples if passkey else ())
                  if s.key_tokens is not None and s.length + s.key_tokens <= result.train_len]
        if inside:
            out[seed] = float(np.mean(inside))
    return out


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
    return Outcome(claim, found, interval, seeds, across=across, prediction=prediction_interval(interval.per_seed),
                   excluded=excluded, aside=evidence.aside)
