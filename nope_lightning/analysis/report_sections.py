"""The report's sections that are not tables of evaluations: the claims table (paper 001's and the hybrids'
claims with their verdicts), each scale search's best lambda and fit, and the pre-training recipe of the models.
Cells and tables are written as ``analysis.tables`` writes them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from nope_lightning.analysis.claims import Outcome, Runs, retrieval_by_seed
from nope_lightning.analysis.tables import MISSING, cell, markdown_table
from nope_lightning.config.paper import RETRIEVAL_LEARNED, Claim
from nope_lightning.numerics.stats import UNIT, Interval, t_interval
from nope_lightning.results.bundle import Recipe
from nope_lightning.results.search import ScaleSearchResult


def search_section(method: str, by_seed: Mapping[int | None, ScaleSearchResult]) -> str:
    """Per seed: the best lambda per target with its bootstrap interval, edge flags, and the fit."""
    rows = []
    for seed, summary in by_seed.items():
        intervals, unknown = summary.intervals, (math.nan, math.nan)
        best = ", ".join(f"{n}: {lam:g}" + (f" [{intervals.best[n][0]:g}, {intervals.best[n][1]:g}]"
                                            if n in intervals.best else "")
                         + (" (grid edge)" if summary.best_on_grid_edge.get(n) else "")
                         for n, lam in summary.best.items())
        a, r2 = (cell(Interval(value, *(interval or unknown)), f"{{:.{digits}f}}".format)
                 for value, interval, digits in ((summary.fit.a, intervals.a, 3), (summary.fit.r2, intervals.r2, 2)))
        rows.append([MISSING if seed is None else seed, best, a, r2])
    first = next(iter(by_seed.values()))
    return (f"### Uniform-scale search ({method}; chosen on the {first.split} split, grid "
            f"{list(first.grid)}, 95 % bootstrap intervals over validation windows)\n\n"
            + markdown_table(["seed", "best lambda per target (units of 1/sqrt(d))", "fit a of 1 + a ln s",
                              "R^2"], rows)
            + "\n\nPaper: a = 0.301, R^2 = 0.995 at 10K steps; a = 0.397, R^2 = 0.977 at 50K steps.")


RECIPE_KEYS = ("model.pos_encoding", "model.ssmax", "model.n_layer", "model.n_embd", "data.corpus", "train_len",
               "batch_size", "trainer.devices", "trainer.max_steps", "tokens_per_parameter", "optim.lr",
               "optim.min_lr_ratio", "retrieval.fraction", "retrieval.length", "seed")


def recipe_section(pretrains: Sequence[Recipe]) -> str:
    """Which pre-training recipe produced the models: every figure above depends on it. An unset setting arrives
    as the string "None" (MLflow logs params as strings) and is printed as not set."""
    if not pretrains:
        return ""
    rows = [[r.name, *[MISSING if r.params.get(k, "None") == "None" else r.params[k] for k in RECIPE_KEYS]]
            for r in pretrains]
    return ("### Pre-training recipe of the models above\n\n" + markdown_table(["run", *RECIPE_KEYS], rows)
            + "\n\nA retrieval fraction above 0 means passkey sequences were mixed into pre-training (off in "
              "the paper's recipe): passkey figures of such models measure a skill the model was taught inside "
              "L, and how far past L it survives.")


def paper_cell(claim: Claim, show) -> str:
    """The paper's magnitude in the claim's units (``Claim.paper_effect``), or what the paper says instead."""
    effect = claim.paper_effect
    if effect is None:
        return "no number in these units"
    return f"{'>= ' if effect.at_least else ''}{show(effect.value)} {claim.unit} ({effect.how})"


def claims_table(outcomes: Sequence[Outcome]) -> str:
    """Each claim: its rule and declared test, what its source says and the paper's magnitude in our units, our
    effect as the mean of the per-seed effects with the interval its test reads (90 % t across seeds: the
    one-sided 95 % bounds; log scale: geometric mean) and each seed's effect, the 95 % prediction interval for
    one new seed, the evaluation-only interval (pooled bootstrap over the evaluation units, models held fixed;
    with how many resamples were undefined), how many seeds lie on the claim's side, and the verdict
    (``claims.judge``; one seed: ``claims.NO_SEED_VERDICT``). Seeds left out because their NoPE did not learn
    retrieval are named in the row; Fig 5's tuned view (``Outcome.aside``) follows its verdict's effect."""
    rows = []
    for o in outcomes:
        show = ("{:+.3f}" if o.claim.signed else "{:.3f}").format
        left_out = (" (left out, NoPE did not learn retrieval: "
                    + ", ".join(f"seed {s} {a:.2f}" for s, a in o.excluded) + ")") if o.excluded else ""
        head = [o.claim.text, o.claim.rule, o.claim.test_name, o.claim.paper, paper_cell(o.claim, show)]
        if o.interval is None:
            rows.append([*head, f"{o.verdict}: {o.reason}{left_out}", MISSING, MISSING, MISSING,
                         f"**{o.verdict}**"])
            continue
        seeds = len(o.interval.per_seed)
        across = o.across or Interval(o.interval.estimate, math.nan, math.nan)
        ours = f"{cell(across, show)} {o.claim.unit}"
        ours += f" (per seed: {' / '.join(map(show, o.interval.per_seed))})" if seeds > 1 else " (1 seed)"
        if o.aside:
            ours += (f"; against the tuned model's entropy, as the paper plotted: {show(sum(o.aside) / len(o.aside))}"
                     f" (per seed: {' / '.join(map(show, o.aside))})")
        new_seed = cell(o.prediction, show) if seeds > 1 and o.prediction is not None else MISSING
        if math.isnan(o.interval.low) and math.isnan(o.interval.high) and not o.interval.resamples:
            evaluation = "none (no evaluation units to resample)"
        else:
            evaluation = cell(o.interval, show)
        if o.interval.undefined:
            evaluation += f" ({o.interval.undefined} of {o.interval.resamples} resamples undefined, left out)"
        rows.append([*head, ours + left_out, new_seed, evaluation, f"{o.on_side} of {seeds}", f"**{o.verdict}**"])
    return ("### The claims, tested\n\n"
            "Each effect is paired (the compared methods scored on the same windows, position windows or prompts) "
            "and computed seed by seed. Each claim's test was declared before the run it judges (*test*): a "
            "one-sided Student t test at 95 % across seeds for a directional claim (superiority, or "
            "non-inferiority when the margin lies on the other side of no effect), TOST (two one-sided tests, the "
            "90 % interval inside the margin) for an equivalence claim, on the log scale for a strictly positive, "
            "multiplicative effect. *ours*: the mean of the per-seed effects (log scale: geometric mean) with the "
            "90 % t interval the test reads (its bounds are the one-sided 95 % bounds; df = seeds - 1); "
            "*one new seed*: the 95 % prediction interval for another seed's effect; *evaluation only*: the 95 % "
            "bootstrap over the evaluation units, pooled over seeds, with the trained models held fixed (not used "
            "for verdicts). *reproduced*: the test passes; *not reproduced*: the interval lies on the other side; "
            "*inconclusive* otherwise. A seed's effect further on the claim's side never weakens a verdict: a "
            "seed far beyond the others is not held against the claim (so with n seeds, every seed on the "
            "claim's side reproduces it, a 2^-n chance under no effect: 1/16 with 4 seeds). One seed gets no "
            "verdict; *untestable*: a precondition fails; *no effect of … here*: an ablation tuned on its own "
            "data reached the full method's temperature table. *the paper's magnitude*: the paper's effect in "
            "our units, from its published numbers.\n\n"
            + markdown_table(["claim", "rule", "test", "the source says", "the paper's magnitude",
                              "ours: mean [90 % t across seeds]", "one new seed [95 % prediction]",
                              "evaluation only [95 % pooled bootstrap]", "seeds on the claim's side", "verdict"],
                             rows))


def retrieval_line(accuracy: Mapping[int | None, float]) -> str:
    """"Retrieval learned in k of n seeds": NoPE's passkey accuracy inside L per seed (``claims.retrieval_by_seed``)
    against ``RETRIEVAL_LEARNED``; '' when no seed answered a prompt inside L."""
    if not accuracy:
        return ""
    learned = [s for s, a in accuracy.items() if a >= RETRIEVAL_LEARNED]
    return (f"**Retrieval learned in {len(learned)} of {len(accuracy)} seeds** (NoPE retrieves >= "
            f"{RETRIEVAL_LEARNED:g} of the passkeys whose answer lies inside L; per seed: "
            + ", ".join(f"{s} {a:.2f}" for s, a in accuracy.items())
            + "). Claims that presuppose retrieval leave the other seeds out; every other claim keeps them.")


def retrieval_table(runs: Runs) -> str:
    """What each method does to retrieval inside L, seed by seed: passkey accuracy over the prompts whose answer
    lies inside L (``claims.retrieval_by_seed``) per method x seed, with the mean and its 95 % t interval across
    the method's seeds (clipped to [0, 1]). A statement about retrieval is read off this table, seed by seed,
    not made as a rule. '' with fewer than 2 seeds (no spread to show) or no prompt inside L."""
    by_method = {m: found for m in runs if (found := retrieval_by_seed(runs, m))}
    seeds = sorted({seed for found in by_method.values() for seed in found}, key=lambda s: (s is None, s or 0))
    if len(seeds) < 2:
        return ""
    rows = [[m, *(MISSING if s not in found else f"{found[s]:.2f}" for s in seeds),
             cell(t_interval(list(found.values()), bounds=UNIT)), len(found)] for m, found in by_method.items()]
    return ("### Retrieval inside L, per seed (passkey accuracy on the prompts whose answer lies inside L; mean "
            "[95 % t interval across seeds])\n\n"
            + markdown_table(["method", *(f"seed {s}" for s in seeds), "mean [95 % t across seeds]", "seeds"], rows))


def changed_rules_section(claims: Sequence[Claim], run_dates: Sequence[str]) -> str:
    """Every rule of ``claims`` changed on or after the earliest of the reported runs' dates (ISO, UTC; a change
    on the run's own day is listed: a date does not order them), or every change when no date is known."""
    first = min(run_dates, default="")
    changes = sorted({(change.date, change.reason, claim.id) for claim in claims for change in claim.changes
                      if change.date >= first})
    if not changes:
        return ""
    when = (f"on or after the run ({first})" if first
            else "— the run's date is not in its results, so every change is listed")
    by_change: dict[tuple[str, str], list[str]] = {}
    for date, reason, claim_id in changes:
        by_change.setdefault((date, reason), []).append(claim_id)
    return (f"### Rules changed {when}\n\n"
            + "\n".join(f"* {date}: {reason} ({', '.join(ids)})" for (date, reason), ids in sorted(by_change.items())))
