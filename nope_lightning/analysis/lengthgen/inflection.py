"""Where a per-position curve inflects: the position past which a length-generalization failure shows (paper 001
§2.3, Fig 1-2: the inflection of attention entropy and that of perplexity).

Definition (``inflection``): over equal-width position buckets, the curve's in-distribution level is its
token-weighted mean over the buckets inside [L/2, L); the inflection is the start, in multiples of L, of the
first bucket past L from which *every* later bucket lies more than ``rise`` above that level. Why:

- the level comes from [L/2, L), not [0, L): the first positions have little context, so their log-PPL is high
  for a reason that has nothing to do with length; the second half of the training window is the model in
  distribution with long context, the reference a failure past L departs from;
- the search starts at L: a length-generalization failure lies past the training length by definition;
- "every later bucket" rather than "the first bucket above": one noisy bucket must not place an inflection, and a
  failure does not recover (paper 001's curves rise and stay up);
- a rise over a level, not a slope or a second difference: the curves are 32 buckets of 64 windows, whose bucket
  noise a finite difference amplifies, while a level shift of ``rise`` is many standard errors.

A curve with no inflection inside it gets the curve's end (``edges[-1] / L``): a lower bound, which is what a
flat curve (RoPE-NTK) or a repair that holds to the end means.

Attention entropy (``trend=True``) is measured against its in-distribution *trend*, not a level: a query at
position i attends over i + 1 keys, so entropy grows with position even in a model that generalizes (diffuse
attention over i keys has entropy ln i). Measured on the 12 x 64 NoPE models of
``experiments/regime_study/regime_study.yaml``, it rises ~0.2 nats per 32-token bucket already inside [L/2, L),
so against a level every entropy curve — NoPE, lambda 1.5, HeadScale alike — "inflected" at exactly L, and the
Fig 1-2 claims compared nothing. The trend is the
least-squares line ``a + b ln(bucket centre)`` over the buckets inside [L/4, L) (three buckets of 32 at L = 128:
enough for a slope; the first L/4 positions are the short-context start), extrapolated past L: what the model's
entropy would do if it kept its in-distribution behaviour. The inflection is where the curve leaves that line for
good by more than ``rise`` — paper 001's "steeply increasing point" of the entropy curve.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def inflection(means: np.ndarray, edges: Sequence[int], train_len: int, rise: float,
               trend: bool = False) -> np.ndarray:
    """The inflection of many curves at once: ``means`` (R, buckets) per-bucket means (nats) over the buckets
    ``edges`` (tokens, buckets + 1 values) -> (R,) positions in multiples of ``train_len`` (the curve's end when
    it does not inflect; NaN where its level is undefined). ``trend``: against the extrapolated in-distribution
    line in ln(position) (module doc; attention entropy) instead of the [L/2, L) level. ``ValueError`` when no
    bucket lies inside [L/2, L) or past L."""
    edges = np.asarray(edges, dtype=np.float64)
    starts, ends = edges[:-1], edges[1:]
    means = np.atleast_2d(np.asarray(means, dtype=np.float64))
    if means.shape[-1] != len(starts):
        raise ValueError(f"{means.shape[-1]} bucket means for {len(starts)} buckets")
    inside = (starts >= train_len / 2) & (ends <= train_len)
    past = starts >= train_len
    if not inside.any() or not past.any():
        raise ValueError(f"an inflection needs buckets inside [L/2, L) and past L (L = {train_len}, buckets "
                         f"{edges[0]:g}..{edges[-1]:g} by {ends[0] - starts[0]:g})")
    widths = ends - starts
    if trend:
        fit = (starts >= train_len / 4) & (ends <= train_len)
        design = np.stack([np.ones(len(starts)), np.log((starts + ends) / 2)], 1)
        coefficients = np.linalg.pinv(design[fit]) @ means[:, fit].T  # (2, R): intercept and slope per curve
        baseline = (design @ coefficients).T  # (R, buckets): the in-distribution line, extrapolated
        level = coefficients[0]
    else:
        level = (means[:, inside] * widths[inside]).sum(-1) / widths[inside].sum()
        baseline = np.repeat(level[:, None], len(starts), 1)
    above = means[:, past] > baseline[:, past] + rise  # NaN compares False: an undefined bucket is not above
    # stays[:, j]: every bucket from j on is above (a suffix "all", by cumulative products from the end)
    stays = np.flip(np.cumprod(np.flip(above, -1), -1), -1).astype(bool)
    position = starts[past][stays.argmax(-1)] / train_len
    position = np.where(stays.any(-1), position, edges[-1] / train_len)
    return np.where(np.isfinite(level), position, np.nan)


def inflected(position: np.ndarray | float, edges: Sequence[int], train_len: int) -> np.ndarray | bool:
    """Whether an ``inflection`` lies inside its curve (not the end stand-in)."""
    return np.asarray(position) < edges[-1] / train_len
