"""Paper 002's claims on made-up grid results (``analysis.synthetic.claims``): every claim gives each verdict it can
(an effect in every seed -> reproduced, its opposite -> not reproduced, seeds that disagree -> inconclusive, fewer
than four learned tasks -> too few tasks learned; one seed -> no verdict about seeds), superiority read as the paper
states it, our MRR and its crossed bootstrap against an enumeration by hand, the paper's MRR against the reference's
own published results (``tests/data/paper002_reference_mrr.json``), Wilson against its formula, and differences
paired example by example (where an unpaired interval would be another number). The stage records what pairing
needs, checked on tiny real runs."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from nope_lightning.analysis.synthetic.cells import CellIndex, exact_match
from nope_lightning.analysis.synthetic.claims import (
    EM_EFFECT,
    MIN_TASKS,
    PAPER_TASKS,
    PRIMITIVE_TASKS,
    SYNTHETIC_CLAIMS,
    TOO_FEW,
    learned,
    mrr_intervals,
    paper_way_mrr,
)
from nope_lightning.analysis.synthetic.grid import PAPER_ROW_ORDER, mrr_row_order, mrr_with_ties, paper_mrr
from nope_lightning.analysis.synthetic.judge import evaluate_claims
from nope_lightning.analysis.synthetic.robustness import CLAIM_RESAMPLES
from nope_lightning.analysis.synthetic.tables import claims_table, exact_match_table
from nope_lightning.analysis.verdicts import NO_SEED_VERDICT, NotMeasured
from nope_lightning.config import load_config
from nope_lightning.config.paper import SYNTHETIC_MRR
from nope_lightning.config.synthetic import SyntheticConfig
from nope_lightning.numerics.stats import wilson
from nope_lightning.results import BucketAccuracy, SyntheticCell
from nope_lightning.results.synthetic import problems_digest
from nope_lightning.stages import synthetic as stage
from nope_lightning.synthetic import make_split
from tests.conftest import REPO

PES = ("nope", "t5", "alibi", "rope", "sinusoidal")
SEEDS = (0, 1, 2)
N, N_ID = 200, 100  # test (OOD) and validation (ID) examples per cell
RESAMPLES = 400
CLAIM = {claim.id: claim for claim in SYNTHETIC_CLAIMS}


def make_cell(task: str, pe: str, seed: int, correct, id_acc: float = 1.0, scratchpad: str = "none",
              digest: str | None = None) -> SyntheticCell:
    """A cell whose test examples are right where ``correct`` (N booleans) is, or the first ``round(correct * N)``
    when it is an accuracy; one ID and one OOD bucket, as a run of the copy tasks would have them."""
    right = np.arange(N) < round(correct * N) if np.isscalar(correct) else np.asarray(correct, dtype=bool)
    ood, id_right = float(right.mean()), round(id_acc * N_ID)
    return SyntheticCell(f"{task}/{scratchpad}/{pe}/{seed}", task, pe, seed, scratchpad, 20, 40, id_right / N_ID, ood,
                         1.0, 100, 100, 1.0, 1.0, 1000, [BucketAccuracy("1-20", "id", N_ID, id_right / N_ID),
                                                        BucketAccuracy("21-40", "ood", len(right), ood)],
                         ood_correct=tuple(right.tolist()), test_digest=digest or f"{task}/seed {seed}")


# 4 primitive ones, so every claim has 4, in the registry's order (the order a report reads tasks in)
TASKS = ("copy", "copy_2x", "reverse", "reverse_2x", "addition", "sort")


def grid(ood, tasks=TASKS, seeds=SEEDS, id_acc=lambda task, pe: 1.0,
         scratchpad: str = "none") -> list[SyntheticCell]:
    """One cell per (task, PE, seed) with OOD exact match ``ood(task, pe, seed)``."""
    return [make_cell(task, pe, seed, ood(task, pe, seed), id_acc(task, pe), scratchpad)
            for task in tasks for pe in PES for seed in seeds]


def outcome(claim_id: str, cells):
    return evaluate_claims(cells, RESAMPLES, [CLAIM[claim_id]])[0]


ORDER = {"nope": 0.8, "t5": 0.6, "alibi": 0.5, "rope": 0.3, "sinusoidal": 0.1}  # the paper's order, NoPE first


def jitter(seed: int) -> float:
    return 0.01 * seed  # a seed moves all its PEs together: accuracies differ by seed, effects do not


# --- each claim, each verdict -----------------------------------------------------------------------------------

# (claim, the OOD exact match of a grid where the claim holds / fails / seeds disagree); tasks: ``TASKS``.
SCENARIOS = {
    "nope_highest_mrr": (  # noisy: NoPE first in seeds 0 and 2, last in seed 1 (margins +0.5, -0.8, +0.5)
        lambda t, pe, s: ORDER[pe] + jitter(s),
        lambda t, pe, s: (0.05 if pe == "nope" else ORDER[pe]) + jitter(s),  # NoPE last everywhere
        lambda t, pe, s: (0.05 if s == 1 else 0.95) if pe == "nope" else ORDER[pe]),
    "nope_beats_ape_rotary_on_primitives": (
        lambda t, pe, s: ORDER[pe] + jitter(s),
        lambda t, pe, s: (0.2 if pe == "nope" else 0.7 if pe == "rope" else ORDER[pe]) + jitter(s),
        lambda t, pe, s: {0: 0.8, 1: 0.0, 2: 0.4}[s] if pe == "nope" else ORDER[pe]),
    "t5_best_explicit_mrr": (  # noisy: ALiBi above T5 in seed 1 only
        lambda t, pe, s: ORDER[pe] + jitter(s),
        lambda t, pe, s: (0.55 if pe == "alibi" else 0.5 if pe == "t5" else ORDER[pe]) + jitter(s),
        lambda t, pe, s: (0.65 if s == 1 else 0.45) if pe == "alibi" else ORDER[pe]),
    "nope_outperforms_explicit_pes": (
        lambda t, pe, s: (0.7 + {0: 0.0, 1: 0.01, 2: 0.005}[s] if pe == "nope" else ORDER[pe]),  # T5 + 0.1
        lambda t, pe, s: (0.3 if pe == "nope" else ORDER[pe]) + jitter(s),
        lambda t, pe, s: {0: 0.9, 1: 0.3, 2: 0.6}[s] if pe == "nope" else ORDER[pe]),
}


@pytest.mark.parametrize("claim_id", list(SCENARIOS))
def test_a_pe_claim_is_reproduced_not_reproduced_or_inconclusive_as_the_seeds_say(claim_id):
    present, absent, noisy = (outcome(claim_id, grid(ood)) for ood in SCENARIOS[claim_id])
    assert (present.verdict, absent.verdict, noisy.verdict) == ("reproduced", "not reproduced", "inconclusive")
    threshold = CLAIM[claim_id].threshold
    assert present.across.low > threshold >= absent.across.high and noisy.across.low <= threshold < noisy.across.high
    assert len(present.across.per_seed) == 3 and present.on_side == 3 and absent.on_side == 0
    primitive = claim_id == "nope_beats_ape_rotary_on_primitives"
    assert present.tasks == (TASKS[:4] if primitive else TASKS) and present.queries == 3 * len(present.tasks)
    assert set(present.tasks) - set(PRIMITIVE_TASKS) == (set() if primitive else {"addition", "sort"})
    row = next(line for line in claims_table([present]).splitlines() if line.startswith(f"| {CLAIM[claim_id].text}"))
    assert f"| {len(present.tasks)} tasks, {3 * len(present.tasks)} queries |" in row


def test_the_effects_are_what_the_rules_say():
    # NoPE first on every query, T5 second: MRR 1 vs 1/2; APE and Rotary at 0.1 and 0.3 against NoPE's 0.8
    present = {o.claim.id: o for o in evaluate_claims(grid(SCENARIOS["nope_highest_mrr"][0]), RESAMPLES)}
    assert present["nope_highest_mrr"].across.estimate == pytest.approx(1 - 1 / 2)
    assert present["t5_best_explicit_mrr"].across.estimate == pytest.approx(1 / 2 - 1 / 3)
    assert present["nope_beats_ape_rotary_on_primitives"].across.per_seed == pytest.approx((0.5, 0.5, 0.5))
    assert present["nope_outperforms_explicit_pes"].across.estimate == pytest.approx(0.8 - 0.6)
    # superiority: per seed NoPE minus T5 (the best explicit PE) = 0.1, 0.11, 0.105; t interval, df = 2, by hand
    effects = np.array([0.1, 0.11, 0.105])
    half = scipy_stats.t.ppf(0.975, 2) * effects.std(ddof=1) / math.sqrt(3)
    across = outcome("nope_outperforms_explicit_pes", grid(SCENARIOS["nope_outperforms_explicit_pes"][0])).across
    assert (across.estimate, across.low, across.high) == pytest.approx((effects.mean(), effects.mean() - half,
                                                                        effects.mean() + half))


def test_outperforming_means_an_interval_above_zero_not_merely_above_a_margin_below_it():
    # NoPE ties T5 within 0.01 in every seed: no worse than T5 by more than 0.05 (the old reading), yet not better
    tied = outcome("nope_outperforms_explicit_pes", grid(lambda t, pe, s: (
        0.6 + {0: 0.0, 1: 0.01, 2: 0.005}[s] if pe == "nope" else ORDER[pe])))
    assert -EM_EFFECT < tied.across.low <= 0 < tied.across.high and tied.verdict == "inconclusive"
    # ahead in every seed, but by amounts whose interval still holds 0: inconclusive, not reproduced
    ahead = outcome("nope_outperforms_explicit_pes", grid(lambda t, pe, s: (
        0.6 + {0: 0.01, 1: 0.2, 2: 0.02}[s] if pe == "nope" else ORDER[pe])))
    assert ahead.on_side == 3 and ahead.across.low < 0 and ahead.verdict == "inconclusive"


@pytest.mark.parametrize("claim_id", list(SCENARIOS))
def test_one_seed_reports_its_effect_without_a_verdict(claim_id):
    single = outcome(claim_id, grid(SCENARIOS[claim_id][0], seeds=(0,)))
    assert single.verdict == NO_SEED_VERDICT and single.across.per_seed == pytest.approx([single.across.estimate])
    assert math.isnan(single.prediction.low) and single.across.estimate > CLAIM[claim_id].threshold


@pytest.mark.parametrize("claim_id", list(SCENARIOS))
def test_a_claim_gets_no_verdict_when_no_task_was_learned_in_distribution(claim_id):
    # Rotary and APE below the floor everywhere: 3 of 5 PEs learn each task, under the 4 a learned task needs
    failed = outcome(claim_id, grid(SCENARIOS[claim_id][0],
                                    id_acc=lambda task, pe: {"rope": 0.62, "sinusoidal": 0.5}.get(pe, 1.0)))
    assert failed.verdict == TOO_FEW and failed.interval is None
    assert "Rotary ID 0.62 < 0.9, APE ID 0.50 < 0.9" in failed.reason and "copy: " in failed.reason
    # the table's tasks column says none was compared before listing those left out, not a bare "; left out";
    # why each was left out is a footnote below the table
    table = claims_table([failed])
    assert "| 0 tasks, 0 queries | none; left out copy [1], copy_2x [2]," in table
    assert "\n* [1] left out copy: Rotary ID 0.62 < 0.9, APE ID 0.50 < 0.9\n* [2] left out copy_2x: " in table


@pytest.mark.parametrize("claim_id", list(SCENARIOS))
def test_fewer_than_four_learned_tasks_get_no_verdict_but_keep_their_effect(claim_id):
    # NoPE learns only 3 of the claim's tasks: the effect on those 3 is shown, the verdict withheld
    claim_tasks = TASKS[:4] if claim_id == "nope_beats_ape_rotary_on_primitives" else TASKS
    learned = claim_tasks[:MIN_TASKS - 1]
    few = outcome(claim_id, grid(SCENARIOS[claim_id][0], id_acc=lambda t, pe: 1.0 if t in learned else 0.5))
    assert few.verdict == TOO_FEW and few.tasks == learned and few.queries == 9
    assert few.across.low > CLAIM[claim_id].threshold  # it would be reproduced on 4 tasks
    marked = ", ".join(f"{task} [{n}]" for n, task in enumerate(claim_tasks[MIN_TASKS - 1:], 1))
    assert f"| 3 tasks, 9 queries | {', '.join(learned)}; left out {marked} |" in claims_table([few])


def test_a_task_learned_by_fewer_than_four_pes_is_left_out_and_listed():
    # NoPE and APE never learn addition in distribution: the comparison runs on the other five tasks only
    cells = grid(SCENARIOS["nope_highest_mrr"][0], id_acc=lambda task, pe: 0.4 if task == "addition" and pe in (
        "nope", "sinusoidal") else 1.0)
    result = outcome("nope_outperforms_explicit_pes", cells)
    assert result.verdict == "reproduced" and result.tasks == ("copy", "copy_2x", "reverse", "reverse_2x", "sort")
    assert result.left_out == (("addition", "NoPE ID 0.40 < 0.9, APE ID 0.40 < 0.9"),) and result.below == ()
    assert "left out addition: NoPE ID 0.40 < 0.9, APE ID 0.40 < 0.9" in claims_table([result])


def test_a_task_learned_by_four_pes_is_compared_and_the_fifth_named():
    # APE misses copy in distribution (0.24), the other four learn it: copy is learned, APE ranked on its OOD 0.0;
    # a claim that does not compare APE still counts it towards whether copy is learned
    ood = lambda t, pe, s: 0.0 if (t, pe) == ("copy", "sinusoidal") else ORDER[pe] + jitter(s)  # noqa: E731
    cells = grid(ood, id_acc=lambda task, pe: 0.24 if (task, pe) == ("copy", "sinusoidal") else 1.0)
    for claim_id in SCENARIOS:
        result = outcome(claim_id, cells)
        assert "copy" in result.tasks and result.left_out == () and result.below == (("copy", "APE ID 0.24 < 0.9"),)
        assert "compared below the floor on copy: APE ID 0.24 < 0.9" in claims_table([result])
    # every claim compares copy with APE below the floor: the note is printed once, every row marks copy
    table = claims_table([outcome(claim_id, cells) for claim_id in SCENARIOS])
    assert table.count("below the floor on copy") == 1
    assert "\n* [1] compared below the floor on copy: APE" in table
    rows = [line for line in table.splitlines() if line.startswith("| ") and " queries | " in line]
    assert len(rows) == len(SCENARIOS) and all(", copy [1]" in row or "| copy [1]" in row for row in rows)
    ours, learned = mrr_intervals(cells, RESAMPLES)
    assert learned == list(TASKS) and ours["nope"].estimate == pytest.approx(1.0)
    # APE is last on every query either way (0.1, or 0.0 on copy): 1/5
    assert ours["sinusoidal"].estimate == pytest.approx(1 / 5)
    # one PE fewer (Rotary also misses copy): 3 of 5, copy left out of the MRR
    cells = grid(ood, id_acc=lambda task, pe: 0.24 if task == "copy" and pe in ("sinusoidal", "rope") else 1.0)
    assert "copy" not in mrr_intervals(cells, RESAMPLES)[1]


def test_a_task_is_learned_when_four_pes_reach_the_floor_counted_inclusively():
    assert learned([0.9, 0.9, 0.9, 0.9, 0.0]) and not learned([0.9, 0.9, 0.8999, 0.5, 1.0])
    assert learned([0.5, 0.95], need=1) and not learned([])


def test_the_learned_table_and_the_claims_let_in_the_same_tasks():
    from nope_lightning.analysis.synthetic.learned import learned_table

    # copy: APE alone below the floor (learned); reverse: APE and Rotary (not); addition: 0.9 exactly for four
    misses = {("copy", "sinusoidal"): 0.24, ("reverse", "sinusoidal"): 0.3, ("reverse", "rope"): 0.89,
              ("addition", "nope"): 0.5}
    cells = grid(SCENARIOS["nope_highest_mrr"][0],
                 id_acc=lambda task, pe: misses.get((task, pe), 0.9 if task == "addition" else 1.0))
    compared = mrr_intervals(cells, RESAMPLES)[1]
    assert compared == [t for t in TASKS if t != "reverse"]
    line = next(row for row in learned_table(cells).splitlines() if "tasks learned**" in row)
    assert set(line.split(" (")[1].split(")")[0].split(", ")) == set(compared)


def test_a_task_with_some_of_its_seeds_run_is_left_out_and_named_not_every_comparison():
    # a study spanning sessions commits sort's seed-0 slice before its others: the complete tasks keep their verdicts
    from nope_lightning.analysis.synthetic.tables import mrr_table

    ood = SCENARIOS["nope_highest_mrr"][0]
    whole = grid(ood, tasks=TASKS[:-1])
    cells = whole + grid(lambda t, pe, s: 1.0, tasks=("sort",), seeds=(0,))
    for claim_id in SCENARIOS:
        result, alone = outcome(claim_id, cells), outcome(claim_id, whole)
        assert result.verdict == alone.verdict != "not measured" and result.tasks == alone.tasks
        if not CLAIM[claim_id].tasks:  # the copy/reverse claim never reads sort
            assert ("sort", "not run at seeds 1, 2") in result.left_out
            assert "left out sort: not run at seeds 1, 2" in claims_table([result])
    assert mrr_intervals(cells, RESAMPLES)[1] == mrr_intervals(whole, RESAMPLES)[1]
    assert paper_way_mrr(cells).mrr == paper_way_mrr(whole).mrr
    assert "both leave out, until they are whole, sort (not run at seeds 1, 2)" in mrr_table(cells, RESAMPLES)
    # a PE missing at one seed is named as missing cells; with no task whole, nothing is ranked
    gap = [c for c in cells if (c.task, c.pos_encoding, c.seed) != ("copy", "rope", 2)]
    assert ("copy", "cells missing at seed 2") in outcome("nope_outperforms_explicit_pes", gap).left_out
    assert outcome("nope_highest_mrr", grid(ood, tasks=("sort",), seeds=(0,)) + grid(
        ood, tasks=("copy",), seeds=(1,))).verdict == "not measured"


# --- scratchpad ---------------------------------------------------------------------------------------------------


SCRATCHPAD_TASKS = ("addition", "sort", "summation", "parity")


def with_scratchpad(effect, tasks=SCRATCHPAD_TASKS, seeds=SEEDS, id_acc=lambda task, pe: 1.0,
                    plain_id=lambda task, pe: 1.0):
    """The plain grid (ID exact match ``plain_id``) and a full-scratchpad one (``id_acc``) whose OOD exact match is
    the plain one's + ``effect(task, seed)``."""
    def plain(task: str, pe: str, seed: int) -> float:
        return 0.4 + 0.05 * PES.index(pe)

    return grid(plain, tasks, seeds, plain_id) + grid(lambda t, pe, s: plain(t, pe, s) + effect(t, s), tasks, seeds,
                                                      id_acc, scratchpad="full")


def test_scratchpad_helps_some_tasks_each_verdict():
    def verdict(effect, **kw):
        return outcome("scratchpad_helps_some_tasks", with_scratchpad(effect, **kw)).verdict

    assert verdict(lambda t, s: 0.3 + 0.01 * s if t == "addition" else -0.2 - 0.01 * s) == "reproduced"
    assert verdict(lambda t, s: 0.3 + 0.01 * s) == "not reproduced"  # it helps every task
    assert verdict(lambda t, s: -0.2 - 0.01 * s) == "not reproduced"  # it helps none
    # helps addition; on the others the seeds disagree, so whether it helps "not others" stays open
    assert verdict(lambda t, s: 0.3 + 0.01 * s if t == "addition" else (0.3, -0.3, 0.0)[s]) == "inconclusive"
    assert verdict(lambda t, s: 0.3 if t == "addition" else -0.2, seeds=(0,)) == NO_SEED_VERDICT
    # one seed, one task: its row counts in the singular
    single = outcome("scratchpad_helps_some_tasks", with_scratchpad(lambda t, s: 0.3, tasks=("parity",), seeds=(0,)))
    assert single.by_task[0].verdict == NO_SEED_VERDICT
    assert "| 1 task, 1 query | parity | 1 task on one seed |" in claims_table([single])
    failed = outcome("scratchpad_helps_some_tasks", with_scratchpad(lambda t, s: 0.1, id_acc=lambda t, pe: 0.5))
    assert failed.verdict == TOO_FEW and failed.tasks == () and failed.queries == 0
    assert ("addition", "NoPE (full) ID 0.50 < 0.9, T5 (full) ID 0.50 < 0.9, ALiBi (full) ID 0.50 < 0.9, Rotary "
            "(full) ID 0.50 < 0.9, APE (full) ID 0.50 < 0.9") in failed.left_out
    assert outcome("scratchpad_helps_some_tasks", grid(lambda t, pe, s: ORDER[pe])).verdict == "not measured"


def test_scratchpad_over_fewer_than_four_learned_tasks_gets_no_verdict():
    # the per-task effects that would give "reproduced", on 3 learned tasks: each task's effect, no overall verdict
    three = outcome("scratchpad_helps_some_tasks", with_scratchpad(
        lambda t, s: 0.3 + 0.01 * s if t == "addition" else -0.2 - 0.01 * s,
        id_acc=lambda task, pe: 0.5 if task == "summation" else 1.0))
    assert three.verdict == TOO_FEW and three.tasks == ("addition", "sort", "parity") and three.queries == 9
    assert [e.verdict for e in three.by_task] == ["reproduced", "not reproduced", "not reproduced"]
    assert three.reason == "3 of at least 4 tasks learned with a full scratchpad"
    table = claims_table([three])
    assert "| 3 tasks, 9 queries | addition, sort, parity; left out summation [1] |" in table
    assert "\n* [1] left out summation: NoPE (full) ID 0.50" in table


def test_the_scratchpad_precondition_reads_the_format_the_task_is_run_with():
    # no PE learns the tasks without a scratchpad (ID 0.05), every PE does with one: that is what a scratchpad can
    # help, so the tasks are compared, their effects read against the unlearned plain format
    result = outcome("scratchpad_helps_some_tasks", with_scratchpad(
        lambda t, s: 0.3 + 0.01 * s if t == "addition" else -0.2 - 0.01 * s, plain_id=lambda task, pe: 0.05))
    assert result.verdict == "reproduced" and result.tasks == SCRATCHPAD_TASKS and result.left_out == ()


def test_scratchpad_effect_per_task_is_the_mean_over_pes_of_full_minus_none():
    result = outcome("scratchpad_helps_some_tasks",
                     with_scratchpad(lambda t, s: 0.3 + 0.01 * s if t == "addition" else -0.2 - 0.01 * s))
    addition, sort, *_ = result.by_task
    assert addition.tasks == ("addition",) and addition.across.per_seed == pytest.approx((0.3, 0.31, 0.32))
    assert sort.verdict == "not reproduced" and sort.across.estimate == pytest.approx(-0.21)
    assert "addition +0.310" in claims_table([result]) and "1 helps, 3 does not help" in claims_table([result])


# --- MRR, its interval, Wilson --------------------------------------------------------------------------------------

# OOD exact match per (task, seed) query, with ties (0.5 twice, 0.0 three times) that average their ranks
QUERIES = {("copy", 0): [0.9, 0.5, 0.5, 0.2, 0.0], ("copy", 1): [0.4, 0.7, 0.1, 0.0, 0.0],
           ("copy", 2): [1.0, 1.0, 0.3, 0.3, 0.0], ("sort", 0): [0.2, 0.6, 0.6, 0.1, 0.0],
           ("sort", 1): [0.8, 0.3, 0.5, 0.0, 0.0], ("sort", 2): [0.0, 0.0, 0.0, 0.4, 0.1]}


def reciprocal_ranks(scores) -> np.ndarray:
    """1 / rank of each PE on one query, tied PEs on their average rank (scipy, not the code under test)."""
    return 1 / scipy_stats.rankdata(-np.asarray(scores), method="average")


def test_mrr_and_its_crossed_bootstrap_match_a_computation_by_hand():
    cells = grid(lambda t, pe, s: QUERIES[t, s][PES.index(pe)], tasks=("copy", "sort"))
    rr = {q: reciprocal_ranks(scores) for q, scores in QUERIES.items()}
    mrr, learned = mrr_intervals(cells, resamples=20_000)
    assert learned == ["copy", "sort"]
    assert [mrr[pe].estimate for pe in PES] == pytest.approx(np.mean(list(rr.values()), axis=0))
    assert mrr["nope"].per_seed == pytest.approx([np.mean([rr["copy", s][0], rr["sort", s][0]]) for s in SEEDS])
    # The crossed bootstrap's exact distribution: every multiset of 3 seeds (multinomial weights) times every
    # multiset of 2 tasks; its 2.5 % and 97.5 % quantiles are atoms that 20,000 resamples find exactly.
    atoms: dict[float, float] = {}
    for seeds in itertools.product(SEEDS, repeat=3):
        for tasks in itertools.product(("copy", "sort"), repeat=2):
            value = round(float(np.mean([rr[t, s][0] for s in seeds for t in tasks])), 12)
            atoms[value] = atoms.get(value, 0.0) + 1 / (27 * 4)
    values = sorted(atoms)
    cdf = np.cumsum([atoms[v] for v in values])
    low, high = values[np.searchsorted(cdf, 0.025)], values[np.searchsorted(cdf, 0.975)]
    assert min(abs(cdf - 0.025).min(), abs(cdf - 0.975).min()) > 0.005  # no quantile sits on a jump of the cdf
    assert (mrr["nope"].low, mrr["nope"].high) == pytest.approx((low, high))


def paper_ranks(scores_in_row_order) -> np.ndarray:
    """1 / rank on one query, ties to the PE listed first (scipy's ordinal ranks, not the code under test)."""
    return 1 / scipy_stats.rankdata(-np.asarray(scores_in_row_order), method="ordinal")


def test_ours_ranks_the_learned_tasks_ties_averaged_the_papers_way_every_task_ties_to_the_first_listed():
    # lego: Rotary and APE never learn it (ID 0.5), so it is not learned; every PE scores 0 out of distribution
    cells = (grid(lambda t, pe, s: QUERIES[t, s][PES.index(pe)], tasks=("copy", "sort"))
             + grid(lambda t, pe, s: 0.0, tasks=("lego",), id_acc=lambda t, pe: 0.5 if pe in ("rope", "sinusoidal")
                    else 1.0))
    ours, learned = mrr_intervals(cells, RESAMPLES)
    rr = np.mean([reciprocal_ranks(scores) for scores in QUERIES.values()], axis=0)
    assert learned == ["copy", "sort"] and [ours[pe].estimate for pe in PES] == pytest.approx(rr)
    paper = paper_way_mrr(cells)
    order = [PES.index(pe) for pe in PAPER_ROW_ORDER]  # Rotary, ALiBi, T5, APE, NoPE
    by_hand = np.mean([paper_ranks(np.asarray(scores)[order]) for scores in QUERIES.values()]
                      + [paper_ranks([0.0] * 5)] * 3, axis=0)  # lego: Rotary 1, ALiBi 1/2, ..., NoPE 1/5
    assert [paper.mrr[pe] for pe in PAPER_ROW_ORDER] == pytest.approx(by_hand)
    assert paper.tasks == ("copy", "sort", "lego") and paper.queries == 9 and paper.seeds == SEEDS
    assert paper.per_seed["nope"][2] == pytest.approx(np.mean([paper_ranks(np.asarray(QUERIES[t, 2])[order])[4]
                                                               for t in ("copy", "sort")] + [1 / 5]))
    assert not paper.comparable and len(paper.missing) == 14 and "lego" not in paper.missing


def test_the_papers_numbers_stand_beside_the_papers_way_only_over_all_17_tasks():
    few = exact_match_table(grid(lambda t, pe, s: QUERIES[t, s][PES.index(pe)], tasks=("copy", "sort")), RESAMPLES)
    assert "15 of the paper's 17 tasks have no results here (copy_repeat, " in few
    assert "paper 002" not in few and "0.69" not in few and "Out of distribution" in few and "In distribution" in few
    every = exact_match_table(grid(lambda t, pe, s: ORDER[pe], tasks=PAPER_TASKS, seeds=(0,)), RESAMPLES)
    nope = next(line for line in every.splitlines() if line.startswith("| NoPE |") and "0.69" in line)
    assert "| paper 002 (its 17 tasks) |" in every and nope.endswith("| 1.00 | 1.00 | 0.69 |")


def test_a_scratchpad_only_grid_gets_its_tables_and_mrr_not_measured():
    cells = grid(lambda t, pe, s: 0.5, tasks=("addition",), scratchpad="full")
    with pytest.raises(NotMeasured, match="no task without a scratchpad"):
        mrr_intervals(cells, RESAMPLES)
    table = exact_match_table(cells, RESAMPLES)
    assert "| addition (full) | 0 |" in table and "ours: not measured: no task without a scratchpad" in table


# --- the paper's MRR against the reference's published results ---------------------------------------------------

REFERENCE = json.loads((REPO / "tests/data/paper002_reference_mrr.json").read_text())
HARMONIC = sum(1 / r for r in range(1, 6))  # a query's reciprocal ranks sum to this when no tie is shared


def reference_scores() -> dict[tuple[str, int], dict[str, float]]:
    """Each published query's scores: its test exact match, else its printed reciprocal ranks (a ranking needs
    only the order, and the ranks have no ties)."""
    return {(q["task"], q["seed"]): q.get("test_acc") or q["reciprocal_rank"] for q in REFERENCE["queries"]}


def unpublished_residual(mrr_of: dict[str, float]) -> dict[str, float]:
    """Per PE, 60 x (the reciprocal ranks the reference's 12 unpublished queries must hold, given its published
    MRR over 51 queries and ``mrr_of`` over the 39 published): with strict ranks, an integer in [12 x 12, 12 x 60]."""
    published = REFERENCE["published_mrr"]
    return {pe: 60 * (51 * published[pe] - 39 * mrr_of[pe]) for pe in REFERENCE["row_order"]}


def test_the_reference_mrr_is_the_papers_and_breaks_every_tie():
    assert REFERENCE["row_order"] == list(PAPER_ROW_ORDER)
    assert {pe: round(v, 2) for pe, v in REFERENCE["published_mrr"].items()} == SYNTHETIC_MRR
    # 0.69 / 0.55 / 0.50 / 0.33 / 0.22 sum to 1 + 1/2 + ... + 1/5: every one of the 51 queries ranked strictly
    assert sum(REFERENCE["published_mrr"].values()) == pytest.approx(HARMONIC, abs=5 * 5e-7)


def test_the_papers_way_on_the_published_queries_names_the_unpublished_tasks():
    result = paper_mrr(reference_scores(), PAPER_TASKS)
    assert result.missing == ("polynomial", "sort", "parity", "lego") == tuple(
        t for t in PAPER_TASKS if t in REFERENCE["unpublished_tasks"])
    assert result.queries == 39 and not result.comparable and len(result.tasks) == 13
    # SCAN alone: the reciprocal ranks the reference's notebook printed, seed by seed
    scan = paper_mrr({q: v for q, v in reference_scores().items() if q[0] == "scan"}, PAPER_TASKS)
    printed = REFERENCE["printed_scan_reciprocal_ranks"]["by_seed"]
    for s, seed in enumerate(scan.seeds):
        assert {pe: scan.per_seed[pe][s] for pe in PAPER_ROW_ORDER} == pytest.approx(printed[str(seed)], abs=1e-6)


def test_the_papers_way_completes_to_the_published_mrr_and_the_other_tie_rules_cannot():
    # The 12 unpublished queries (4 tasks x 3 seeds) must supply 51 x published MRR minus what the 39 published
    # give. With the reference's tie rule that remainder is a sum of 12 strict reciprocal ranks for every PE, and
    # some 12 rankings realise all five remainders at once (a 5 x 5 table of rank counts, 12 per PE and per rank).
    ours = unpublished_residual(paper_mrr(reference_scores(), PAPER_TASKS).mrr)
    assert sum(ours.values()) == pytest.approx(12 * 60 * HARMONIC, abs=0.02)
    assert all(abs(v - round(v)) < 0.01 and 12 * 12 <= v <= 12 * 60 for v in ours.values())
    counts = {pe: [c for c in itertools.product(range(13), repeat=5) if sum(c) == 12
                   and sum(n * 60 // r for n, r in zip(c, range(1, 6), strict=True)) == round(v)]
              for pe, v in ours.items()}
    assert any(all(sum(column) == 12 for column in zip(*table, strict=True))
               for table in itertools.product(*counts.values()))
    # ties averaged (ours for the claims): 7 queries tie Rotary and APE at 0, each then at rank 4.5, off the grid
    averaged = unpublished_residual(mrr_with_ties({pe: [v[pe] for v in reference_scores().values()]
                                                   for pe in PAPER_ROW_ORDER}))
    assert any(abs(v - round(v)) > 0.1 for v in averaged.values())
    # ties to the PE listed last: APE would need less than rank 5 on every unpublished query
    reversed_order = mrr_row_order({pe: [v[pe] for v in reference_scores().values()] for pe in PAPER_ROW_ORDER[::-1]})
    assert unpublished_residual(reversed_order)["sinusoidal"] < 12 * 12


def test_wilson_per_cell_matches_its_formula():
    cell = make_cell("copy", "nope", 0, 37 / N, id_acc=0.93)
    z, p = scipy_stats.norm.ppf(0.975), 37 / N
    centre = (p + z * z / (2 * N)) / (1 + z * z / N)
    half = z * math.sqrt(p * (1 - p) / N + z * z / (4 * N * N)) / (1 + z * z / N)
    ood = exact_match(cell, "ood")
    assert (ood.estimate, ood.low, ood.high) == pytest.approx((p, centre - half, centre + half))
    assert exact_match(cell, "id") == wilson(93, N_ID)
    id_row, ood_row = (line for line in exact_match_table([cell], RESAMPLES).splitlines()
                       if line.startswith("| copy | 0 |"))
    assert f"0.18 [{centre - half:.2f}, {centre + half:.2f}]" in ood_row and "0.93 [" in id_row


# --- pairing ------------------------------------------------------------------------------------------------------


def primitive_margin(nope: np.ndarray, rival: np.ndarray):
    """Claim ``nope_beats_ape_rotary_on_primitives`` on one primitive task, 3 seeds, every other PE ``rival`` (all
    five run: whether the task is learned reads every PE)."""
    cells = [make_cell("copy", pe, s, nope if pe == "nope" else rival) for pe in PES for s in SEEDS]
    return outcome("nope_beats_ape_rotary_on_primitives", cells).interval


def unpaired_half_width(a: np.ndarray, b: np.ndarray, seed: int = 0) -> float:
    """What an unpaired bootstrap would give: each PE's examples drawn independently (3 seeds pooled)."""
    rng = np.random.default_rng(seed)
    draws = [np.mean([rng.choice(x, (2000, N)).mean(1) for _ in SEEDS], axis=0) for x in (a, b)]
    return float(np.diff(np.quantile(draws[0] - draws[1], [0.025, 0.975]))[0] / 2)


def test_differences_are_paired_example_by_example():
    right = np.random.default_rng(1).random(N) < 0.5
    # the same examples right: every resample gives 0, where independent draws would spread +-0.06
    same = primitive_margin(right, right)
    assert (same.estimate, same.low, same.high) == (0.0, 0.0, 0.0)
    assert unpaired_half_width(right, right) > 0.05
    # the same accuracy on complementary examples: each example differs by +-1, so the paired difference spreads
    # 1.96 sqrt(1 / 3N), wider than the unpaired 1.96 sqrt(2 p (1 - p) / 3N)
    first_half = np.arange(N) < N // 2
    opposite = primitive_margin(first_half, ~first_half)
    assert opposite.estimate == 0.0
    assert opposite.half_width == pytest.approx(1.96 * math.sqrt(1 / (3 * N)), rel=0.15)
    assert opposite.half_width > 1.2 * unpaired_half_width(first_half, ~first_half)


def test_cells_scored_on_different_test_examples_are_not_compared():
    cells = grid(SCENARIOS["nope_highest_mrr"][0])
    cells[1] = make_cell("copy", "nope", 1, 0.8, digest="another split")  # the NoPE cell of (copy, seed 1)
    assert cells[1].seed == 1 and cells[1].pos_encoding == "nope"
    result = outcome("nope_highest_mrr", cells)
    assert result.verdict == "not measured" and "copy, seed 1: its cells were scored on different test" in result.reason
    with pytest.raises(ValueError, match="two results for"):
        CellIndex([cells[0], cells[0]])


def test_the_report_reads_its_cells_in_task_order_whatever_order_they_were_joined_in():
    """Slices joined in another order give the same tables: the crossed bootstrap resamples task indices, so a
    report that kept the join order would draw other intervals from the same cells."""
    cells = grid(SCENARIOS["nope_highest_mrr"][0]) + grid(lambda task, pe, seed: 0.5, ("sort",), scratchpad="full")
    joined_otherwise = cells[::-1]
    assert CellIndex(joined_otherwise).tasks("none") == ["copy", "copy_2x", "reverse", "reverse_2x", "addition",
                                                         "sort"]  # the registry's order, not the grid's
    claims = [CLAIM["nope_highest_mrr"], CLAIM["nope_outperforms_explicit_pes"]]
    tables = [claims_table(evaluate_claims(c, RESAMPLES, claims)) + exact_match_table(c)
              for c in (cells, joined_otherwise)]
    assert tables[0] == tables[1]
    assert tables[0].index("| sort (full) |") > tables[0].index("| sort |") > tables[0].index("| addition |")


def test_version_one_cells_keep_their_verdict_without_an_evaluation_interval():
    cells = grid(SCENARIOS["nope_beats_ape_rotary_on_primitives"][0])
    legacy = []
    for cell in cells:
        data = cell.to_dict()
        for key in ("version", "ood_correct", "test_digest"):
            del data[key]
        legacy.append(SyntheticCell.from_dict(data))
    assert legacy[0].ood_correct == () and legacy[0].test_digest == ""
    assert SyntheticCell.from_dict(cells[0].to_dict()) == cells[0]  # version 2 keeps every example
    old, new = (outcome("nope_beats_ape_rotary_on_primitives", c) for c in (legacy, cells))
    assert old.verdict == new.verdict == "reproduced" and old.across == new.across
    assert math.isnan(old.interval.low) and new.interval.resamples == CLAIM_RESAMPLES  # at least, whatever is asked
    assert "none (no per-example results)" in claims_table([old])


def test_the_digest_names_the_problems_not_their_format():
    def split(seed, scratchpad):
        return make_split("addition", "test", n=20, seed=seed, scratchpad=scratchpad)

    assert problems_digest(split(0, "none")) == problems_digest(split(0, "full")) != problems_digest(split(1, "none"))


def test_tiny_runs_of_two_pes_record_paired_examples(tracking_overrides, tmp_path):
    cfg = load_config(SyntheticConfig, REPO / "conf/synthetic/tiny.yaml", [*tracking_overrides, "log_model=false"])
    cells = [stage.train_and_evaluate(cfg.cell(cfg.task, pe, 0), tmp_path / pe).result for pe in ("nope", "alibi")]
    for cell in cells:
        assert len(cell.ood_correct) == cfg.n_test and np.mean(cell.ood_correct) == pytest.approx(cell.ood_acc)
    assert cells[0].test_digest == cells[1].test_digest == problems_digest(stage.SyntheticData(cfg).test)
    assert CellIndex(cells).grid([cfg.task], [0], [("none", "nope"), ("none", "alibi")]).shape == (1, 1, 2)


def test_the_scratchpad_errors_table_sums_seeds_and_reads_shares_and_median_steps():
    """Two seeds of NoPE's parity (full) cell: 3 + 1 wrong outputs, 3 first wrong in the remaining input (steps 2, 5,
    9: median 5) and 1 in the answer (step 12), none at step 1; T5's one seed, 2 in the output (steps 3, 4: the lower
    median 3) and 1 in the answer at step 1. By hand: NoPE 0 % at step 1, 75 % (step 5), 25 % (step 12); T5 33 %,
    67 % (step 3), 33 % (step 1). Cells that recorded nothing make no table."""
    import dataclasses

    from nope_lightning.analysis.synthetic.tables import scratchpad_errors_table

    def cell(pe, seed, errors):
        return dataclasses.replace(make_cell("parity", pe, seed, 0.5, scratchpad="full"), scratchpad_errors=errors)

    cells = [cell("nope", 3, {"remaining_input": [2, 9], "answer": [12]}), cell("nope", 4, {"remaining_input": [5]}),
             cell("t5", 3, {"step_output": [3, 4], "answer": [1]}),
             make_cell("parity", "alibi", 3, 0.5, scratchpad="full")]
    table = scratchpad_errors_table(cells)
    assert "| task (format) | PE | seeds | wrong OOD outputs | at step 1 | output | remaining input | answer |" in table
    assert "| parity (full) | NoPE | 3, 4 | 4 | 0% | — | 75% (step 5) | 25% (step 12) |" in table
    assert "| parity (full) | T5 | 3 | 3 | 33% | 67% (step 3) | — | 33% (step 1) |" in table
    assert table.index("| NoPE |") < table.index("| T5 |") and "ALiBi" not in table
    assert scratchpad_errors_table(cells[3:]) == ""
    rare = scratchpad_errors_table([cell("nope", 3, {"step_output": [1] * 300, "answer": [9]})])
    assert "| 301 | >99% |" not in rare and "| 301 | 100% | 100% (step 1) | <1% (step 9) |" in rare
    round_trip = SyntheticCell.from_dict(cells[0].to_dict(), "cell")
    assert round_trip.scratchpad_errors == cells[0].scratchpad_errors
    assert "scratchpad_errors" not in cells[3].to_dict()
