"""How a claim declares its test before any run (``paper.Claim``'s ``scale``, ``inference``, ``null`` and margin),
the dated history of its rule (``RuleChange``), the paper's magnitude in its units (``PaperEffect``) and what must
hold before it is tested at all (``Precondition``); and the check, at load, that every claim declares them
(``check_claims``: one line for the first that does not)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The scales a claim's effect is tested on: ``log`` for a strictly positive, multiplicative effect (its seeds
#: differ by factors: the t test reads ln(effect) against ln(margin), and a seed <= 0 cannot reproduce it),
#: ``raw`` otherwise.
SCALES = ("log", "raw")
#: The tests (``stats.monotone_verdict``): ``superiority`` and ``non-inferiority`` are one-sided Student tests at
#: 95 % (the margin on the claim's side of ``null``, or on the other side: "no more than m worse"),
#: ``equivalence`` is TOST (two one-sided tests at 95 %: the 90 % interval inside +-margin).
INFERENCES = ("superiority", "non-inferiority", "equivalence")
@dataclass(frozen=True)
class RuleChange:
    """A change to how a claim is judged, made on ``date`` (ISO, UTC) for ``reason``: a report of a run made
    before that date says its claim was judged by a rule fixed after the run. ``seen``: the rule was chosen after
    looking at the results it judges, so runs on its own day are before it too."""

    date: str
    reason: str
    seen: bool = False


@dataclass(frozen=True)
class PaperEffect:
    """The paper's magnitude of a claim's effect in the claim's own units, ``value``, derived as ``how`` from its
    published numbers; ``at_least``: the paper gives only a lower bound."""

    value: float
    how: str
    at_least: bool = False


def claim_problem(claim: Any) -> str:
    """Why ``claim`` (a ``paper.Claim``; this module sits below it)'s test is not fully declared, in one line ('' when it is): a scale and a test from the
    lists, an equivalence test exactly for a ``within`` claim, and a margin on the right side of ``null``
    (superiority: on the claim's side; non-inferiority: strictly on the other; equivalence, log scale: > 0)."""
    where = f"claim {claim.id!r}"
    if claim.scale not in SCALES:
        return f"{where} declares no scale: scale='log' for a strictly positive multiplicative effect, else 'raw'"
    if claim.inference not in INFERENCES:
        return f"{where} declares no test: inference= one of {', '.join(INFERENCES)}"
    if (claim.inference == "equivalence") != (claim.side == "within"):
        return f"{where}: an equivalence test is for a 'within' claim and only for one (side {claim.side!r})"
    direction = {"above": 1, "below": -1, "within": 0}[claim.side]
    offset = (claim.threshold - claim.null) * direction
    if claim.inference == "superiority" and offset < 0:
        return (f"{where}: margin {claim.threshold:g} lies on the wrong side of the null {claim.null:g} for a "
                f"superiority test 'effect {claim.side} margin'")
    if claim.inference == "non-inferiority" and offset >= 0:
        return (f"{where}: a non-inferiority margin lies strictly beyond the null {claim.null:g} on the other "
                f"side (got {claim.threshold:g}, side {claim.side!r})")
    partial = getattr(claim, "partial", None)
    if partial is not None and not 0 < (claim.threshold - partial) * direction <= offset:
        return (f"{where}: its partial margin {partial:g} must lie between the null {claim.null:g} and its margin "
                f"{claim.threshold:g}")
    if (claim.inference == "equivalence" or claim.scale == "log") and claim.threshold <= 0:
        return f"{where}: margin {claim.threshold:g} must be > 0 for {claim.inference} on the {claim.scale} scale"
    return ""


def check_claims(claims: tuple[Any, ...]) -> None:
    """Raise, in one line, for the first claim whose test is not declared (``claim_problem``)."""
    for claim in claims:
        if problem := claim_problem(claim):
            raise ValueError(problem)


@dataclass(frozen=True)
class Precondition:
    """What must hold before a claim can be tested at all (else its verdict is ``fails_as``, *untestable* unless
    the failure is itself a finding).

    ``passkey_at_least``: every method in ``methods`` retrieves at least ``value`` of its passkeys at
    ``multiple`` x L, mean over seeds (a retrieval claim means nothing for a model that cannot retrieve in
    distribution); with ``inside_L``, on the prompts answered wholly inside L (prompt + answer tokens <= L) where
    the evaluation has them, else on the L-token prompts (an L-token prompt decodes its answer tokens 2-6 past L,
    so it reads retrieval just past L, not in distribution); ``tables_differ``: the two methods' per-head
    temperature tables differ somewhere by at least ``value`` (an ablation that converged to the full method's
    table, from its own tuning data, shows that the ablated part had no effect here: its claims say so through
    ``fails_as``, not *untestable*); ``ppl_ratio_at_least``: the first method's PPL(``multiple`` L) / PPL(L) is at least ``value`` (pooled over seeds: a repair needs a
    failure to repair, ``FAILURE_RATIO``); ``inflection_inside``: every method's per-position log-PPL has an
    inflection inside its measured curve in every seed (an inflection that lies beyond the curve cannot be
    compared or moved).
    """

    kind: str
    methods: tuple[str, ...]
    value: float = 0.0
    multiple: int = 1
    fails_as: str = "untestable"
    inside_L: bool = False

    def __post_init__(self) -> None:
        if self.inside_L and (self.kind != "passkey_at_least" or self.multiple != 1):
            raise ValueError("Precondition.inside_L reads retrieval in distribution: only passkey_at_least at 1x")
