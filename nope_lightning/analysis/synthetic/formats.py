"""Paper 002's scratchpad claims (Kazemnejad et al. 2023, abstract: "scratchpad is not always helpful to solve length
generalization and its format highly impacts the model's performance"), on the cells of one task in two scratchpad
formats. Each task's effect is OOD exact match in one format minus the other, mean over the PEs compared, one value
per seed, read through Student's t interval across seeds (``claims``' choices); its evaluation-only interval
bootstraps the task's test examples, paired across its cells. Three claims:

* ``split`` (``scratchpad_helps_some_tasks``, exploratory): full minus none, over the PEs run in both formats (often
  two), every one of them at the ID floor with the full scratchpad; a task helps when its interval clears 0, does
  not when it lies at or below 0; some tasks and not others (``some_and_not_others``) over at least ``MIN_TASKS``.
* ``helps`` (``scratchpad_not_always_helpful``, pre-registered on 2026-11-28 before seeds 3-5 ran): full minus none
  over the 5 PEs, on the tasks learned (``claims.learned``) both with and without the scratchpad. A task *helps*
  when its lower bound is above ``EM_EFFECT`` and *does not* when its upper bound is at or below it (the mirror:
  an interval merely reaching below ``EM_EFFECT`` would let noise alone make the claim true); reproduced when a task
  helps and another does not. Two tasks suffice: the claim is that such a pair exists.
* ``matters`` (``scratchpad_format_matters``, pre-registered likewise): full minus minimal over the 5 PEs, every task
  run in both (no ID filter: a format that keeps a task from being learned is an impact of the format); reproduced
  when some task's interval excludes 0, not reproduced when every task's lies within +-``EM_EFFECT``.

The two pre-registered claims are judged on the seeds run after their rule only (``SyntheticClaim.awaits``: a
report pooling earlier seeds with them still reads those alone; the claims table asks ``SyntheticOutcome.rejudge``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from nope_lightning.analysis.synthetic.cells import FULL, NONE, CellIndex, accuracy, paired_bootstrap
from nope_lightning.analysis.synthetic.claims import (
    MIN_TASKS,
    TOO_FEW,
    SyntheticClaim,
    SyntheticOutcome,
    _passing,
)
from nope_lightning.analysis.synthetic.robustness import LeftOut
from nope_lightning.analysis.verdicts import NO_SEED_VERDICT, NotMeasured, verdict
from nope_lightning.numerics.stats import Interval, t_interval

MINIMAL = "minimal"
#: What a task's verdict says in the claims table, per test.
WORDS = {"scratchpad_split": {"reproduced": "helps", "not reproduced": "does not help", "inconclusive": "unclear",
                              NO_SEED_VERDICT: "1 seed"},
         "scratchpad_format": {"reproduced": "format matters", "not reproduced": "no difference",
                               "inconclusive": "unclear", NO_SEED_VERDICT: "1 seed"}}
WORDS["scratchpad_helps"] = WORDS["scratchpad_split"]


def _task(claim: SyntheticClaim, index: CellIndex, task: str, seeds: Sequence[int], pes: Sequence[str],
          formats: tuple[str, str], resamples: int, judge: Callable[[Interval], str]) -> SyntheticOutcome:
    """One task's effect: OOD exact match in ``formats[0]`` minus ``formats[1]``, mean over ``pes``, per seed."""
    columns = [(formats[0], pe) for pe in pes] + [(formats[1], pe) for pe in pes]
    grid, n = index.grid([task], seeds, columns), len(pes)

    def effect(a: np.ndarray) -> np.ndarray:  # (..., seeds, 1, 2n) -> (..., seeds)
        return (a[..., :n] - a[..., n:]).mean(-1)[..., 0]

    across = t_interval(effect(accuracy(grid, "ood")))
    evaluation = paired_bootstrap(grid, lambda a: effect(a).mean(-1), resamples)
    found = judge(across) if len(seeds) > 1 else NO_SEED_VERDICT
    return SyntheticOutcome(claim, found, evaluation, tuple(seeds), across=across, tasks=(task,))


def split(claim: SyntheticClaim, index: CellIndex, resamples: int) -> SyntheticOutcome:
    """The exploratory scratchpad claim: each task's full-minus-none effect, then whether some help and others not."""
    tasks = [t for t in index.tasks(FULL) if t in index.tasks(NONE)]
    if not tasks:
        raise NotMeasured("the results hold no task run both with a full scratchpad and without one")
    effects, left_out = [], [(t, "run with a full scratchpad only") for t in index.tasks(FULL) if t not in tasks]
    for task in tasks:
        seeds = index.seeds(FULL, [task])
        pes = [pe for pe in claim.methods
               if all((task, pad, pe, seed) in index.cells for pad in (FULL, NONE) for seed in seeds)]
        if not pes:
            left_out.append((task, "no PE run in both formats in every seed"))
            continue
        full = [(FULL, pe) for pe in pes]
        kept, failed, _ = _passing(claim, index.grid([task], seeds, full), [task], full)  # the format run with
        left_out += failed
        if kept:
            effects.append(_task(claim, index, task, seeds, pes, (FULL, NONE), resamples,
                                 lambda across: verdict(claim, across)))
    return _overall(claim, effects, left_out, tuple(index.seeds(FULL, tasks)), some_and_not_others, MIN_TASKS,
                    "learned with a full scratchpad")


def helps(claim: SyntheticClaim, index: CellIndex, resamples: int) -> SyntheticOutcome:
    """The pre-registered "not always helpful": full minus none over the 5 PEs, on the tasks learned in both."""
    both = [t for t in index.tasks(FULL) if t in index.tasks(NONE)]
    if not both:
        raise NotMeasured("the results hold no task run both with a full scratchpad and without one")
    formats = [[(pad, pe) for pe in claim.methods] for pad in (FULL, NONE)]
    tasks, seeds, left_out = index.complete(both, formats[0] + formats[1])
    effects = []
    for task in tasks:
        passed = [_passing(claim, index.grid([task], seeds, columns), [task], columns) for columns in formats]
        if all(kept for kept, _, _ in passed):
            effects.append(_task(claim, index, task, seeds, claim.methods, (FULL, NONE), resamples,
                                 lambda across: verdict(claim, across)))
        else:
            left_out += [(task, f"not learned {where}: {why}") for (kept, failed, _), where in
                         zip(passed, ("with the full scratchpad", "without a scratchpad"), strict=True)
                         if not kept for _, why in failed]
    return _overall(claim, effects, left_out, tuple(seeds), some_and_not_others, 2, "learned in both formats")


def matters(claim: SyntheticClaim, index: CellIndex, resamples: int) -> SyntheticOutcome:
    """The pre-registered "format matters": full minus minimal over the 5 PEs, every task run in both."""
    both = [t for t in index.tasks(FULL) if t in index.tasks(MINIMAL)]
    if not both:
        raise NotMeasured("the results hold no task run with both the full and the minimal scratchpad")
    columns = [(pad, pe) for pad in (FULL, MINIMAL) for pe in claim.methods]
    tasks, seeds, left_out = index.complete(both, columns)

    def judge(across: Interval) -> str:
        if across.low > 0 or across.high < 0:
            return "reproduced"
        inside = -claim.threshold <= across.low and across.high <= claim.threshold
        return "not reproduced" if inside else "inconclusive"

    effects = [_task(claim, index, task, seeds, claim.methods, (FULL, MINIMAL), resamples, judge) for task in tasks]
    return _overall(claim, effects, left_out, tuple(seeds), some_task, 1, "run in both formats")


def _overall(claim: SyntheticClaim, effects: list[SyntheticOutcome], left_out: list[tuple[str, str]],
             seeds: tuple[int, ...], rule: Callable[[Sequence[str], int], str], fewest: int,
             which: str) -> SyntheticOutcome:
    """The claim's outcome from its tasks' (``effects``), by ``rule`` over at least ``fewest`` tasks."""
    overall = rule([e.verdict for e in effects], fewest)
    reason = f"{len(effects)} of at least {fewest} tasks {which}" if overall == TOO_FEW else ""
    loto = tuple(LeftOut(e.tasks[0], math.nan, rule([o.verdict for o in effects if o is not e], fewest))
                 for e in effects)
    return SyntheticOutcome(claim, overall, seeds=seeds, reason=reason, tasks=tuple(e.tasks[0] for e in effects),
                            left_out=tuple(left_out), by_task=tuple(effects), loto=loto)


def some_and_not_others(verdicts: Sequence[str], fewest: int) -> str:
    """A "some tasks and not others" claim's verdict from its tasks' (each "reproduced": the effect is there, "not
    reproduced": it is not, or undecided): reproduced when one task has it and another has not; not reproduced
    when every task is decided the same way (all, or none); inconclusive otherwise; ``TOO_FEW`` under ``fewest``
    tasks."""
    found = set(verdicts)
    if len(verdicts) < fewest:
        return TOO_FEW
    if found == {NO_SEED_VERDICT}:
        return NO_SEED_VERDICT
    if {"reproduced", "not reproduced"} <= found:
        return "reproduced"
    # having it in every task, or in none, fails the claim; an undecided task leaves it open
    return "not reproduced" if found in ({"reproduced"}, {"not reproduced"}) else "inconclusive"


def some_task(verdicts: Sequence[str], fewest: int) -> str:
    """A "some task" claim's verdict: reproduced when a task has the effect, not reproduced when every task is
    decided against it, inconclusive otherwise; ``TOO_FEW`` under ``fewest`` tasks."""
    found = set(verdicts)
    if len(verdicts) < fewest:
        return TOO_FEW
    if found == {NO_SEED_VERDICT}:
        return NO_SEED_VERDICT
    if "reproduced" in found:
        return "reproduced"
    return "not reproduced" if found == {"not reproduced"} else "inconclusive"
