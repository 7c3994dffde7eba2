"""When a claim's rule took its present form against the runs it judges, for either paper's claims: the report's
list of the rules changed on or after its runs (``changed_rules_section``) and the *exploratory* note on a verdict
whose rule was set after every seed it judges had run (``exploratory_note``), a seed dated by the rows the claim
reads there where their days are known (``read_days``). Dates are ISO days, UTC."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nope_lightning.analysis.verdicts import Outcome
from nope_lightning.config.paper import Claim


def changed_rules_section(claims: Sequence[Claim], run_dates: Sequence[str]) -> str:
    """Every rule of ``claims`` changed on or after the earliest of the reported runs' dates (ISO, UTC; a change
    on the run's own day is listed: a date does not order them), or every change when no date is known."""
    first = min(run_dates, default="")
    changes = sorted({(change.date, change.reason, claim.id) for claim in claims for change in claim.changes
                      if change.date >= first})
    if not changes:
        return ""
    when = (f"on or after the run ({first})" if first
            else "— the run's date is not in its results, so every change is listed")
    by_change: dict[tuple[str, str], list[str]] = {}
    for date, reason, claim_id in changes:
        by_change.setdefault((date, reason), []).append(claim_id)
    return (f"### Rules changed {when}\n\n"
            + "\n".join(f"* {date}: {reason} ({', '.join(ids)})" for (date, reason), ids in sorted(by_change.items())))


def exploratory_note(o: Outcome, seed_dates: Mapping[int | None, str]) -> str:
    """'' unless the claim's rule took its present form after every seed it judges had run (on a later day, or on
    the last seed's day by a change chosen after seeing its results, ``RuleChange.seen``): then the verdict is
    exploratory until seeds run after the rule judge it, and the note says so."""
    if not o.claim.changes or not seed_dates:
        return ""
    seeds = [s for s in (o.seeds or seed_dates) if s in seed_dates]
    if not seeds:
        return ""
    last = max(seed_dates[s] for s in seeds)
    if (fixed := max(change.date for change in o.claim.changes)) > last:
        return f"*exploratory*: its rule was set on {fixed}, after all {len(seeds)} seeds it judges ran"
    if seen := [change.date for change in o.claim.changes if change.seen and change.date >= last]:
        return (f"*exploratory*: its rule was chosen on {max(seen)} after the results of the {len(seeds)} seeds it "
                "judges were seen; new seeds must judge it")
    return ""


def read_days(claim: Claim, seed_dates: Mapping[int | None, str],
              row_dates: Mapping[tuple[str, int | None], str] | None = None) -> dict[int | None, str]:
    """Seed -> the day the earliest row ``claim`` reads at that seed was made (its methods' rows; ``row_dates``:
    ``(method, seed) -> day``, ``sources.row_days``), so a seed is after a rule only when every row the claim
    reads there was made after it; the seed's own day (``seed_dates``) where none of its methods has a dated row,
    and ``seed_dates`` as given without ``row_dates``."""
    if not row_dates:
        return dict(seed_dates)
    days = {}
    for seed, day in seed_dates.items():
        read = [row_dates[method, seed] for method in claim.methods if (method, seed) in row_dates]
        days[seed] = min(read) if read else day
    return days
