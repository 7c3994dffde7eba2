"""What the claims that rank the PEs over tasks (the MRR claims, the "NoPE beats" ones) give on the reference's own
published results (``reference_results.json``: paper 002's per-(task, seed) test exact match, from its authors'
repository, 39 of the paper's 51 queries; where only reciprocal ranks were published, those), run through the very
test the claims table applies to ours (``judge.evaluate_claims``). A claim the paper's own numbers do not
reproduce under our test says more about the test, or the paper, than about our runs.

The reference publishes no in-distribution exact match per query here, so its every task counts as learned; the
exact-match claims (``ood_margin``) read only the tasks with published exact matches (a reciprocal rank is no exact
match), the MRR claims every task (a ranking needs only the order, which reciprocal ranks keep). Its seeds are the
reference's (146317, 234054, 256788)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path

from nope_lightning.analysis.markdown import cell
from nope_lightning.analysis.synthetic.claims import SyntheticClaim, SyntheticOutcome
from nope_lightning.analysis.synthetic.judge import evaluate_claims
from nope_lightning.results.synthetic import SyntheticCell

REFERENCE = Path(__file__).with_name("reference_results.json")
RANKING_TESTS = ("mrr_margin", "ood_margin")


@cache
def reference_cells(exact_match_only: bool) -> tuple[SyntheticCell, ...]:
    """The reference's queries as cells without a scratchpad (ID exact match 1: learned; no per-example record):
    those with a published exact match, or every one (``exact_match_only`` False) with reciprocal ranks as
    scores."""
    queries = json.loads(REFERENCE.read_text())["queries"]
    return tuple(SyntheticCell(f"reference/{q['task']}/{pe}/{q['seed']}", q["task"], pe, q["seed"], "none", 0, 0, 1.0,
                               float(score), 1.0, 0, 0, 0.0, 0.0, 0, [])
                 for q in queries if not exact_match_only or "test_acc" in q
                 for pe, score in q.get("test_acc", q.get("reciprocal_rank")).items())


def calibrate(claim: SyntheticClaim) -> SyntheticOutcome:
    """``claim`` tested on the reference's published results."""
    return evaluate_claims(reference_cells(claim.test == "ood_margin"), claims=[claim])[0]


def calibration_lines(claims: Sequence[SyntheticClaim], show: Callable[[float], str]) -> str:
    """One line per claim that ranks PEs over tasks: 'calibration: the reference's published results give
    <effect> -> <verdict>'; '' without such a claim."""
    lines = []
    for claim in (c for c in claims if getattr(c, "test", "") in RANKING_TESTS):
        o = calibrate(claim)
        effect = f"{cell(o.across, show)} {claim.unit}" if o.across else o.reason
        lines.append(f"* `{claim.id}` — calibration: the reference's published results give {effect} -> "
                     f"**{o.verdict}** ({len(o.tasks)} tasks, {o.queries} queries)")
    return ("**Calibration**: each claim ranking PEs over tasks, tested the same way on the reference's published "
            "per-(task, seed) results (paper 002's authors' repository: 39 of its 51 queries; no ID accuracies "
            "published, so every task counts as learned; the exact-match claims read the tasks with a published "
            "exact match):\n\n" + "\n".join(lines)) if lines else ""
