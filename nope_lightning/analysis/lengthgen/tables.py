"""The report's markdown tables, each number with its 95 % interval and its seed count.

Input: ``method -> seed -> result`` of one matrix point (``claims.Runs``). With two or more seeds a cell is
the mean over seeds with a Student t interval across seeds (training variance: another seed is another
model); with one seed it is that run's own interval (a bootstrap over blocks of evaluation windows for
perplexity, Wilson for passkey accuracy). Perplexities are averaged as log-PPL and shown as PPL. What was not
run prints "—". Method-against-method differences are paired instead (``paired_table``, ``claims_table``): a
bootstrap over the shared windows and prompts, pooled over seeds; the claims table also gives each claim's t
interval across the per-seed effects and a prediction interval for one new seed, which its verdict reads. Which paper row a method is printed
beside is the experiment file's to say (``rows``: method -> row of the paper's table), matched exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import numpy as np

from nope_lightning.analysis.lengthgen.claims import Runs, measure
from nope_lightning.analysis.markdown import MISSING, cell, markdown_table
from nope_lightning.analysis.verdicts import NotMeasured, Outcome
from nope_lightning.config import paper
from nope_lightning.config.paper import Claim
from nope_lightning.numerics.stats import UNIT, Interval, t_interval, wilson
from nope_lightning.results.evaluation import Curve, EvaluationResult


def seed_note(runs: Runs) -> str:
    """'3 seeds: mean and 95 % t interval across seeds' or the one-seed equivalent."""
    seeds = max((len(by_seed) for by_seed in runs.values()), default=0)
    if seeds > 1:
        return f"{seeds} seeds: mean over seeds, [95 % t interval across seeds]"
    return "1 seed: [95 % interval of the run: bootstrap over blocks of windows, Wilson for passkey]"


def across(by_seed: Mapping[int | None, EvaluationResult], value: Callable[[EvaluationResult], float | None],
           single: Callable[[EvaluationResult], Interval | None],
           bounds: tuple[float, float] = (-math.inf, math.inf)) -> Interval | None:
    """``value`` per seed -> mean and t interval across seeds (clipped to ``bounds``); one seed -> ``single``
    (the run's interval)."""
    values = [v for r in by_seed.values() if (v := value(r)) is not None]
    if not values:
        return None
    if len(by_seed) == 1:
        return single(next(iter(by_seed.values())))
    return t_interval(values, bounds=bounds)


def exp_interval(interval: Interval | None) -> Interval | None:
    return None if interval is None else Interval(*(math.exp(v) for v in (interval.estimate, interval.low,
                                                                            interval.high)))


def log_ppl(by_seed: Mapping[int | None, EvaluationResult], corpus: str, n: int) -> Interval | None:
    """Mean log-PPL at ``n`` tokens over seeds (t interval) or the run's bootstrap interval."""
    def value(r: EvaluationResult) -> float | None:
        p = r.perplexity(corpus, n)
        return None if p is None else p.nll

    def single(r: EvaluationResult) -> Interval | None:
        p = r.perplexity(corpus, n)
        return None if p is None else Interval(p.nll, p.nll_low, p.nll_high)

    return across(by_seed, value, single)


#: Which column of paper 001's Table 2 a corpus's perplexities are printed beside, by our corpus name
#: (``data.corpus``): ``(column name, its rows)``. PG19 is Project Gutenberg's books published before 1919;
#: the KJV (``kjv``, and ``tiny``, ten of its books) is such a book, and ``books`` adds Project Gutenberg's
#: Shakespeare and Milton and Austen's novels. Proof-pile is mathematics: arXiv papers and formal proof libraries,
#: of which ``math`` (HOL Light, Metamath, Coq) is a part. Any other corpus (``code``, the Python standard
#: library, which neither column holds, or a user's files) gets no paper column: the paper measured nothing like it.
TABLE2_BY_CORPUS: dict[str, tuple[str, Mapping[str, tuple[float, ...]]]] = {
    "kjv": ("PG19", paper.TABLE2_PG19), "tiny": ("PG19", paper.TABLE2_PG19), "books": ("PG19", paper.TABLE2_PG19),
    "math": ("Proof-pile", paper.TABLE2_PROOFPILE)}


def ppl_rows(runs: Runs, corpus: str, lengths: Sequence[int], rows: Mapping[str, str],
             seeds: bool = False) -> tuple[list[str], list[list[str]]]:
    """``(header, rows)`` of a Table 2 analog on ``corpus``: per method its PPL at each of ``lengths`` (tokens; mean
    log-PPL over its seeds shown as PPL, [95 % t interval across them]; one seed: its run's bootstrap interval),
    with its seed count when ``seeds``, and the paper's row ``rows[method]`` of the corpus's Table 2 column
    (``TABLE2_BY_CORPUS``; none: no paper column)."""
    first = next(r for by_seed in runs.values() for r in by_seed.values())
    column = TABLE2_BY_CORPUS.get(corpus)
    header = ["method", *(["seeds"] if seeds else []), *[f"{n} ({n / first.train_len:g}x)" for n in lengths],
              *(["paper 1x/2x/4x/8x"] if column else [])]
    table = []
    for method, by_seed in runs.items():
        row = [method, *([len(by_seed)] if seeds else []),
               *[cell(exp_interval(log_ppl(by_seed, corpus, n)), paper.fmt) for n in lengths]]
        if column:
            ref = column[1].get(rows.get(method, ""))
            row.append(" / ".join(paper.fmt(v) for v in ref) if ref else MISSING)
        table.append(row)
    return header, table


def paper_column_note(corpus: str) -> str:
    """The heading's words on the paper column of ``corpus``'s table."""
    column = TABLE2_BY_CORPUS.get(corpus)
    return (f"paper column: {column[0]}, TinyLlama-1.1B at 2K" if column
            else f"no paper column: paper 001 measured no corpus like `{corpus}`")


def ppl_tables(runs: Runs, rows: Mapping[str, str]) -> str:
    """Table 2 analog: one table per corpus any method was evaluated on (in the order first met), each holding
    only the methods evaluated on it (``ppl_rows``: PPL per method x length) with the paper's row ``rows[method]``
    from that corpus's column (``TABLE2_BY_CORPUS``: ``math`` beside Proof-pile) where it holds one."""
    corpora = dict.fromkeys(c for by_seed in runs.values() for r in by_seed.values() for c in r.corpora)
    out = []
    for corpus in corpora:
        on = {m: by_seed for m, by_seed in runs.items() if any(corpus in r.corpora for r in by_seed.values())}
        lengths = sorted({n for by_seed in on.values() for r in by_seed.values()
                          for n in (r.ppl or {}).get(corpus, {})})
        if not lengths:
            continue
        first = next(iter(next(iter(on.values())).values()))
        header, table = ppl_rows(on, corpus, lengths, rows)
        others = sorted({r.split for by_seed in on.values() for r in by_seed.values()} - {first.split})
        split = first.split + (f" split; the rows run on the {', '.join(others)} split say so in their names"
                               if others else " split")
        out.append(f"### Sliding-window perplexity on `{corpus}` ({split}, stride {first.stride}, "
                   f"every length scored on the same target tokens; {seed_note(on)}; {paper_column_note(corpus)})"
                   f"\n\n" + markdown_table(header, table))
    return "\n\n".join(out)


def paired_table(runs: Runs, resamples: int, reference: str) -> str:
    """Every method against ``reference`` on the same windows and prompts: per seed the paired difference
    (log-PPL at each evaluation length, passkey accuracy at each passkey length that is a whole multiple of L,
    headed with where its answer falls: ``answer_label``), pooled as the mean over seeds
    with its 95 % bootstrap interval (``claims.measure``), and on how many seeds the method does better (lower
    log-PPL, higher accuracy); a method whose primary corpus is not the reference's is left out. Across-seed t
    intervals of each method's own figures (the tables above) are
    unpaired; these differences cancel the seed's model and the text, which is what a comparison needs."""
    if reference not in runs:
        return ""
    first = next(iter(runs[reference].values()))
    L = first.train_len
    columns = [("log_ppl_difference", (n // L, n // L), f"Δ log-PPL {n // L:g}x", -1)
               for n in first.lengths if n % L == 0]
    # Whole multiples of L only: the claims' passkey test reads the prompts of multiple x L tokens.
    columns += [("passkey_difference", (n // L,), f"Δ passkey {n // L}x = "
                 f"{answer_label(n, L, key_tokens(runs[reference].values(), n))}", 1)
                for n in sorted({s.length for s in (first.passkey.samples if first.passkey else [])}) if n % L == 0]
    rows = []
    for method, by_seed in runs.items():
        # A method evaluated on another corpus (Table 2's second column) has no window in common with the reference.
        if method == reference or next(iter(by_seed.values())).corpora[:1] != first.corpora[:1]:
            continue
        cells = []
        for test, multiples, _, better in columns:
            try:
                interval, _ = measure(test, Claim(method, "", "", test, (method, reference), multiples), runs,
                                      resamples)
            except NotMeasured:
                cells.append(MISSING)
                continue
            wins = sum(better * e > 0 for e in interval.per_seed)
            cells.append(f"{cell(interval, '{:+.3f}'.format)} ({wins}/{len(interval.per_seed)})")
        if any(c != MISSING for c in cells):
            rows.append([method, *cells])
    if not rows:
        return ""
    return (f"### Paired against `{reference}` (same windows, same prompts; mean of per-seed differences, [95 % "
            f"bootstrap interval], (seeds where the method does better: lower log-PPL, higher passkey accuracy))"
            f"\n\n" + markdown_table(["method", *[label for _, _, label, _ in columns]], rows))


def _octaves(result: EvaluationResult) -> Curve | None:
    """The primary corpus's per-octave log-PPL curve, None when positions were not measured."""
    return None if result.position is None else result.position.primary


def octave_interval(by_seed: Mapping[int | None, EvaluationResult], index: int) -> Interval | None:
    """Mean log-PPL over the ``index``-th octave of positions ([0, L), [L, 2L), ...)."""
    def value(r: EvaluationResult) -> float | None:
        curve = _octaves(r)
        return None if curve is None or index >= len(curve.mean) else curve.mean[index]

    def single(r: EvaluationResult) -> Interval | None:
        curve = _octaves(r)
        if curve is None or index >= len(curve.mean):
            return None
        return Interval(curve.mean[index], curve.low[index], curve.high[index])

    return across(by_seed, value, single)


def bucket_table(runs: Runs) -> str:
    """Per-position PPL over [0, L), [L, 2L), [2L, 4L), ... of the longest windows."""
    with_position = {m: s for m, s in runs.items() if any(r.position is not None for r in s.values())}
    if not with_position:
        return ""
    first = next(r for s in with_position.values() for r in s.values() if r.position is not None)
    ranges, L = first.position.octaves, first.train_len
    header = ["method", *[f"[{_times_l(a, L)}, {_times_l(b, L)})" for a, b in ranges],
              f"[{_times_l(ranges[-1][0], L)}, {_times_l(ranges[-1][1], L)}) / [0, L)"]
    rows = []
    for method, by_seed in with_position.items():
        cells = [cell(exp_interval(octave_interval(by_seed, i)), paper.fmt) for i in range(len(ranges))]
        ratios = [v for r in by_seed.values() if (v := _octave_ratio(r, len(ranges) - 1)) is not None]
        rows.append([method, *cells, cell(exp_interval(t_interval(ratios))) if ratios else MISSING])
    windows = len(first.position.primary.windows)
    return (f"### Per-position perplexity by range ({first.split} split, {windows} non-overlapping windows of "
            f"{ranges[-1][1]} tokens; {seed_note(with_position)})\n\n" + markdown_table(header, rows))


def _times_l(position: int, train_len: int) -> str:
    """0, L, 2L, 2.5L ... for a position."""
    multiple = position / train_len
    return "0" if not position else "L" if multiple == 1 else f"{multiple:g}L"


def _octave_ratio(result: EvaluationResult, index: int) -> float | None:
    curve = _octaves(result)
    return None if curve is None else curve.mean[index] - curve.mean[0]


def _correct(result: EvaluationResult, n: int | None) -> list[bool]:
    """Each passkey prompt's outcome at ``n`` tokens (None: every length)."""
    return [s.correct for s in result.passkey.at(n)] if result.passkey else []


def passkey_interval(by_seed: Mapping[int | None, EvaluationResult], n: int | None) -> Interval | None:
    """Accuracy at ``n`` tokens (None: over every length): mean over seeds with a t interval, or one run's
    Wilson interval."""
    def value(r: EvaluationResult) -> float | None:
        samples = _correct(r, n)
        return float(np.mean(samples)) if samples else None

    def single(r: EvaluationResult) -> Interval | None:
        samples = _correct(r, n)
        return wilson(sum(samples), len(samples)) if samples else None

    return across(by_seed, value, single, UNIT)


def key_tokens(results: Iterable[EvaluationResult], n: int) -> set[int]:
    """The token counts of the answers to ``results``' passkey prompts of ``n`` tokens (empty: none recorded)."""
    return {s.key_tokens for r in results if r.passkey for s in r.passkey.at(n) if s.key_tokens is not None}


def answer_label(n: int, train_len: int, counts: Collection[int]) -> str:
    """A passkey length's header: the prompt's ``n`` tokens and where its answer falls relative to L =
    ``train_len``. The answer (the key's k tokens, ``counts``: every k its keys take) is generated right after
    the prompt, at positions n + 1 .. n + k (1-based), so a prompt of exactly L tokens answers past L. With
    L = 128 and k = 6: '128 (answer at 129-134: past L)', '122 (answer at 123-128: inside L)', '125 (answer at
    126-131: crosses L)'; keys of 5 or 6 tokens: '128 (answer at 129 to 133-134: past L)'. No count known
    (results written before they were recorded): '128 (answer after token 128: past L)', where the answer
    can only be said to be past L when n >= L."""
    if not counts:
        return f"{n} (answer after token {n}{': past L' if n >= train_len else ''})"
    fewest, most = min(counts), max(counts)
    span = (f"{n + 1}" if most == 1 else f"{n + 1}-{n + most}" if fewest == most
            else f"{n + 1} to {n + fewest}-{n + most}")
    where = "inside L" if n + most <= train_len else "past L" if n >= train_len else "crosses L"
    return f"{n} (answer at {span}: {where})"


def passkey_table(runs: Runs) -> str:
    """Passkey accuracy per method x prompt length (and over every length), each length headed with where its
    answer falls relative to L (``answer_label``)."""
    with_keys = {m: s for m, s in runs.items() if any(r.passkey is not None for r in s.values())}
    if not with_keys:
        return ""
    results = [r for s in with_keys.values() for r in s.values() if r.passkey is not None]
    first = results[0].passkey
    lengths = sorted({sample.length for r in results for sample in r.passkey.samples})
    rows = [[m, *[cell(passkey_interval(s, n)) for n in lengths], cell(passkey_interval(s, None))]
            for m, s in with_keys.items()]
    depths = len({sample.depth for sample in first.samples})
    keys = len(first.samples) // max(1, depths * len(lengths))
    header = [answer_label(n, results[0].train_len, key_tokens(results, n)) for n in lengths]
    return (f"### Passkey retrieval accuracy ({first.prompt} prompt, {depths} depths x {keys} "
            f"key{'s' if keys > 1 else ''} per length, greedy; {seed_note(with_keys)})\n\n"
            + markdown_table(["method", *header, "all lengths"], rows))


def _key_nll(result: EvaluationResult, n: int | None) -> list[float]:
    """Each passkey prompt's teacher-forced answer NLL at ``n`` tokens (None: every length); empty when any is
    unrecorded."""
    values = [s.key_nll for s in result.passkey.at(n)] if result.passkey else []
    return [] if None in values else values


def key_nll_table(runs: Runs) -> str:
    """The teacher-forced NLL of the passkey's answer (nats per answer token, ``eval.passkey.key_nll``) per method
    x prompt length: what accuracy hides, e.g. how far from the key a model that stopped retrieving has moved.
    Mean over seeds with a t interval across them; one seed: the t interval over its prompts."""
    with_nll = {m: s for m, s in runs.items() if any(_key_nll(r, None) for r in s.values())}
    if not with_nll:
        return ""
    results = [r for s in with_nll.values() for r in s.values() if _key_nll(r, None)]
    lengths = sorted({sample.length for r in results for sample in r.passkey.samples})

    def interval(by_seed: Mapping[int | None, EvaluationResult], n: int) -> Interval | None:
        return across(by_seed, lambda r: float(np.mean(v)) if (v := _key_nll(r, n)) else None,
                      lambda r: t_interval(v, bounds=(0.0, math.inf)) if len(v := _key_nll(r, n)) > 1 else None,
                      bounds=(0.0, math.inf))  # an NLL is >= 0

    rows = [[m, *[cell(interval(s, n)) for n in lengths]] for m, s in with_nll.items()]
    header = [answer_label(n, results[0].train_len, key_tokens(results, n)) for n in lengths]
    return (f"### Passkey answer NLL (teacher-forced, nats per answer token; {seed_note(with_nll)})\n\n"
            + markdown_table(["method", *header], rows))


def longctx_table(runs: Runs) -> str:
    tasks = sorted({t for s in runs.values() for r in s.values() for t in r.longctx or {}})
    if not tasks:
        return ""
    rows = []
    for method, by_seed in runs.items():
        cells = []
        for task in tasks:
            values = [float(np.mean(list(r.longctx[task].values()))) for r in by_seed.values()
                      if task in (r.longctx or {})]
            cells.append(cell(t_interval(values, bounds=UNIT)) if values else MISSING)
        rows.append([method, *cells])
    return ("### Offline long-context tasks (mean score over lengths, 0-1)\n\n"
            + markdown_table(["method", *tasks], rows))


def tuned_lengths(by_seed: Mapping[int | None, EvaluationResult]) -> tuple[int, int] | None:
    """``(tuning length, PPL length)`` in tokens: the length a method's per-head table was tuned at (the
    results' ``tuning_len``, one across seeds) and the largest evaluated length <= it, where the Table 4 analog
    reads PPL (the paper: PPL at 16K of tables tuned at 18K). None when the results record no tuning length
    or no evaluated length fits."""
    tuned = {r.tuning_len for r in by_seed.values()} - {None}
    if len(tuned) != 1:
        return None
    (tuning,) = tuned
    fitting = [n for r in by_seed.values() for n in r.lengths if n <= tuning]
    return (tuning, max(fitting)) if fitting else None


def ablation_table(runs: Runs, outcomes: Sequence[Outcome], rows: Mapping[str, str]) -> str:
    """Table 4 analog over the methods the experiment file places beside a row of the paper's Table 4
    (``rows``: method -> a key of ``paper.TABLE4``): PPL at the tuning length (``tuned_lengths``: inside the
    length the table was tuned at, as the paper's Table 4), passkey over all lengths, long-context mean ("—"
    where not run), the paper's figures, and the notes on ablations that changed nothing."""
    table, unknown = [], []
    for method, by_seed in runs.items():
        if method not in rows:
            continue
        first = next(iter(by_seed.values()))
        if (lengths := tuned_lengths(by_seed)) is None:
            unknown.append(method)
            ppl = MISSING
        else:
            tuning, n = lengths
            ppl = (f"{cell(exp_interval(log_ppl(by_seed, first.corpora[0], n)), paper.fmt)} @ {n}"
                   + ("" if n == tuning else f" (tuned at {tuning})"))
        longctx = [float(np.mean([np.mean(list(v.values())) for v in r.longctx.values()]))
                   for r in by_seed.values() if r.longctx]
        ref = paper.TABLE4[rows[method]]
        table.append([method, ppl, cell(passkey_interval(by_seed, None)),
                      cell(t_interval(longctx, bounds=UNIT)) if longctx else MISSING,
                      f"{ref['pg19']} / {ref['passkey']}% / {ref['longbench']}"])
    if not table:
        return ""
    notes = [o.reason for o in outcomes if o.verdict.startswith("no effect of")]
    if unknown:
        notes.append(f"no PPL for {', '.join(unknown)}: the results record no single tuning length (evaluated "
                     f"before evaluate recorded the table's target_len, or with a table that names none)")
    return ("### HeadScale ablations (Table 4 analog)\n\n"
            + markdown_table(["method", "PPL @ tuning length (tokens)", "passkey (all lengths)", "long-context",
                              "paper PPL@16K / passkey / LongBench"], table)
            + "".join(f"\n\nNote: {n}." for n in notes))
