"""How far a synthetic claim's verdict can be trusted, three ways the claims table prints beside it:

* **The bootstrap's own error** (``quantile_se``): a percentile bound from R resamples is itself random. Its Monte
  Carlo standard error is read from the R resampled statistics by the binomial (order-statistic) method: the number
  of resamples below the true q-quantile is Binomial(R, q), standard deviation ``d = sqrt(R q (1 - q))``, so the
  empirical quantile wanders over the order statistics at positions ``(R - 1) q +- d``; half the distance between
  those two values is one standard error (the Maritz-Jarrett idea, without its Beta weights). It needs no extra
  resamples; ``tests/test_synthetic_new_seeds.py`` checks it against 20 independent bootstrap seeds of the same size.
  Printed as ``[low ±se, high ±se]``.
* **Leaving one task out** (``LeftOut``): the claim's effect and verdict recomputed without each of its tasks in turn;
  the range of the effects and the tasks whose removal flips the verdict.
* **New seeds** (``new_seeds``): the seeds that ran after the claim's rule took its present form (``RuleChange``
  dates, as ``rule_changes.exploratory_note`` reads them), on which alone the claim is judged again. A seed's day is
  the day its first pipeline run started (``sources.seed_days``: the earliest over the study's files, so a seed
  rerun later for one task still counts as old: the conservative side). A seed run on the rule's own day is not
  new: a day does not order the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np

from nope_lightning.analysis.markdown import MISSING, cell
from nope_lightning.analysis.synthetic.cells import BootInterval
from nope_lightning.config.paper import Claim
from nope_lightning.numerics.stats import LEVEL, Interval, Statistic, crossed_bootstrap

#: Resamples behind every bootstrap interval a synthetic claim prints (at least; a report asking for more gets more).
CLAIM_RESAMPLES = 10_000


def quantile_se(values: np.ndarray, q: float) -> float:
    """Monte Carlo standard error of ``np.quantile(values, q)`` (linear interpolation) over R resampled statistics
    ``values`` (R,): half the spread between the order statistics ``sqrt(R q (1 - q))`` positions either side of the
    quantile's (the binomial method, see the module). NaN without values."""
    x = np.sort(np.asarray(values, dtype=float))
    if x.size == 0:
        return math.nan
    at, d = (x.size - 1) * q, math.sqrt(x.size * q * (1 - q))
    low, high = (np.interp(p, np.arange(x.size), x) for p in (max(0.0, at - d), min(x.size - 1.0, at + d)))
    return float(high - low) / 2


def bounds_se(interval: Interval | None) -> tuple[float, float] | None:
    """The Monte Carlo standard errors of a bootstrap interval's two bounds, None for an interval without its
    resamples (a t interval, a Wilson interval)."""
    if not isinstance(interval, BootInterval) or interval.values.size == 0:
        return None
    tail = (1 - interval.level) / 2
    return quantile_se(interval.values, tail), quantile_se(interval.values, 1 - tail)


def crossed(values: np.ndarray, statistic: Statistic, resamples: int, seed: int = 0,
            level: float = LEVEL) -> BootInterval:
    """``stats.crossed_bootstrap`` of ``statistic`` over ``values`` (seeds, tasks, k), keeping its resampled
    statistics (the first call of ``statistic`` is on the R resamples, the second on all pairs)."""
    seen: list[np.ndarray] = []

    def keep(means: np.ndarray) -> np.ndarray:
        out = statistic(means)
        seen.append(np.asarray(out, dtype=float))
        return out

    interval = crossed_bootstrap(values, keep, resamples, seed, level)
    drawn = seen[0]
    return BootInterval(**{f.name: getattr(interval, f.name) for f in fields(Interval)},
                        values=drawn[np.isfinite(drawn)])


def spread_cell(interval: Interval | None, show: Callable[[float], str]) -> str:
    """``markdown.cell``, with each bound's Monte Carlo standard error beside it when the interval is a bootstrap
    that kept its resamples: 'est [low ±se, high ±se]'."""
    se = bounds_se(interval)
    if se is None or interval is None or math.isnan(interval.low) or math.isnan(interval.high):
        return cell(interval, show)
    low, high = (f"±{v:.3f}" if v >= 0.0005 else "±<0.001" for v in se)
    return cell(interval, show).replace(f"[{show(interval.low)}, {show(interval.high)}]",
                                        f"[{show(interval.low)} {low}, {show(interval.high)} {high}]")


# --- leaving one task out --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LeftOut:
    """The claim recomputed without ``task``: its effect (NaN for a claim without one number, the scratchpad
    claims) and verdict."""

    task: str
    effect: float
    verdict: str


def leave_one_out_text(left: Sequence[LeftOut], verdict: str, show: Callable[[float], str]) -> str:
    """'+0.05..+0.12; none flips the verdict' or '...; without copy: inconclusive' ('—' without tasks)."""
    if not left:
        return MISSING
    effects = [e.effect for e in left if not math.isnan(e.effect)]
    span = f"{show(min(effects))}..{show(max(effects))}; " if effects else ""
    flips = [f"without {e.task}: {e.verdict}" for e in left if e.verdict != verdict]
    return span + ("; ".join(flips) if flips else f"no task's removal flips it ({len(left)} tried)")


# --- new seeds -------------------------------------------------------------------------------------------------

def rule_day(claim: Claim) -> str:
    """The day (ISO, UTC) the claim's rule took its present form: its last dated change; '' when it has none (its
    rule was fixed before any run)."""
    return max((change.date for change in claim.changes), default="")


#: The seeds whose cells were read before paper 002's rules were changed (the first study's 0, 1 and 2): never *new*
#: to a rule changed since, whatever day they run. A rerun of one under a later recipe (the race) draws the same data
#: and initialisation streams the change was shaped on, so only a seed nobody has seen judges it afresh. A rule
#: fixed before any run (no dated change) saw none of them.
SEEN_SEEDS = (0, 1, 2)


def new_seeds(claim: Claim, seeds: Sequence[int | None], seed_dates: Mapping[int | None, str]) -> list[int | None] | None:
    """Those of ``seeds`` that ran after the claim's rule took its present form (strictly after its day), less
    ``SEEN_SEEDS`` when that rule was changed after a run; None when none of them has a known day."""
    known = [s for s in seeds if s in seed_dates]
    if not known:
        return None
    fixed = rule_day(claim)
    seen = SEEN_SEEDS if fixed else ()
    return [s for s in known if seed_dates[s] > fixed and s not in seen]
