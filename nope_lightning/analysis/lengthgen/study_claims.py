"""Which claims a report over several experiment files judges (a study split into files: seed slices, and the
baselines' own files beside NoPE's).

Every file's ``claims``, the first file's first and each once; then every claim of the papers (``CLAIMS_BY_ID``)
that compares methods no single file runs but the files together do, such as NoPE against RoPE where the RoPE
baselines run from files of their own: no file can list such a claim for its own report, where it would only be
*not measured*. Such a claim is judged like any other, on the seeds its methods share (``claim_tests.common_seeds``
pairs them by seed, whichever file ran them), so it gets no verdict below ``claims.MIN_VERDICT_SEEDS`` shared
seeds. One file, or files that all run the same methods, judge exactly their own claims.
"""

from __future__ import annotations

from collections.abc import Sequence

from nope_lightning.config.paper import CLAIMS_BY_ID
from nope_lightning.config.pipeline import PipelineConfig


def study_claims(first: Sequence[str], pipelines: Sequence[PipelineConfig | None]) -> list[str]:
    """The claim ids to judge (the module's rule): ``first`` (the first file's claims, or the report's own) and the
    other ``pipelines``' claims, each once, then the claims whose methods only the files together run."""
    files = [p for p in pipelines if p is not None]
    ids = list(dict.fromkeys([*first, *(c for p in files for c in p.claims)]))
    runs = [{step.label or step.id for step in p.steps} for p in files]
    together = set().union(*runs)
    return ids + [c for c, claim in CLAIMS_BY_ID.items()
                  if c not in ids and set(claim.methods) <= together
                  and not any(set(claim.methods) <= one for one in runs)]
