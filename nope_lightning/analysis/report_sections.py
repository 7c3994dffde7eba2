"""The report's sections that are not tables of evaluations: the claims table (paper 001's and the hybrids'
claims with their verdicts), each scale search's best lambda and fit, and the pre-training recipe of the models.
Cells and tables are written as ``analysis.tables`` writes them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from nope_lightning.analysis.claims import Outcome
from nope_lightning.analysis.stats import Interval
from nope_lightning.analysis.tables import MISSING, cell, markdown_table
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


def claims_table(outcomes: Sequence[Outcome]) -> str:
    """Each claim: its rule, what its source (paper 001, or a hybrid's paper) says, our effect as the mean of the per-seed effects with its 95 % t
    interval across seeds (and each seed's effect), the 95 % prediction interval for one new seed, the
    evaluation-only interval (pooled bootstrap over the evaluation units, models held fixed; with how many
    resamples were undefined), how many seeds lie on the claim's side, and the verdict (``claims.verdict``:
    from the interval across seeds; one seed: ``claims.NO_SEED_VERDICT``)."""
    rows = []
    for o in outcomes:
        if o.interval is None:
            rows.append([o.claim.text, o.claim.rule, o.claim.paper, f"{o.verdict}: {o.reason}", MISSING, MISSING,
                         MISSING, f"**{o.verdict}**"])
            continue
        show = ("{:+.3f}" if o.claim.signed else "{:.3f}").format
        seeds = len(o.interval.per_seed)
        across = o.across or Interval(o.interval.estimate, math.nan, math.nan)
        ours = f"{cell(across, show)} {o.claim.unit}"
        ours += f" (per seed: {' / '.join(map(show, o.interval.per_seed))})" if seeds > 1 else " (1 seed)"
        new_seed = cell(o.prediction, show) if seeds > 1 and o.prediction is not None else MISSING
        if math.isnan(o.interval.low) and math.isnan(o.interval.high) and not o.interval.resamples:
            evaluation = "none (no evaluation units to resample)"
        else:
            evaluation = cell(o.interval, show)
        if o.interval.undefined:
            evaluation += f" ({o.interval.undefined} of {o.interval.resamples} resamples undefined, left out)"
        rows.append([o.claim.text, o.claim.rule, o.claim.paper, ours, new_seed, evaluation,
                     f"{o.on_side} of {seeds}", f"**{o.verdict}**"])
    return ("### The claims, tested\n\n"
            "Each effect is paired (the compared methods scored on the same windows, position windows or prompts) "
            "and computed seed by seed. *ours*: the mean of the per-seed effects with its 95 % t interval across "
            "seeds (df = seeds - 1); *one new seed*: the 95 % prediction interval for another seed's effect; "
            "*evaluation only*: the 95 % bootstrap over the evaluation units, pooled over seeds, with the trained "
            "models held fixed (not used for verdicts). Verdicts are about seeds: *reproduced* when the t "
            "interval lies on the claim's side of the threshold, *not reproduced* when it lies on the other "
            "side, *inconclusive* otherwise; one seed gets no verdict; *untestable*: a precondition fails; *no effect of … here*: "
            "an ablation tuned on its own data reached the full method's temperature table.\n\n"
            + markdown_table(["claim", "rule", "the source says", "ours: mean [95 % t across seeds]",
                              "one new seed [95 % prediction]", "evaluation only [95 % pooled bootstrap]",
                              "seeds on the claim's side", "verdict"], rows))
