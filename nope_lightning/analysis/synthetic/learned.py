"""Which of paper 002's tasks a study's recipes learn: per task, each PE's in-distribution exact match (the validation
split at the training lengths, mean over seeds), how many of the PEs reach ``ID_FLOOR`` and whether the task counts
as learned, i.e. ``LEARNED_BY`` of the 5 PEs reach it (the goal a recipe is chosen for, and the rule by which
``claims`` lets a task into the PE-vs-PE claims and our MRR). Tasks without a scratchpad
only; a task of the paper that has no cells is listed as not run, so a partial study says what it lacks. A cell's
in-distribution number is its held-out ID test split's when it has one, else its validation split's
(``SyntheticCell.id_score``); the table says which, and how each cell's training ended (stopping rule or step cap).
Below it, the held-out cells under the floor say at which lengths they miss: a figure decided by one length's few
problems reads otherwise than a task missed at every length.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from nope_lightning.analysis.markdown import MISSING, markdown_table
from nope_lightning.analysis.synthetic.cells import NONE
from nope_lightning.analysis.synthetic.claims import (
    ID_FLOOR,
    LEARNED_BY,
    PAPER_TASKS,
    RANKED,
    learned,
    pe_rank,
)
from nope_lightning.config.synthetic import PAPER_NAMES
from nope_lightning.results.synthetic import SyntheticCell


def learned_table(cells: Iterable[SyntheticCell]) -> str:
    """``### Tasks learned``: one row per task run without a scratchpad (the paper's task order): each PE's ID exact
    match, mean over its seeds (min over seeds in brackets when they differ by more than 0.005), the split those
    come from, the steps the cells ended at and how many the stopping rule ended, the seeds, the PEs at or above
    ``ID_FLOOR`` and the verdict; then the count of learned tasks out of the paper's 17 and the tasks not run. ''
    without plain cells."""
    cells = list(cells)  # read twice: here and by held_out_misses
    by_task: dict[str, dict[str, list[SyntheticCell]]] = {}
    for c in cells:
        if c.scratchpad == NONE:
            by_task.setdefault(c.task, {}).setdefault(c.pos_encoding, []).append(c)
    if not by_task:
        return ""
    rows, learned_tasks = [], []
    for task in [t for t in PAPER_TASKS if t in by_task]:
        means = {pe: float(np.mean([c.id_score[0] for c in runs])) for pe, runs in by_task[task].items()}
        reach = [pe for pe in RANKED if means.get(pe, -1.0) >= ID_FLOOR]
        is_learned = learned(means.get(pe, -1.0) for pe in RANKED)
        if is_learned:
            learned_tasks.append(task)
        runs = [c for pe_runs in by_task[task].values() for c in pe_runs]
        steps = sorted({c.steps for c in runs})
        seeds = sorted({c.seed for c in runs})
        rows.append([task, *(_mean_cell(by_task[task].get(pe)) for pe in RANKED), _split(runs),
                     "/".join(map(str, steps)), _stopped(runs), len(seeds), f"{len(reach)} of {len(RANKED)}",
                     "**learned**" if is_learned else "not learned"])
    missing = [t for t in PAPER_TASKS if t not in by_task]
    return (f"### Tasks learned (in-distribution exact match, mean over seeds [min]; a PE learns a task at >= "
            f"{ID_FLOOR:g}, a task is learned when >= {LEARNED_BY} of the {len(RANKED)} PEs do)\n\n"
            + markdown_table(["task", *(PAPER_NAMES[pe] for pe in RANKED), "ID split", "steps",
                              "ended by the stopping rule", "seeds", "PEs >= floor", "verdict"], rows)
            + f"\n\n**{len(learned_tasks)} of the paper's {len(PAPER_TASKS)} tasks learned** by >= {LEARNED_BY} of the "
            f"{len(RANKED)} PEs" + (f" ({', '.join(learned_tasks)})" if learned_tasks else "")
            + (f"; not run: {', '.join(missing)}." if missing else ".") + held_out_misses(cells))


def held_out_misses(cells: Iterable[SyntheticCell]) -> str:
    """Where held-out ID exact match falls below ``ID_FLOOR``: per task (the paper's order), the cells without a
    scratchpad whose held-out ID test split reads below it, grouped by the length buckets at which they do, with
    those buckets' share of the examples and their exact match, and the lowest exact match at the other buckets.
    Summation's one-summand bucket, for one, holds the two problems of its held-out split that training never
    draws: a cell that misses only those reads 0.88 overall and >= 0.95 at every other length. '' when no
    held-out cell is below the floor."""
    low: dict[str, dict[tuple[str, ...], list[SyntheticCell]]] = {}
    for c in cells:
        if c.scratchpad == NONE and c.id_test_buckets and c.id_test_acc < ID_FLOOR:
            failing = tuple(b.bucket for b in c.id_test_buckets if b.acc < ID_FLOOR)
            low.setdefault(c.task, {}).setdefault(failing, []).append(c)
    lines = []
    for task in [t for t in PAPER_TASKS if t in low]:
        for failing, group in low[task].items():
            group = sorted(group, key=lambda c: (c.seed, pe_rank(c.pos_encoding)))
            named = ", ".join(f"{PAPER_NAMES.get(c.pos_encoding, c.pos_encoding)} s{c.seed} {c.id_test_acc:.2f}"
                              for c in group)
            buckets = [b for c in group for b in c.id_test_buckets]
            missed = [b for b in buckets if b.bucket in failing]
            others = [b.acc for b in buckets if b.bucket not in failing]
            accs = sorted({round(b.acc, 2) for b in missed})
            where = (f"below {ID_FLOOR:g} at every length ({_lengths(failing)})" if not others else
                     f"below {ID_FLOOR:g} at {'length' if len(failing) == 1 else 'lengths'} {_lengths(failing)} "
                     f"({sum(b.n for b in missed)} of {sum(b.n for b in buckets)} examples, exact match "
                     + (f"{accs[0]:.2f}" if len(accs) == 1 else f"{accs[0]:.2f}-{accs[-1]:.2f}")
                     + f"); every other length >= {min(others):.2f}")
            lines.append(f"- {task}: {named}: {where}.")
    if not lines:
        return ""
    return (f"\n\n**Held-out ID below {ID_FLOOR:g}, by length** (the cells whose held-out ID test split reads below "
            f"the floor, and the length buckets at which they do):\n\n" + "\n".join(lines))


def _lengths(buckets: tuple[str, ...]) -> str:
    """'1', '7-20' or '4, 6-9' for integer length buckets (runs of consecutive lengths joined); other labels
    (``"21-25"``) as they are, comma-separated."""
    if not all(b.isdigit() for b in buckets):
        return ", ".join(buckets)
    runs: list[list[int]] = []
    for n in sorted(map(int, buckets)):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _mean_cell(runs: list[SyntheticCell] | None) -> str:
    """'0.97' (mean ID over seeds) or '0.97 [0.91]' with the worst seed when the seeds differ."""
    if not runs:
        return MISSING
    values = [c.id_score[0] for c in runs]
    mean, worst = float(np.mean(values)), min(values)
    return f"{mean:.2f}" + (f" [{worst:.2f}]" if mean - worst > 0.005 else "")


def _split(runs: list[SyntheticCell]) -> str:
    """Which split the row's ID numbers come from: 'validation', 'ID test', or both with their counts."""
    names = {"validation": "validation", "id_test": "ID test"}
    counts = {names[split]: sum(c.id_score[1] == split for c in runs) for split in names}
    used = {name: n for name, n in counts.items() if n}
    return next(iter(used)) if len(used) == 1 else ", ".join(f"{name} ({n} cells)" for name, n in used.items())


def _stopped(runs: list[SyntheticCell]) -> str:
    """'n of m cells' the stopping rule ended (the rest ran to their step cap); '—' when no cell recorded it."""
    recorded = [c.stopped_by_rule for c in runs if c.stopped_by_rule is not None]
    return f"{sum(recorded)} of {len(recorded)} cells" if recorded else MISSING
