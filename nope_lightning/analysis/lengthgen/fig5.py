"""Paper 001's Fig 5 per layer, and a permutation test of its statement (§4: "within each layer, heads with more
concentrated attention (i.e., lower entropy) searched for larger scales").

Three views of each head's entropy against its tuned lambda, one scatter per layer (``fig5_figures``):

* *tuned*, as the paper draws it: the HeadScale model's own entropy at the last position of the tuning length T
  (``ConvergedEntropy.last_position``, what the headscale stage logs), or over its last 1/``CONVERGED_TAIL``
  (``ConvergedEntropy.per_head``) for a run logged before the last position was; the section and caption say
  which. A larger lambda lowers a head's entropy by construction, so this view cannot tell cause from effect;
* *untuned at T*: the untuned model's entropy over the same positions (NoPE's evaluation, ``untuned_head_entropy``),
  the view the claim ``low_entropy_heads_larger_lambda`` reads;
* *untuned inside L*: the untuned model's entropy over the last 1/``INSIDE_L_TAIL`` of the training length, where
  every head attends as it was trained to.

The test (``permutation_test``): the statistic is a seed's mean over layers of Spearman's rho between the heads'
entropy and lambda (``claim_tests.head_rank``), averaged over the seeds; its null permutes lambda among the heads
of each layer, independently in every layer and seed (the layer's set of lambdas and the heads' entropies held
fixed). The p value is one-sided (negative rho: lower entropy, larger lambda) from ``PERMUTATIONS`` random
permutations, or from every permutation when there are no more than that. It holds the trained models fixed: it
asks whether these tables rank heads by entropy more than chance does, as the evaluation-only interval does for
the other claims. Declared on 2026-11-28 (``RULE``), after every seed of the regime study had run: on those seeds
it is exploratory, and it is fixed for seeds that run after it.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from nope_lightning.analysis.lengthgen import plots
from nope_lightning.analysis.lengthgen.claim_tests import (
    Runs,
    head_entropy_over,
    head_rank,
    untuned_head_entropy,
)
from nope_lightning.analysis.lengthgen.claims import MIN_VERDICT_SEEDS, few_seeds_verdict
from nope_lightning.analysis.markdown import MISSING, markdown_table
from nope_lightning.analysis.report_frame import Plot, seeds
from nope_lightning.analysis.rule_changes import exploratory_note, read_days
from nope_lightning.analysis.verdicts import NO_SEED_VERDICT, NotMeasured, Outcome
from nope_lightning.config.claim_rules import RuleChange
from nope_lightning.config.paper import CLAIMS_BY_ID, Claim
from nope_lightning.numerics.stats import spearman
from nope_lightning.results.headscale import CONVERGED_TAIL, HeadScaleResult

#: Random within-layer permutations behind a p value (every permutation instead when there are no more).
PERMUTATIONS = 10_000
#: The permutations' random seed, fixed so that a report regenerates to the byte.
PERMUTATION_SEED = 0
#: The one-sided level of the test.
ALPHA = 0.05
#: "Inside L": the last 1/4 of the training length (the regime study's entropy buckets are L/4 wide).
INSIDE_L_TAIL = 4
#: Equal statistics (tied heads swapped) count as at least as extreme: a float tolerance for that.
_TIE = 1e-12

RULE = RuleChange("2026-11-28", "declared: Fig 5's statement judged by a within-layer permutation test of the "
                                "untuned model's entropy at the tuning length against lambda (mean Spearman rho "
                                f"over layers and seeds, one-sided p < {ALPHA:g}, >= {PERMUTATIONS:,} permutations)",
                  seen=True)
#: The rule as a claim, so that the report's dating of rules (``rule_changes.exploratory_note``) reads it.
PERMUTATION_CLAIM = Claim("low_entropy_heads_larger_lambda_permutation", "within each layer, heads with lower "
                          "untuned entropy at the tuning length learn a larger lambda (within-layer permutation "
                          "test)", "§4 / Fig 5", "head_entropy_permutation", CLAIMS_BY_ID[
                              "low_entropy_heads_larger_lambda"].methods, side="below", unit="(rank correlation)",
                          scale="raw", inference="superiority", changes=(RULE,))


@dataclass(frozen=True)
class PermutationTest:
    """The test on some seeds: ``statistic`` (mean over seeds of each seed's mean within-layer rho), its one-sided
    p values (``p``: as low or lower under the null, the claim's side; ``p_upper``: as high or higher), the
    number of permutations behind them (``exact``: every one), and per seed ``(seed, rho, p)``."""

    statistic: float
    p: float
    p_upper: float
    draws: int
    exact: bool
    per_seed: tuple[tuple[int | None, float, float], ...]

    @property
    def verdict(self) -> str:
        """reproduced (p < ``ALPHA``), not reproduced (the other tail's p < ``ALPHA``) or inconclusive; no verdict
        below ``MIN_VERDICT_SEEDS`` seeds, as for every claim."""
        n = len(self.per_seed)
        if n < 2:
            return NO_SEED_VERDICT
        if n < MIN_VERDICT_SEEDS:
            return few_seeds_verdict(n)
        return "reproduced" if self.p < ALPHA else "not reproduced" if self.p_upper < ALPHA else "inconclusive"


def within_layer_null(table: np.ndarray, entropy: np.ndarray, permutations: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    """``head_rank`` of ``table`` (n_layer, n_head) against ``entropy`` with each layer's lambdas permuted among
    its heads: every permutation when there are no more than ``permutations`` ((n_head!)^n_layer values, exact
    = True), else ``permutations`` uniform random ones."""
    table, entropy = np.asarray(table, dtype=np.float64), np.asarray(entropy, dtype=np.float64)
    n_layer, n_head = table.shape
    if math.factorial(n_head) ** n_layer <= permutations:
        orders = np.array(list(itertools.permutations(range(n_head))))
        chosen = np.array(list(itertools.product(range(len(orders)), repeat=n_layer)))  # (P, n_layer)
        permuted, exact = table[np.arange(n_layer)[None, :, None], orders[chosen]], True  # (P, n_layer, n_head)
    else:
        permuted, exact = rng.permuted(np.repeat(table[None], permutations, 0), axis=-1), False
    rho = spearman(np.broadcast_to(entropy, permuted.shape), permuted)  # (P, n_layer); NaN: a tied layer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a table whose every layer is tied: NaN
        return np.nanmean(rho, axis=-1), exact


def permutation_test(pairs: Mapping[int | None, tuple[np.ndarray, np.ndarray]], permutations: int = PERMUTATIONS,
                     seed: int = PERMUTATION_SEED) -> PermutationTest:
    """The test over the seeds of ``pairs`` (seed -> (lambda table, entropy), both (n_layer, n_head); a seed with
    no layer to rank is left out): per seed its own null (``within_layer_null``); the seeds' mean against the mean of independent draws from each seed's
    null (every combination when the seeds' permutations number no more than ``permutations``). A p value from
    random permutations counts the observed tables among them, (1 + k) / (1 + N)."""
    rng = np.random.default_rng(seed)
    observed, nulls, per_seed = [], [], []
    for s, (table, entropy) in pairs.items():
        rho = head_rank(table, entropy)
        if not np.isfinite(rho):  # every layer's lambdas (or entropies) tied: nothing to rank in this seed
            continue
        null, exact = within_layer_null(table, entropy, permutations, rng)
        observed.append(rho)
        nulls.append((null, exact))
        per_seed.append((s, rho, _p(null <= rho + _TIE, exact)))
    if not observed:
        return PermutationTest(math.nan, math.nan, math.nan, 0, False, ())
    statistic = float(np.mean(observed))
    if all(exact for _, exact in nulls) and math.prod(len(n) for n, _ in nulls) <= permutations:
        combined = np.mean(np.stack(np.meshgrid(*(n for n, _ in nulls), indexing="ij")), 0).ravel()
        exact = True
    else:
        combined = np.mean([rng.choice(n, permutations) if e else n for n, e in nulls], 0)
        exact = False
    return PermutationTest(statistic, _p(combined <= statistic + _TIE, exact),
                           _p(combined >= statistic - _TIE, exact), len(combined), exact, tuple(per_seed))


def _p(extreme: np.ndarray, exact: bool) -> float:
    return float(extreme.mean()) if exact else float((1 + extreme.sum()) / (1 + len(extreme)))


# --- the three views, the section and the figures -------------------------------------------------------------


def views(runs: Runs) -> dict[str, dict[int | None, tuple[np.ndarray, np.ndarray]]]:
    """Per view (``VIEWS``), seed -> (lambda table, entropy) of the seeds where the HeadScale run and the untuned
    evaluation (the Fig 5 claim's two methods) both measured it; a view no seed measured is absent."""
    tuned_method, untuned_method = PERMUTATION_CLAIM.methods
    out: dict[str, dict] = {name: {} for name in VIEWS}
    for s, tuned in runs.get(tuned_method, {}).items():
        if not isinstance(tuned, HeadScaleResult) or tuned.converged_entropy is None:
            continue
        table, logged = np.asarray(tuned.table, dtype=np.float64), tuned.converged_entropy
        entropy = logged.per_head if logged.last_position is None else logged.last_position
        out["tuned"][s] = (table, np.asarray(entropy, dtype=np.float64))
        untuned = runs.get(untuned_method, {}).get(s)
        if untuned is None:
            continue
        L = tuned.train_len
        for name, (start, stop) in (("untuned at T", (None, tuned.target_len)),
                                    ("untuned inside L", (L - L // INSIDE_L_TAIL, L))):
            try:
                entropy = (untuned_head_entropy(untuned, stop) if start is None
                           else head_entropy_over(untuned, start, stop))
            except NotMeasured:
                continue
            if entropy.shape == table.shape:
                out[name][s] = (table, entropy)
    return {name: found for name, found in out.items() if found}


#: What each view's entropy is, in words (T: the tuning length, L: the training length); the tuned view's where its
#: runs logged no last position (``tuned_where``).
VIEWS = {"tuned": f"the tuned model's, over the last 1/{CONVERGED_TAIL} of T (the paper's view)",
         "untuned at T": f"the untuned model's, over the last 1/{CONVERGED_TAIL} of T (the rule's view)",
         "untuned inside L": f"the untuned model's, over the last 1/{INSIDE_L_TAIL} of L"}


def tuned_where(runs: Runs, seeds_read: Sequence[int | None] | None = None) -> str:
    """Where the tuned view's entropy was read (``VIEWS``), over ``seeds_read`` (every seed when None): at the
    last position of T where the HeadScale runs logged it, else over the last 1/``CONVERGED_TAIL`` of T."""
    logged = [r.converged_entropy for s, r in runs.get(PERMUTATION_CLAIM.methods[0], {}).items()
              if isinstance(r, HeadScaleResult) and r.converged_entropy is not None
              and (seeds_read is None or s in seeds_read)]
    last = [e.last_position is not None for e in logged]
    if not any(last):
        return VIEWS["tuned"]
    if all(last):
        return "the tuned model's, at the last position of T (the paper's view)"
    return (f"the tuned model's, at the last position of T in the {sum(last)} seeds that logged it, over the last "
            f"1/{CONVERGED_TAIL} of T in the {len(last) - sum(last)} that did not (the paper's view)")


def fig5_section(runs: Runs, seed_days: Mapping[int | None, str] | None = None,
                 row_days: Mapping[tuple[str, int | None], str] | None = None) -> str:
    """The permutation test of Fig 5's statement in each view: per seed rho and p, the seeds' mean and p, and the
    declared rule's verdict on the untuned view at T (exploratory on seeds that ran before the rule, each dated
    by the rows the test reads where ``row_days`` knows them: ``rule_changes.read_days``); a view whose every
    layer is tied is left out; '' without a HeadScale run with converged entropies."""
    found = views(runs)
    if not found:
        return ""
    tested = {name: test for name, pairs in found.items() if (test := permutation_test(pairs)).per_seed}
    if not tested:
        return ""
    every = sorted({s for t in tested.values() for s, _, _ in t.per_seed}, key=lambda s: (s is None, s or 0))
    rows = []
    for name, test in tested.items():
        by_seed = {s: f"{rho:+.3f} (p {p:.3g})" for s, rho, p in test.per_seed}
        verdict = MISSING
        if name == "untuned at T":
            outcome = Outcome(PERMUTATION_CLAIM, test.verdict, seeds=tuple(by_seed))
            note = exploratory_note(outcome, read_days(PERMUTATION_CLAIM, seed_days or {}, row_days))
            verdict = f"**{test.verdict}**" + (f": {note}" if note else "")
        where = tuned_where(runs) if name == "tuned" else VIEWS[name]
        rows.append([name, where, *(by_seed.get(s, MISSING) for s in every),
                     f"{test.statistic:+.3f} (p {test.p:.3g}; other tail {test.p_upper:.3g})",
                     f"{test.draws:,} {'(every permutation)' if test.exact else 'random'}", verdict])
    return ("### Fig 5 per layer: lambda against entropy, within-layer permutation test\n\n"
            "Spearman's rho between the heads' entropy and their tuned lambda, within each layer, mean over layers "
            "(negative: heads with lower entropy learn a larger lambda), per seed with its one-sided p, and the mean "
            "over seeds with the p of that mean; the null permutes lambda among each layer's heads, independently "
            "in every layer and seed, the trained models held fixed. "
            f"Rule, declared {RULE.date}: {PERMUTATION_CLAIM.text}, reproduced when the one-sided p < {ALPHA:g} "
            f"(not reproduced when the other tail's is), read on the untuned view at T; the claim "
            f"`low_entropy_heads_larger_lambda` (t test across seeds, in the claims table) keeps its own verdict, "
            f"and this table's 'untuned at T' row is its permutation p.\n\n"
            + markdown_table(["view", "entropy", *(f"seed {s}" for s in every), "mean over seeds",
                              "permutations", "verdict"], rows))


def fig5_figures(runs: Runs) -> dict[str, Plot]:
    """One figure per view (``views``): a scatter of entropy against lambda per layer, for the first seed that
    measured the view, named in its title and caption."""
    out = {}
    for name, pairs in views(runs).items():
        seed = min(pairs, key=lambda s: (s is None, s or 0))
        table, entropy = pairs[seed]
        slug = name.replace(" ", "_")
        out[f"fig5_{slug}_by_layer.png"] = Plot(layer_scatter(table, entropy, name, seed), (
            f"Fig 5 per layer, {name} view: each head's tuned lambda (x 1/sqrt(d)) against its attention entropy "
            f"(nats), {tuned_where(runs, [seed]) if name == 'tuned' else VIEWS[name]}, one panel per layer with "
            f"its Spearman rho, {seeds([seed])} (the first seed read; every seed's rho is in the permutation table)."
            + (" The tuned model's entropy is the mean over those positions, not at the last position alone: "
               "the HeadScale run logged no other." if name == "tuned" and "last position" not in
               tuned_where(runs, [seed]) else "")))
    return out


def layer_scatter(table: np.ndarray, entropy: np.ndarray, view: str, seed: int | None, columns: int = 4):
    """A grid of per-layer scatters: x entropy (nats), y lambda, each head a point; ``table`` and ``entropy``
    (n_layer, n_head)."""
    n_layer = table.shape[0]
    rows = math.ceil(n_layer / columns)
    fig, axes = plots.plt.subplots(rows, columns, figsize=(3 * columns, 2.4 * rows), squeeze=False, layout="constrained")
    rho = spearman(entropy, table)
    for layer, ax in enumerate(axes.flat):
        if layer >= n_layer:
            ax.set_visible(False)
            continue
        ax.scatter(entropy[layer], table[layer], s=22, color="C0")
        for head, (x, y) in enumerate(zip(entropy[layer], table[layer], strict=True)):
            ax.annotate(str(head), (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points")
        ax.set_title(f"layer {layer}: rho {rho[layer]:+.2f}" if np.isfinite(rho[layer]) else f"layer {layer}: tied",
                     fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    fig.supxlabel(f"attention entropy (nats), {view}", fontsize=9)
    fig.supylabel("tuned lambda (x 1/sqrt(d))", fontsize=9)
    fig.suptitle(f"HeadScale: lambda vs entropy per layer ({view}), {seeds([seed])}", fontsize=10)
    return fig
