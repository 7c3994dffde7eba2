"""The report's sections that are not tables of evaluations: the claims table (paper 001's and the hybrids'
claims with their verdicts), each scale search's best lambda and fit, and NoPE's retrieval inside L (the rules
changed since the run: ``analysis.rule_changes``). Cells and tables are written as ``analysis.markdown`` writes them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from nope_lightning.analysis.lengthgen import claims, rule_size, verdict_cells
from nope_lightning.analysis.lengthgen.claims import Runs, retrieval_by_seed
from nope_lightning.analysis.lengthgen.log_law import log_or_linear
from nope_lightning.analysis.markdown import MISSING, cell, markdown_table
from nope_lightning.analysis.rule_changes import exploratory_note, read_days
from nope_lightning.analysis.verdicts import Outcome
from nope_lightning.config.paper import RETRIEVAL_LEARNED, Claim
from nope_lightning.numerics.stats import UNIT, Interval, t_interval
from nope_lightning.results.search import ScaleSearchResult


def search_section(method: str, by_seed: Mapping[int | None, ScaleSearchResult]) -> str:
    """Per seed: the best lambda per target with its bootstrap interval, edge flags, and the fit."""
    rows, log_better, compared = [], 0, 0
    for seed, summary in by_seed.items():
        intervals, unknown = summary.intervals, (math.nan, math.nan)
        best = ", ".join(f"{n}: {lam:g}" + (f" [{intervals.best[n][0]:g}, {intervals.best[n][1]:g}]"
                                            if n in intervals.best else "")
                         + (" (grid edge)" if summary.best_on_grid_edge.get(n) else "")
                         for n, lam in summary.best.items())
        a, r2 = (cell(Interval(value, *(interval or unknown)), f"{{:.{digits}f}}".format)
                 for value, interval, digits in ((summary.fit.a, intervals.a, 3), (summary.fit.r2, intervals.r2, 2)))
        past = [p for p in summary.per_position_best if p.s > 1]
        in_log, in_s = log_or_linear([p.s for p in past], [p.temperature for p in past])
        if math.isnan(in_log) or math.isnan(in_s):
            versus = MISSING
        else:
            compared, log_better = compared + 1, log_better + (in_log > in_s)
            versus = f"{in_log:.2f} / {in_s:.2f} ({'ln s' if in_log > in_s else 's'} fits better)"
        rows.append([MISSING if seed is None else seed, best, a, r2, versus])
    first = next(iter(by_seed.values()))
    verdict = (f"\n\nThe log law against a linear rise: lambda = c + b ln s fits the per-position best lambda past L "
               f"better than lambda = c + b s in {log_better} of {compared} seeds (free intercept and one slope each, "
               f"so R^2 compares their residuals)." if compared else "")
    return (f"### Uniform-scale search ({method}; chosen on the {first.split} split, grid "
            f"{list(first.grid)}, 95 % bootstrap intervals over validation windows)\n\n"
            + markdown_table(["seed", "best lambda per target (units of 1/sqrt(d))", "fit a of 1 + a ln s",
                              "R^2", "R^2 past L: c + b ln s / c + b s"], rows)
            + "\n\nPaper: a = 0.301, R^2 = 0.995 at 10K steps; a = 0.397, R^2 = 0.977 at 50K steps." + verdict)


def paper_cell(claim: Claim, show) -> str:
    """The paper's magnitude in the claim's units (``Claim.paper_effect``), or what the paper says instead."""
    effect = claim.paper_effect
    if effect is None:
        return "no number in these units"
    return f"{'>= ' if effect.at_least else ''}{show(effect.value)} {claim.unit} ({effect.how})"


def claims_table(outcomes: Sequence[Outcome], seed_dates: Mapping[int | None, str] | None = None,
                 row_dates: Mapping[tuple[str, int | None], str] | None = None) -> str:
    """Each claim: its rule and declared test (with the day its rule took its present form when some of its
    seeds ran before it: ``verdict_cells.declared_note``; ``seed_dates``: seed -> the day its run started, each
    seed dated by the rows the claim reads where ``row_dates``, ``(method, seed) -> day``, knows them:
    ``rule_changes.read_days``), what
    its source says and the paper's magnitude in our units, our effect as the mean of the per-seed effects with the
    interval its test reads (90 % t across seeds: the one-sided 95 % bounds; log scale: geometric mean) and each
    seed's effect, ours as a share of the paper's, the bound the verdict read, the 95 % prediction interval for one
    new seed on the claim's scale, the evaluation-only interval (pooled bootstrap over the evaluation units, models
    held fixed; with how many resamples were undefined), how many seeds lie on the claim's side with an exact sign
    test, and the verdict (``claims.judge``). Under the table: which claims hold in direction only
    (``verdict_cells.magnitude_summary``). Seeds left out because their NoPE did not learn retrieval are named in
    the row; Fig 5's tuned view (``Outcome.aside``) follows its verdict's effect."""
    rows = []
    for o in outcomes:
        dates = read_days(o.claim, seed_dates or {}, row_dates)
        show = ("{:+.3f}" if o.claim.signed else "{:.3f}").format
        left_out = (" (left out, NoPE did not learn retrieval: "
                    + ", ".join(f"seed {s} {a:.2f}" for s, a in o.excluded) + ")") if o.excluded else ""
        head = [o.claim.text, o.claim.rule, o.claim.test_name + verdict_cells.declared_note(o, dates), o.claim.paper,
                paper_cell(o.claim, show)]
        if o.interval is None:
            rows.append([*head, f"{o.verdict}: {o.reason}{left_out}", *[MISSING] * 5, f"**{o.verdict}**"])
            continue
        seeds = len(o.interval.per_seed)
        across = o.across or Interval(o.interval.estimate, math.nan, math.nan)
        ours = f"{cell(across, show)} {o.claim.unit}"
        ours += f" (per seed: {' / '.join(map(show, o.interval.per_seed))})" if seeds > 1 else " (1 seed)"
        if o.aside:
            ours += (f"; against the tuned model's entropy, as the paper plotted: {show(sum(o.aside) / len(o.aside))}"
                     f" (per seed: {' / '.join(map(show, o.aside))})")
        new_seed = MISSING
        if seeds > 1 and o.prediction is not None:
            new_seed = (cell(o.prediction, show) if not math.isnan(o.prediction.low)
                        else "none (a seed's effect is undefined on the claim's scale)")
        if math.isnan(o.interval.low) and math.isnan(o.interval.high) and not o.interval.resamples:
            evaluation = "none (no evaluation units to resample)"
        else:
            evaluation = cell(o.interval, show)
        if o.interval.undefined:
            evaluation += f" ({o.interval.undefined} of {o.interval.resamples} resamples undefined, left out)"
        found = f"**{o.verdict}**"
        if o.verdict == "partial":
            paper = o.claim.paper_effect
            found += (f": {show(across.estimate)} {o.claim.unit}" + (f", paper {show(paper.value)}" if paper else ""))
        if note := exploratory_note(o, dates):  # after the bold verdict and its colon, which the study cards read
            found += ("; " if ":" in found else ": ") + note
        rows.append([*head, ours + left_out, verdict_cells.magnitude_cell(o), verdict_cells.bound_cell(o, show),
                     new_seed, evaluation, verdict_cells.side_cell(o), found])
    counts = [len(o.interval.per_seed) for o in outcomes if o.interval is not None]
    return ("### The claims, tested\n\n" + claims_legend(counts) + "\n\n"
            + markdown_table(["claim", "rule", "test", "the source says", "the paper's magnitude",
                              "ours: mean [90 % t across seeds]", "ours / the paper's", "bound the verdict read",
                              "one new seed [95 % prediction, the claim's scale]",
                              "evaluation only [95 % pooled bootstrap]", "seeds on the claim's side",
                              "verdict"], rows)
            + (f"\n\n{summary}" if (summary := verdict_cells.magnitude_summary(outcomes)) else ""))


def claims_legend(seed_counts: Sequence[int]) -> str:
    """The claims table's legend, with the verdict rule's size under no effect simulated for ``seed_counts``."""
    decided = sorted({n for n in seed_counts if n >= claims.MIN_VERDICT_SEEDS})
    return (
        "Each effect is paired (the compared methods scored on the same windows, position windows or prompts) and "
        "computed seed by seed. *test*: a one-sided Student t test at 95 % across seeds for a directional claim "
        "(superiority, or non-inferiority when the margin lies on the other side of no effect), TOST (two one-sided "
        "tests, the 90 % interval inside the margin) for an equivalence claim, on the log scale for a strictly "
        "positive, multiplicative effect; a rule that took its present form after some of the seeds it judges ran "
        "says so in its cell (*Rules changed*, above, lists every change). *ours*: the mean of the per-seed effects "
        "(log scale: geometric mean) with the 90 % t interval (its bounds are the one-sided 95 % bounds; df = seeds "
        "- 1); *ours / the paper's*: our effect beyond no effect as a share of the paper's, and whether the paper's "
        "value lies inside our interval; *one new seed*: the 95 % prediction interval for another seed's effect, "
        "computed on the claim's scale (log scale: geometric); *evaluation only*: the 95 % bootstrap over the "
        "evaluation units, pooled over seeds, with the trained models held fixed (not used for verdicts). "
        "*reproduced*: the test passes; *not reproduced*: the interval lies on the other side; *partial*: the test "
        "clears the claim's weaker declared margin but not its own (a repair that closes part of the gap); "
        "*inconclusive* otherwise. A seed's effect further on the claim's side never weakens a verdict: the rule is "
        "the monotone hull of the t test, so a seed far beyond the others is pulled back to them, and *bound the "
        "verdict read* prints the bound it compared with the margin, which can differ from the printed interval's. "
        "The price: with n seeds every seed on the claim's side is reproduced, so the rule's chance of reproducing "
        "a claim whose true effect sits on its margin (simulated, "
        f"{rule_size.SIZE_DRAWS:,} seeded normal draws) is {rule_size.sizes_line(decided or [claims.MIN_VERDICT_SEEDS])}"
        "; the exact sign test of the seeds on the claim's side stands beside it. Since 2026-11-28 no verdict is "
        f"given below {claims.MIN_VERDICT_SEEDS} seeds (with 4 the rule's size is "
        f"{100 * rule_size.null_size(4):.1f} %, above the test's 5 %); one seed has no spread at all. "
        "*untestable*: a precondition fails; *no effect of … here*: an ablation tuned on its own data reached the "
        "full method's temperature table. *the paper's magnitude*: the paper's effect in our units, from its "
        "published numbers.")


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

