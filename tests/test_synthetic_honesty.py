"""Paper 002's verdicts say what was decided after the data: each task's chance exact match from its generator,
PEs within noise of chance tied in the rankings, the dated rule changes listed, and a verdict whose rule was chosen
after its data marked *exploratory*."""

from __future__ import annotations

import numpy as np
import pytest

from nope_lightning.analysis.rule_changes import changed_rules_section, exploratory_note
from nope_lightning.analysis.synthetic.chance import at_chance, chance
from nope_lightning.analysis.synthetic.claims import (
    EM_EFFECT,
    SYNTHETIC_CLAIMS,
    SyntheticOutcome,
    mrr_intervals,
)
from nope_lightning.analysis.synthetic.grid import mrr_with_ties
from nope_lightning.analysis.synthetic.tables import claims_table
from tests.conftest import REPO
from tests.test_synthetic_claims import PES, grid

CLAIM = {claim.id: claim for claim in SYNTHETIC_CLAIMS}
REPORT = REPO / "experiments" / "synthetic" / "results" / "report.md"


def test_chance_is_one_over_the_answer_alphabet_computed_from_the_generator():
    assert chance("parity") == 0.5  # even / odd
    assert chance("lego") == 0.5  # +1 / -1
    assert chance("summation") == pytest.approx(0.1)  # one digit
    assert chance("copy") == 0.0 and chance("scan") == 0.0  # answers are sequences
    assert chance("no_such_task") == 0.0


def test_two_pes_within_noise_of_chance_tie_and_one_above_it_stays_ahead():
    # parity: NoPE 0.54 and T5 0.44 are two coins (<= 0.5 + EM_EFFECT), ALiBi 0.70 is not
    acc = np.array([[0.54, 0.44, 0.70]])  # (tasks, PEs)
    floored = at_chance(acc, ["parity"], EM_EFFECT)
    assert floored.tolist() == [[0.5, 0.5, 0.70]]
    ranks = mrr_with_ties({pe: floored[:, c] for c, pe in enumerate(("nope", "t5", "alibi"))})
    assert ranks == {"nope": pytest.approx(1 / 2.5), "t5": pytest.approx(1 / 2.5), "alibi": 1.0}
    # on copy (chance 0) the same floor ties 0.04 with 0.00, and keeps 0.06 above them
    assert at_chance(np.array([[0.04, 0.0, 0.06]]), ["copy"], EM_EFFECT).tolist() == [[0.0, 0.0, 0.06]]


def test_our_mrr_ties_pes_at_chance_on_parity():
    # NoPE a coin above T5's coin on every seed, the others below chance: all five share rank 3
    ood = {"nope": 0.54, "t5": 0.44, "alibi": 0.52, "rope": 0.30, "sinusoidal": 0.48}
    mrr, learned = mrr_intervals(grid(lambda t, pe, s: ood[pe], tasks=("parity",)), resamples=100)
    assert learned == ["parity"]
    assert [mrr[pe].estimate for pe in PES] == pytest.approx([1 / 3] * 5)


def test_the_scratchpad_verdict_is_exploratory_its_rule_chosen_the_day_its_seeds_ran():
    claim = CLAIM["scratchpad_helps_some_tasks"]
    scratchpad = SyntheticOutcome(claim, "reproduced", seeds=(0, 1, 2))
    same_day = {0: "2026-11-27", 1: "2026-11-27", 2: "2026-11-27"}
    assert exploratory_note(scratchpad, same_day) == (
        "*exploratory*: its rule was chosen on 2026-11-27 after the results of the 3 seeds it judges were seen; new "
        "seeds must judge it")
    assert exploratory_note(scratchpad, {**same_day, 2: "2026-11-28"}) == ""  # a seed run after the rule judges it
    row = next(line for line in claims_table([scratchpad], same_day).splitlines() if line.startswith(f"| {claim.text}"))
    assert row.endswith("| — no seed ran after the rule (2026-11-27) | — | **reproduced**: *exploratory*: its rule "
                        "was chosen on 2026-11-27 after the results of the 3 seeds it judges were seen; new seeds "
                        "must judge it |")  # no seed to judge it anew, no task to leave out; the verdict last
    # a rule changed after every seed ran (the chance floor, 2026-11-28) marks a ranking claim too
    ranking = SyntheticOutcome(CLAIM["nope_highest_mrr"], "inconclusive", seeds=(0, 1, 2))
    assert exploratory_note(ranking, same_day).startswith("*exploratory*: its rule was set on 2026-11-28")


def test_the_rules_changed_since_the_run_are_listed_with_their_claims():
    section = changed_rules_section(SYNTHETIC_CLAIMS, ["2026-11-27"])
    assert section.startswith("### Rules changed on or after the run (2026-11-27)")
    assert "* 2026-11-27: the scratchpad claim's ID precondition reads the full-scratchpad cells" in section
    assert "(scratchpad_helps_some_tasks)" in section
    assert ("* 2026-11-28: an OOD exact match at or below its task's chance + 0.05 counts as chance for every PE "
            "(parity, LEGO: 0.5), so PEs at chance tie (nope_beats_ape_rotary_on_primitives, nope_highest_mrr, "
            "nope_outperforms_explicit_pes, t5_best_explicit_mrr)") in section
    assert changed_rules_section(SYNTHETIC_CLAIMS, ["2026-11-29"]) == ""


def test_the_committed_report_lists_the_rules_and_marks_the_scratchpad_verdict():
    text = REPORT.read_text()
    assert "### Rules changed on or after the run (2026-11-27)" in text
    row = next(line for line in text.splitlines() if line.startswith("| a full scratchpad helps some tasks"))
    assert "| **reproduced**: *exploratory*: its rule was chosen on 2026-11-27" in row
    assert "| task | seed | chance | NoPE |" in text and "| parity | 0 | 0.50 |" in text and "| lego | 0 | 0.50 |" in text
