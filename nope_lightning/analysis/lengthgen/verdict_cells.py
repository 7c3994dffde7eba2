"""The cells of the claims table that say what a verdict read and how big the effect is beside the paper's: the
bound the rule compared with the margin (``bound_cell``), our effect as a share of the paper's and whether the
paper's value lies inside our interval (``magnitude_cell``, ``magnitude_summary``), the seeds on the claim's side
with an exact sign test (``side_cell``), and when the claim's rule was fixed against the days its seeds ran
(``declared_note``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from nope_lightning.analysis.lengthgen.claims import MIN_VERDICT_SEEDS, margin_on_scale, on_scale
from nope_lightning.analysis.lengthgen.rule_size import bound_read, fmt_p, sign_test
from nope_lightning.analysis.markdown import MISSING
from nope_lightning.analysis.verdicts import Outcome
from nope_lightning.config.paper import Claim

#: The verdicts a test decided (others: no verdict, untestable, not measured).
DECIDED = ("reproduced", "not reproduced", "inconclusive", "partial")


def bound_cell(o: Outcome, show: Callable[[float], str]) -> str:
    """The bound(s) the verdict compared with the margin, in the effect's units (``rule_size.bound_read``; log
    scale: exponentiated), and a flag when the printed 90 % interval crosses the margin of a *reproduced* claim
    (the hull read a set of seeds pulled back to the others, not the printed interval)."""
    if o.verdict not in DECIDED:
        return MISSING
    claim, effects = o.claim, o.interval.per_seed
    scaled = on_scale(claim, effects)
    if not np.isfinite(scaled).all():
        return "none (a seed's effect is undefined on the claim's scale)"
    unit = (lambda v: show(math.exp(v))) if claim.scale == "log" else show
    margin = f"{claim.threshold:.3g}"
    clearing, excluding = bound_read(scaled, margin_on_scale(claim, claim.threshold), claim.side)
    if claim.side == "within":
        wide, near = (unit(v).lstrip("+") for v in (clearing, excluding))
        text = (f"widest bound ±{wide} <= {margin}" if o.verdict == "reproduced"
                else f"nearest bound ±{near} > {margin}" if o.verdict == "not reproduced"
                else f"widest bound ±{wide} > {margin} >= nearest ±{near}")
    else:
        low, high = ("lower", "upper") if claim.side == "above" else ("upper", "lower")
        past, short = (">", "<=") if claim.side == "above" else ("<", ">=")
        text = (f"{low} {unit(clearing)} {past} {margin}" if o.verdict == "reproduced"
                else f"{high} {unit(excluding)} {short} {margin}" if o.verdict == "not reproduced"
                else f"{low} {unit(clearing)} {short} {margin} {'<' if claim.side == 'above' else '>'} {high} "
                     f"{unit(excluding)}")
        if o.verdict == "partial":
            text = f"{low} {unit(clearing)} {past} {o.claim.partial:.3g} (partial), {short} {margin}"
    if o.verdict == "reproduced" and o.across is not None and _crosses(claim, o.across.low, o.across.high):
        text += " (the printed 90 % interval crosses the margin: the rule read the seeds pulled back to the others)"
    return text


def _crosses(claim: Claim, low: float, high: float) -> bool:
    m = claim.threshold
    if claim.side == "within":
        return low < -m or high > m
    return low <= m if claim.side == "above" else high >= m


def magnitude_cell(o: Outcome) -> str:
    """Our effect beyond no effect as a share of the paper's (``(ours - null) / (paper - null)``) and whether the
    paper's value lies inside our 90 % interval; for a paper lower bound, whether our interval reaches it."""
    effect = o.claim.paper_effect
    if effect is None or o.interval is None or o.across is None:
        return MISSING
    paper, null, ours = effect.value, o.claim.null, o.across.estimate
    ratio = (ours - null) / (paper - null) if paper != null else math.nan
    low, high = o.across.low, o.across.high
    if math.isnan(low) or math.isnan(high):
        where = "no interval to place it in"
    elif effect.at_least:
        where = "our interval reaches it" if high >= paper else "our interval lies below it"
    else:
        where = ("inside our interval" if low <= paper <= high
                 else f"outside our interval ({'above' if paper > high else 'below'} it)")
    return f"{'<= ' if effect.at_least else ''}{ratio:.2f} x the paper's; the paper's value: {where}"


def paper_inside(o: Outcome) -> bool | None:
    """Whether the paper's value (or lower bound) is consistent with our interval; None without both."""
    effect = o.claim.paper_effect
    if effect is None or o.across is None or math.isnan(o.across.low) or math.isnan(o.across.high):
        return None
    if effect.at_least:
        return o.across.high >= effect.value
    return o.across.low <= effect.value <= o.across.high


def magnitude_summary(outcomes: Sequence[Outcome]) -> str:
    """One line: of the claims with a paper number and an interval, which hold in direction only (the verdict
    reproduces or partly reproduces the direction, the paper's value lies outside our interval) and which in size
    too."""
    placed = [(o, inside) for o in outcomes if (inside := paper_inside(o)) is not None]
    if not placed:
        return ""
    direction_only = [o.claim.id for o, inside in placed if not inside and o.verdict in ("reproduced", "partial")]
    sized = [o.claim.id for o, inside in placed if inside]
    outside = sum(not inside for _, inside in placed)
    return (f"**Magnitudes**: in {outside} of {len(placed)} claims with a paper number and an interval the paper's "
            f"value lies outside our 90 % interval. In direction only (verdict reproduced or partial, the paper's "
            f"size outside ours): {', '.join(direction_only) or 'none'}; in size too (the paper's value inside ours): "
            f"{', '.join(sized) or 'none'}.")


def side_cell(o: Outcome) -> str:
    """'8 of 8 (sign test p = 0.0039)': seeds on the claim's side of its margin and the exact one-sided sign test
    (within claims: seeds inside the margin); the count alone below ``MIN_VERDICT_SEEDS`` seeds."""
    seeds = len(o.interval.per_seed)
    text = f"{o.on_side} of {seeds}"
    return text if seeds < MIN_VERDICT_SEEDS else f"{text} (sign test p = {fmt_p(sign_test(o.on_side, seeds))})"


def _seed_list(seeds: Sequence[int | None]) -> str:
    return ", ".join(str(s) for s in seeds)


def declared_note(o: Outcome, seed_dates: Mapping[int | None, str]) -> str:
    """When the claim's rule took its present form (its latest dated change) against the days its seeds ran:
    '' when the rule predates every seed (or no day is known), else which seeds ran before it and which on its
    day (a day does not order a change and a run)."""
    if not o.claim.changes or not seed_dates:
        return ""
    fixed = max(change.date for change in o.claim.changes)
    seeds = o.seeds or tuple(sorted(seed_dates, key=lambda s: (s is None, s or 0)))
    before = [s for s in seeds if s in seed_dates and seed_dates[s] < fixed]
    same = [s for s in seeds if s in seed_dates and seed_dates[s] == fixed]
    if not before and not same:
        return ""
    parts = ([f"after seeds {_seed_list(before)} ran"] if before else []) + (
        [f"the day seeds {_seed_list(same)} ran"] if same else [])
    return f"; rule as of {fixed}: {', and on '.join(parts)}"

