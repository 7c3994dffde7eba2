"""The synthetic report's claims, exact-match and MRR tables (``analysis.synthetic.claims`` computes what they show): per
(task, scratchpad, seed) each PE's exact match with its Wilson interval, in distribution and out; each PE's MRR our
way and the paper's, labelled apart."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from nope_lightning.analysis.markdown import MISSING, Footnotes, cell, markdown_table
from nope_lightning.analysis.rule_changes import exploratory_note
from nope_lightning.analysis.synthetic.cells import NONE, CellIndex, exact_match
from nope_lightning.analysis.synthetic.chance import chance
from nope_lightning.analysis.synthetic.claims import (
    EM_EFFECT,
    ID_FLOOR,
    LEARNED_BY,
    MIN_TASKS,
    PAPER_TASKS,
    RANKED,
    TOO_FEW,
    SyntheticOutcome,
    mrr_intervals,
    paper_way_mrr,
    ranked,
)
from nope_lightning.analysis.verdicts import NO_SEED_VERDICT, NotMeasured
from nope_lightning.config.paper import SYNTHETIC_MRR
from nope_lightning.config.synthetic import PAPER_NAMES
from nope_lightning.results.synthetic import SyntheticCell


def exact_match_table(cells: Iterable[SyntheticCell], resamples: int = 1000) -> str:
    """Exact match per task and PE, in distribution and out: one row per (task, scratchpad, seed), each entry that
    cell's exact match with its 95 % Wilson interval, beside the task's chance exact match (``chance.chance``: 1/k
    for an answer among k symbols, 0 for sequences); then each PE's MRR both ways (``mrr_table``)."""
    index = CellIndex(cells := list(cells))
    pes = list(dict.fromkeys([*(pe for pe in RANKED if any(k[2] == pe for k in index.cells)),
                              *(k[2] for k in index.cells)]))
    parts = ["### Exact match per task and PE\n\n*chance*: the exact match of a uniform guess among the task's "
             "answers (1/k for k symbols: parity's even/odd, LEGO's +1/-1: 0.50; 0 for answers that are sequences)."]
    for split, title in (("id", "In distribution (validation lengths)"), ("ood", "Out of distribution (test)")):
        rows = [[task + ("" if pad == NONE else f" ({pad})"), seed, f"{chance(task):.2f}", *(
            cell(exact_match(c, split)) if (c := index.cells.get((task, pad, pe, seed))) else MISSING for pe in pes)]
            for task, pad in dict.fromkeys((task, pad) for task, pad, _, _ in index.cells)
            for seed in index.seeds(pad, [task])]
        parts.append(f"#### {title}: exact match [95 % Wilson]\n\n"
                     + markdown_table(["task", "seed", "chance", *(PAPER_NAMES.get(pe, pe) for pe in pes)], rows))
    return "\n\n".join([*parts, mrr_table(cells, resamples)])


def mrr_table(cells: Sequence[SyntheticCell], resamples: int = 1000) -> str:
    """Each PE's MRR two ways, labelled apart: ours (``mrr_intervals``, what the verdicts read) and the paper's
    (``paper_way_mrr``), the paper's numbers beside the latter only when it ranks all 17 of the paper's tasks."""
    def seeds(values) -> str:
        return " / ".join(f"{v:.2f}" for v in values)

    try:
        ours, learned = mrr_intervals(cells, resamples)
        ours_text = f"over the {len(learned)} learned tasks ({', '.join(learned)})"
    except NotMeasured as missing:
        ours, ours_text = {}, f"not measured: {missing}"
    try:
        paper = paper_way_mrr(cells)
        paper_text = (f"over {len(paper.tasks)} tasks x {len(paper.seeds)} seeds = {paper.queries} queries" + (
            "" if paper.comparable else f"; {len(paper.missing)} of the paper's {len(PAPER_TASKS)} tasks have no "
            f"results here ({', '.join(paper.missing)}), so it is not comparable with the paper's MRR"))
    except NotMeasured as missing:
        paper, paper_text = None, f"not measured: {missing}"
    if not ours and paper is None:
        return f"#### Mean reciprocal rank\n\nours: {ours_text}; the paper's way: {paper_text}"
    if partial := ranked(cells)[3]:
        paper_text += "; both leave out, until they are whole, " + ", ".join(f"{t} ({why})" for t, why in partial)
    head = ["PE", "ours: learned tasks, ties averaged [95 % bootstrap, tasks x seeds]", "ours per seed",
            "the paper's way: every task, ties to the PE listed first", "the paper's way per seed"]
    comparable = paper is not None and paper.comparable
    rows = [[PAPER_NAMES[pe], cell(ours[pe]) if ours else MISSING, seeds(ours[pe].per_seed) if ours else MISSING,
             f"{paper.mrr[pe]:.2f}" if paper else MISSING, seeds(paper.per_seed[pe]) if paper else MISSING,
             *([f"{SYNTHETIC_MRR[pe]:.2f}"] if comparable else [])] for pe in RANKED]
    return ("#### Mean reciprocal rank over (task, seed) queries, two ways\n\n*Ours* (the MRR claims' verdicts read "
            f"it) ranks the queries of the learned tasks (at least {LEARNED_BY} of the {len(RANKED)} PEs at ID exact "
            f"match >= {ID_FLOOR:g}; a PE below it ranked on what it measured), tied "
            f"PEs sharing their average rank: {ours_text}. *The paper's way* ranks every query of every task run "
            "without a scratchpad, with no ID filter, a tie going to the PE the reference lists first (Rotary, ALiBi, "
            f"T5, APE, NoPE: NoPE loses every tie): {paper_text}. The two rank different queries under different "
            "rules: compare neither with the other.\n\n"
            + markdown_table([*head, *(["paper 002 (its 17 tasks)"] if comparable else [])], rows))


_TASK_WORDS = {"reproduced": "helps", "not reproduced": "does not help", "inconclusive": "unclear",
               NO_SEED_VERDICT: "1 seed"}


def claims_table(outcomes: Sequence[SyntheticOutcome], seed_dates: Mapping[int | None, str] | None = None) -> str:
    """``report_sections.claims_table``'s layout for paper 002: each claim's rule, what the paper says, our effect with its
    95 % interval across seeds (and each seed's effect), the prediction interval for one new seed, the
    evaluation-only paired bootstrap, the tasks compared (and those left out), the seeds on the claim's side (for
    the scratchpad claim: the tasks it helps, does not, or leaves unclear) and the verdict, *exploratory* when its
    rule was set after every seed it judges ran (``seed_dates``: seed -> the day its first run started). Why a task was
    left out or compared below the floor is a footnote marked beside the task, printed once below it."""
    show, rows, notes = "{:+.3f}".format, [], Footnotes()  # the floor notes repeat claim after claim
    for o in outcomes:
        c, below = o.claim, dict(o.below)
        found = f"**{o.verdict}**" + (f": {note}" if (note := exploratory_note(o, seed_dates or {})) else "")
        compared = ", ".join(t + (f" {notes.mark(f'compared below the floor on {t}: {below[t]}')}"
                                  if t in below else "") for t in o.tasks) or "none"
        left = ", ".join(f"{t} {notes.mark(f'left out {t}: {why}')}" for t, why in o.left_out)
        tasks = compared + (f"; left out {left}" if left else "") if o.tasks or o.left_out else MISSING
        rests = f"{len(o.tasks)} task{'s' * (len(o.tasks) != 1)}, {o.queries} queries" if o.tasks or o.left_out \
            else MISSING
        if o.by_task:
            words = [_TASK_WORDS[e.verdict] for e in o.by_task]
            rows.append([c.text, c.rule, c.paper, "; ".join(f"{e.tasks[0]} {cell(e.across, show)} ({w})" for e, w in
                                                            zip(o.by_task, words, strict=True)) + f" {c.unit}",
                         MISSING, "; ".join(f"{e.tasks[0]} {cell(e.interval, show)}" for e in o.by_task), rests,
                         tasks, ", ".join(f"{words.count(w)} {w}" for w in dict.fromkeys(words)), found])
        elif o.interval is None:
            rows.append([c.text, c.rule, c.paper, f"{o.verdict}: {o.reason}", MISSING, MISSING, rests, tasks, MISSING,
                         found])
        else:
            seeds = len(o.interval.per_seed)
            ours = f"{cell(o.across, show)} {c.unit}" + (
                f" (per seed: {' / '.join(map(show, o.interval.per_seed))})" if seeds > 1 else " (1 seed)")
            evaluation = cell(o.interval, show) if o.interval.resamples else "none (no per-example results)"
            rows.append([c.text, c.rule, c.paper, ours, cell(o.prediction, show) if seeds > 1 else MISSING,
                         evaluation, rests, tasks, f"{o.on_side} of {seeds}", found])
    return ("### Paper 002's claims, tested\n\nOOD exact match, paired: a (task, seed)'s cells share their test "
            "examples. *ours*: the effect [95 % across seeds: MRR claims a bootstrap over tasks and seeds, the others "
            "Student t over the per-seed effects]; *evaluation only*: a bootstrap over the test examples, models held "
            f"fixed. A task is compared (is *learned*) when at least {LEARNED_BY} of the {len(RANKED)} PEs reach ID "
            f"exact match >= {ID_FLOOR:g}, mean over seeds; a PE below it there is compared on what it measured and "
            "named (the scratchpad claim: every PE run in both formats reaches it in the full-scratchpad format). "
            "Verdicts as paper 001's, from the interval across "
            f"seeds; one seed gets none, nor does a claim over fewer than {MIN_TASKS} learned tasks ({TOO_FEW}). "
            "*rests on*: the tasks compared and their (task, seed) queries; in *tasks*, a [n] beside a task "
            "points to the note below the table on why it was left out or compared below the floor. An OOD exact match at "
            f"or below its task's chance + {EM_EFFECT:g} counts as chance for every PE (the tables' *chance* column). "
            "*exploratory*: the claim's rule was set after every seed it judges ran (*Rules changed*, above); new "
            "seeds must judge it.\n\n"
            + markdown_table(["claim", "rule", "the paper says", "ours: effect [95 % across seeds]",
                              "one new seed [95 % prediction]", "evaluation only [95 % paired bootstrap]", "rests on",
                              "tasks", "seeds on the claim's side", "verdict"], rows)
            + (f"\n\n{notes.render()}" if notes.notes else ""))
