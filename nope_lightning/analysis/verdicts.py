"""What a claim's test gives, for either paper's claims: its ``Outcome`` (the verdict with the intervals behind
it), ``NotMeasured`` when the runs it reads are missing, and ``verdict``, the two-sided t interval across seeds
against the claim's threshold (paper 002's claims, which declare no test, read it; paper 001's read their declared
test, ``lengthgen.claims.judge``). One seed has no spread to estimate: it gets ``NO_SEED_VERDICT``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nope_lightning.config.paper import Claim
from nope_lightning.numerics.stats import Interval


class NotMeasured(Exception):
    """A run or a figure a test needs is missing; the message says which."""


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
