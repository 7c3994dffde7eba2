"""Paper 002's claims judged: each claim by its test, the PE-vs-PE comparisons (``claims``) or the scratchpad
claims (``formats``, which build on ``claims``), so that neither module imports the other's dispatcher."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from nope_lightning.analysis.synthetic import formats
from nope_lightning.analysis.synthetic.cells import CellIndex
from nope_lightning.analysis.synthetic.claims import (
    SYNTHETIC_CLAIMS,
    SyntheticClaim,
    SyntheticOutcome,
    compare,
)
from nope_lightning.analysis.synthetic.robustness import CLAIM_RESAMPLES
from nope_lightning.analysis.verdicts import NotMeasured
from nope_lightning.results.synthetic import SyntheticCell


def evaluate_claims(cells: Iterable[SyntheticCell], resamples: int = CLAIM_RESAMPLES,
                    claims: Sequence[SyntheticClaim] = SYNTHETIC_CLAIMS) -> list[SyntheticOutcome]:
    """Each claim's outcome on ``cells`` (one or more grids'), its bootstraps of at least ``CLAIM_RESAMPLES``
    resamples; a claim whose cells are missing or unpaired is *not measured*, with the reason; a pre-registered
    claim (``SyntheticClaim.awaits``) reads its awaited seeds' cells only. Each outcome can judge its claim again on
    some seeds' cells alone (``rejudge``)."""
    cells, outcomes = list(cells), []
    index, resamples = CellIndex(cells), max(resamples, CLAIM_RESAMPLES)
    tests = {"scratchpad_split": formats.split, "scratchpad_helps": formats.helps, "scratchpad_format": formats.matters}
    for claim in claims:
        # a pre-registered claim reads the seeds it awaits alone, whatever else the results hold (a report pooling
        # seeds 0-2, run before its rule, with them)
        own = CellIndex([c for c in cells if c.seed in claim.awaits]) if claim.awaits else index
        try:
            outcome = tests.get(claim.test, compare)(claim, own, resamples)
        except NotMeasured as missing:
            # a pre-registered claim's reason speaks of its seeds: the results may hold what it lacks at others
            among = f"among seeds {', '.join(map(str, claim.awaits))}, " if claim.awaits else ""
            reason = among + str(missing) + (" (tested only where the results hold both formats)"
                                             if claim.conditional else "")
            outcome = SyntheticOutcome(claim, "not measured", reason=reason)
        outcomes.append(replace(outcome, rejudge=lambda seeds, claim=claim: evaluate_claims(
            [c for c in cells if c.seed in seeds], resamples, [claim])[0]))
    return outcomes
