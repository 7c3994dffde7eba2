"""The synthetic report's claims, exact-match and MRR tables (``analysis.synthetic.claims`` computes what they show): per
(task, scratchpad, seed) each PE's exact match with its Wilson interval, in distribution and out; each PE's MRR our
way and the paper's, labelled apart."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from nope_lightning.analysis.markdown import MISSING, Footnotes, cell, markdown_table
from nope_lightning.analysis.report_frame import plural
from nope_lightning.analysis.rule_changes import exploratory_note
from nope_lightning.analysis.synthetic.calibration import calibration_lines
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
    pe_rank,
    ranked,
)
from nope_lightning.analysis.synthetic.formats import WORDS
from nope_lightning.analysis.synthetic.robustness import (
    CLAIM_RESAMPLES,
    SEEN_SEEDS,
    leave_one_out_text,
    new_seeds,
    rule_day,
    spread_cell,
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
    held_out = any(c.id_test_acc is not None for c in cells)  # then the ID entries say which split they read
    id_title = ("In distribution (training lengths: the held-out ID test split where a cell has one, marked *t*, "
                "else the validation split)" if held_out else "In distribution (validation lengths)")

    def entry(c: SyntheticCell, split: str) -> str:
        return cell(exact_match(c, split)) + (" *t*" if split == "id" and c.id_test_buckets else "")

    for split, title in (("id", id_title), ("ood", "Out of distribution (test)")):
        rows = [[task + ("" if pad == NONE else f" ({pad})"), seed, f"{chance(task):.2f}", *(
            entry(c, split) if (c := index.cells.get((task, pad, pe, seed))) else MISSING for pe in pes)]
            for task, pad in dict.fromkeys((task, pad) for task, pad, _, _ in index.cells)
            for seed in index.seeds(pad, [task])]
        parts.append(f"#### {title}: exact match [95 % Wilson]\n\n"
                     + markdown_table(["task", "seed", "chance", *(PAPER_NAMES.get(pe, pe) for pe in pes)], rows))
    return "\n\n".join([*parts, mrr_table(cells, resamples)])


#: ``scratchpad_errors_table``'s column names for the kinds of first error (``synthetic.scratchpad.ERROR_KINDS``).
ERROR_COLUMNS = {"step_input": "input", "step_computation": "computation", "step_output": "output",
                 "intermediate_variables": "variables", "remaining_input": "remaining input",
                 "fewer steps": "fewer steps", "more steps": "more steps", "answer": "answer"}


def scratchpad_errors_table(cells: Iterable[SyntheticCell]) -> str:
    """Where the wrong out-of-distribution outputs of the scratchpad cells first go wrong (``SyntheticCell.
    scratchpad_errors``), one row per (task, format, PE) summed over its seeds: how many wrong outputs, the share
    that departs in the first step, then per kind of first error its share and the median step (1-based; the lower
    one of an even count) it happened at. '' when no cell recorded any (no scratchpad cell, or cells run before it
    was recorded)."""
    rows: dict[tuple[str, str, str], tuple[set[int], dict[str, list[int]]]] = {}
    for c in cells:
        if c.scratchpad_errors:
            seeds, steps = rows.setdefault((c.task, c.scratchpad, c.pos_encoding), (set(), {}))
            seeds.add(c.seed)
            for kind, found in c.scratchpad_errors.items():
                steps.setdefault(kind, []).extend(found)
    if not rows:
        return ""
    kinds = [k for k in ERROR_COLUMNS if any(k in steps for _, steps in rows.values())]

    def percent(count: int, n: int) -> str:  # a share that rounds to 0 % is still there
        return f"{count / n:.0%}" if count == 0 or count / n >= 0.005 else "<1%"

    def share(found: list[int], n: int) -> str:
        return f"{percent(len(found), n)} (step {sorted(found)[(len(found) - 1) // 2]})" if found else MISSING

    body = [[f"{task} ({pad})", PAPER_NAMES.get(pe, pe), ", ".join(map(str, sorted(seeds))),
             n := sum(map(len, steps.values())), percent(sum(s == 1 for v in steps.values() for s in v), n),
             *(share(steps.get(k, []), n) for k in kinds)]
            for (task, pad, pe), (seeds, steps) in sorted(rows.items(), key=lambda item: (
                item[0][:2], pe_rank(item[0][2])))]
    return ("### Where a scratchpad goes wrong first (out of distribution)\n\nEach wrong OOD output of a scratchpad "
            "cell, read against its target to the first token where they differ: the target's step there and the "
            "component being written (a component written too long or too short, or followed by a wrong marker, is "
            "that component's error; *fewer steps*: the answer starts where the target holds another step; *more "
            "steps*: a step starts where the target's answer does; *answer*: every step right, the answer wrong or "
            "missing). *at step 1*: the share of the wrong outputs that depart in their first step; per kind: its "
            "share (the median step, 1-based). Summed over the seeds.\n\n"
            + markdown_table(["task (format)", "PE", "seeds", "wrong OOD outputs", "at step 1",
                              *(ERROR_COLUMNS[k] for k in kinds)],
                             body))


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


def claims_table(outcomes: Sequence[SyntheticOutcome], seed_dates: Mapping[int | None, str] | None = None) -> str:
    """``report_sections.claims_table``'s layout for paper 002: each claim's rule, what the paper says, our effect with its
    95 % interval across seeds (and each seed's effect), the prediction interval for one new seed, the
    evaluation-only paired bootstrap (each bootstrap bound with its Monte Carlo standard error,
    ``robustness.quantile_se``), the tasks compared (and those left out), the seeds on the claim's side (for
    the scratchpad claims: the tasks it helps, does not, or leaves unclear), the claim judged on the new seeds alone
    (those run after its rule: ``robustness.new_seeds``), the effect left one task out at a time, and the verdict
    (last: ``results.studies`` counts it there), *exploratory* when its rule was set after every seed it judges ran
    (``seed_dates``: seed -> the day its first run started); and below the table the same tests on the reference's published results
    (``calibration``). A pre-registered claim (``SyntheticClaim.awaits``) is judged on new seeds only. Why a task
    was left out or compared below the floor is a footnote marked beside the task, printed once below it."""
    show, rows, notes, dates = "{:+.3f}".format, [], Footnotes(), seed_dates or {}  # floor notes repeat
    for o in outcomes:
        c, below = o.claim, dict(o.below)
        # a claim measured on no seed reads the study's seeds, in order (``dates`` follows the order runs load)
        new = new_seeds(c, o.seeds or sorted(s for s in dates if s is not None), dates)
        fresh = _on_new_seeds(o, new)
        if c.awaits:
            found = (f"**{fresh.verdict}** (new seeds {_seeds(new)} only)" if fresh else
                     f"**awaiting new seeds ({_seeds(c.awaits)})**: pre-registered on {rule_day(c)}; the seeds run "
                     "before it do not judge it")
        else:
            found = f"**{o.verdict}**" + (f": {note}" if (note := exploratory_note(o, dates)) else "")
        compared = ", ".join(t + (f" {notes.mark(f'compared below the floor on {t}: {below[t]}')}"
                                  if t in below else "") for t in o.tasks) or "none"
        left = ", ".join(f"{t} {notes.mark(f'left out {t}: {why}')}" for t, why in o.left_out)
        tasks = compared + (f"; left out {left}" if left else "") if o.tasks or o.left_out else MISSING
        rests = f"{plural(len(o.tasks), 'task')}, {plural(o.queries, 'query', 'queries')}" \
            if o.tasks or o.left_out else MISSING
        judged = [_new_seeds_cell(o, new, fresh, show), leave_one_out_text(o.loto, o.verdict, show)]
        if o.by_task:
            words = [WORDS[c.test][e.verdict] for e in o.by_task]
            rows.append([c.text, c.rule, c.paper, "; ".join(f"{e.tasks[0]} {cell(e.across, show)} ({w})" for e, w in
                                                            zip(o.by_task, words, strict=True)) + f" {c.unit}",
                         MISSING, "; ".join(f"{e.tasks[0]} {spread_cell(e.interval, show)}" for e in o.by_task),
                         rests, tasks, ", ".join(_tally(words.count(w), w, c.test) for w in dict.fromkeys(words)),
                         *judged,
                         found])
        elif o.interval is None:
            rows.append([c.text, c.rule, c.paper, f"{o.verdict}: {o.reason}", MISSING, MISSING, rests, tasks, MISSING,
                         *judged, found])
        else:
            seeds = len(o.interval.per_seed)
            ours = f"{spread_cell(o.across, show)} {c.unit}" + (
                f" (per seed: {' / '.join(map(show, o.interval.per_seed))})" if seeds > 1 else " (1 seed)")
            evaluation = spread_cell(o.interval, show) if o.interval.resamples else "none (no per-example results)"
            rows.append([c.text, c.rule, c.paper, ours, cell(o.prediction, show) if seeds > 1 else MISSING,
                         evaluation, rests, tasks, f"{o.on_side} of {seeds}", *judged, found])
    calibrated = calibration_lines([o.claim for o in outcomes], show)
    return ("### Paper 002's claims, tested\n\nOOD exact match, paired: a (task, seed)'s cells share their test "
            "examples. *ours*: the effect [95 % across seeds: MRR claims a bootstrap over tasks and seeds, the others "
            "Student t over the per-seed effects]; *evaluation only*: a bootstrap over the test examples, models held "
            f"fixed. Every bootstrap draws at least {CLAIM_RESAMPLES:,} resamples, and each of its bounds carries its "
            "Monte Carlo standard error (±, the binomial order-statistic estimate from the same resamples). "
            f"A task is compared (is *learned*) when at least {LEARNED_BY} of the {len(RANKED)} PEs reach ID "
            f"exact match >= {ID_FLOOR:g}, mean over seeds; a PE below it there is compared on what it measured and "
            "named (the scratchpad claim: every PE run in both formats reaches it in the full-scratchpad format). "
            "Verdicts as paper 001's, from the interval across "
            f"seeds; one seed gets none, nor does a claim over fewer than {MIN_TASKS} learned tasks ({TOO_FEW}). "
            "*rests on*: the tasks compared and their (task, seed) queries; in *tasks*, a [n] beside a task "
            "points to the note below the table on why it was left out or compared below the floor. An OOD exact match at "
            f"or below its task's chance + {EM_EFFECT:g} counts as chance for every PE (the tables' *chance* column). "
            "*exploratory*: the claim's rule was set after every seed it judges ran (*Rules changed*, above); new "
            "seeds must judge it. *new seeds only*: the claim judged again on the seeds whose first run came after its "
            f"rule's last change (a seed run on that day is not new, nor, for a rule changed after a run, are seeds "
            f"{_seeds(SEEN_SEEDS)}, read before the change, in any recipe). *leave one task out*: the effect recomputed "
            "without each task in turn, min..max, and the tasks whose removal changes the verdict.\n\n"
            + markdown_table(["claim", "rule", "the paper says", "ours: effect [95 % across seeds]",
                              "one new seed [95 % prediction]", "evaluation only [95 % paired bootstrap]", "rests on",
                              "tasks", "seeds on the claim's side", "new seeds only", "leave one task out",
                              "verdict"], rows)
            + (f"\n\n{notes.render()}" if notes.notes else "")
            + (f"\n\n{calibrated}" if calibrated else ""))


def _tally(n: int, word: str, test: str) -> str:
    """How many of a claim's tasks got ``word``: "2 helps"; the one-seed word reads "1 task on one seed"."""
    return f"{plural(n, 'task')} on one seed" if word == WORDS[test][NO_SEED_VERDICT] else f"{n} {word}"


def _seeds(seeds: Sequence[int | None]) -> str:
    return ", ".join(map(str, seeds))


def _on_new_seeds(o: SyntheticOutcome, new: list[int | None] | None) -> SyntheticOutcome | None:
    """The claim's outcome on its ``new`` seeds alone: ``o`` itself when they are all the seeds it judges, None
    without new seeds or without a way to judge it again (``SyntheticOutcome.rejudge``)."""
    if not new:
        return None
    if set(new) == set(o.seeds):
        return o
    return o.rejudge(new) if o.rejudge else None


def _new_seeds_cell(o: SyntheticOutcome, new: list[int | None] | None, fresh: SyntheticOutcome | None,
                    show) -> str:
    """The claim judged on its new seeds: their verdict and effect; as pooled when every seed it judges is new."""
    if new is None:
        return "— the seeds' run days are unknown"
    if not new:
        return f"— no seed ran after the rule ({rule_day(o.claim)})"
    if fresh is o:
        return f"as pooled: {'its one seed' if len(new) == 1 else f'all {len(new)} seeds'} ran after the rule"
    if fresh is None:
        return f"— not judged again (seeds {_seeds(new)} ran after the rule)"
    effect = ("" if fresh.by_task or fresh.across is None
              else f": {cell(fresh.across, show)}")
    return f"**{fresh.verdict}** on seeds {_seeds(new)}{effect}"
