"""The synthetic report's exact-match and MRR tables (``analysis.synthetic.claims`` computes what they show): per
(task, scratchpad, seed) each PE's exact match with its Wilson interval, in distribution and out; each PE's MRR our
way and the paper's, labelled apart."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nope_lightning.analysis.markdown import MISSING, cell, markdown_table
from nope_lightning.analysis.synthetic.cells import NONE, CellIndex, exact_match
from nope_lightning.analysis.synthetic.claims import (
    ID_FLOOR,
    LEARNED_BY,
    PAPER_TASKS,
    RANKED,
    mrr_intervals,
    paper_way_mrr,
    ranked,
)
from nope_lightning.analysis.verdicts import NotMeasured
from nope_lightning.config.paper import SYNTHETIC_MRR
from nope_lightning.config.synthetic import PAPER_NAMES
from nope_lightning.results.synthetic import SyntheticCell


def exact_match_table(cells: Iterable[SyntheticCell], resamples: int = 1000) -> str:
    """Exact match per task and PE, in distribution and out: one row per (task, scratchpad, seed), each entry that
    cell's exact match with its 95 % Wilson interval; then each PE's MRR both ways (``mrr_table``)."""
    index = CellIndex(cells := list(cells))
    pes = list(dict.fromkeys([*(pe for pe in RANKED if any(k[2] == pe for k in index.cells)),
                              *(k[2] for k in index.cells)]))
    parts = ["### Exact match per task and PE"]
    for split, title in (("id", "In distribution (validation lengths)"), ("ood", "Out of distribution (test)")):
        rows = [[task + ("" if pad == NONE else f" ({pad})"), seed, *(
            cell(exact_match(c, split)) if (c := index.cells.get((task, pad, pe, seed))) else MISSING for pe in pes)]
            for task, pad in dict.fromkeys((task, pad) for task, pad, _, _ in index.cells)
            for seed in index.seeds(pad, [task])]
        parts.append(f"#### {title}: exact match [95 % Wilson]\n\n"
                     + markdown_table(["task", "seed", *(PAPER_NAMES.get(pe, pe) for pe in pes)], rows))
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
